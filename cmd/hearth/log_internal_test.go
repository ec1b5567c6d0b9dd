package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/config"
)

// TestLogTimestampsHaveMilliseconds: a JSON log line's time is RFC 3339 in
// UTC to the millisecond, so that a lease lost, a step-down and the next term
// can be ordered from the logs (docs/operations.md#logs).
func TestLogTimestampsHaveMilliseconds(t *testing.T) {
	var buf bytes.Buffer
	before := time.Now().Truncate(time.Millisecond)
	log := newLogger(&buf, config.Log{Level: "info", Format: "json"})
	log.Info().Msg("x")
	var line struct {
		Time string `json:"time"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("log line %q: %v", buf.String(), err)
	}
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`).MatchString(line.Time) {
		t.Fatalf("time = %q, want RFC 3339 in UTC with milliseconds", line.Time)
	}
	at, err := time.Parse(time.RFC3339Nano, line.Time)
	if err != nil {
		t.Fatal(err)
	}
	if at.Before(before) || at.After(time.Now()) {
		t.Fatalf("time = %s, want between %s and now", at, before)
	}
}
