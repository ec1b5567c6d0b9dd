package redact_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/hearth-dev/hearth/internal/redact"
)

func TestURL(t *testing.T) {
	for raw, want := range map[string]string{
		"https://api.example.com/v1?api_key=s3cret&region=eu": "https://api.example.com/v1?api_key=xxxxx&region=xxxxx",
		"https://u:s3cret@api.example.com/v1":                 "https://u:xxxxx@api.example.com/v1",
		"redis://:s3cret@127.0.0.1:6379/0?dial_timeout=1s":    "redis://:xxxxx@127.0.0.1:6379/0?dial_timeout=xxxxx",
		"https://api.example.com/v1?flag&token=s3cret#frag":   "https://api.example.com/v1?xxxxx&token=xxxxx",
		"https://api.example.com/v1?SECRETTOKEN":              "https://api.example.com/v1?xxxxx",
		"https://api.example.com/v1?a=1&&SECRETTOKEN&=s3cret": "https://api.example.com/v1?a=xxxxx&&xxxxx&=xxxxx",
		"https://api.example.com/v1?a=1;SECRETTOKEN":          "https://api.example.com/v1?a=xxxxx",
		"https://TOKENs3cret@api.example.com/v1":              "https://xxxxx@api.example.com/v1",
		"https://api.example.com/v1":                          "https://api.example.com/v1",
		"http://[::1:bad/?k=s3cret":                           "(unparsable URL)",
	} {
		if got := redact.URL(raw); got != want {
			t.Errorf("URL(%q) = %q, want %q", raw, got, want)
		}
	}
}

// TestErrorKeepsIs: every redacting wrapper still unwraps to its cause, and
// the secret appears nowhere in the message, however it was quoted.
func TestErrorKeepsIs(t *testing.T) {
	raw := "https://u:pw-s3cret@api.example.com/v1?api_key=tok%2Fs3cret&v=1"
	cause := &net.OpError{Op: "dial", Net: "tcp", Err: context.DeadlineExceeded}
	for name, err := range map[string]error{
		"whole url":   redact.URLError(fmt.Errorf("get %q: %w", raw, cause), raw),
		"url parts":   redact.URLError(fmt.Errorf("get https://api.example.com/v1/x?api_key=tok%%2Fs3cret: %w", cause), raw),
		"decoded":     redact.URLError(fmt.Errorf("token tok/s3cret refused: %w", cause), raw),
		"password":    redact.URLError(fmt.Errorf("auth pw-s3cret: %w", cause), raw),
		"secrets":     redact.Secrets(fmt.Errorf("WRONGPASS pw-s3cret: %w", cause), "pw-s3cret"),
		"short pass":  redact.Secrets(fmt.Errorf("bad password pw: %w", cause), "pw"),
		"withheld":    redact.Withheld(fmt.Errorf("parse postgres://u:pw-s3cret@h: %w", cause), "cannot parse (withheld)"),
		"unparsable":  redact.URLError(fmt.Errorf("bad port in :pw-s3cret@h:x: %w", cause), "redis://u:pw-s3cret@h:x/0?t=tok-s3cret"),
		"wrapped out": fmt.Errorf("ping api: %w", redact.URLError(fmt.Errorf("%s: %w", raw, cause), raw)),
		"bare part":   redact.URLError(fmt.Errorf("get https://h/v1?SECRETs3cret: %w", cause), "https://h/v1?SECRETs3cret"),
		"bare quoted": redact.URLError(fmt.Errorf("token SECRETs3cret refused: %w", cause), "https://h/v1?a=1&SECRETs3cret"),
		"user token":  redact.URLError(fmt.Errorf("get https://TOKENs3cret@h/: %w", cause), "https://TOKENs3cret@h/"),
	} {
		t.Run(name, func(t *testing.T) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("errors.Is(DeadlineExceeded) lost through %T", err)
			}
			var oe *net.OpError
			if !errors.As(err, &oe) || oe != cause {
				t.Errorf("errors.As(*net.OpError) lost")
			}
			if msg := err.Error(); strings.Contains(msg, "s3cret") || strings.Contains(msg, "password pw:") {
				t.Errorf("message leaks a secret: %s", msg)
			}
		})
	}
	if redact.URLError(nil, raw) != nil || redact.Secrets(nil, "x") != nil || redact.Withheld(nil, "x") != nil {
		t.Error("a nil error must stay nil")
	}
	// A short query value is masked in URLs, not in the rest of the message.
	if got := redact.URLError(errors.New("HTTP 401 at "+raw), raw).Error(); !strings.Contains(got, "HTTP 401") || !strings.Contains(got, "v=xxxxx") {
		t.Errorf("message garbled or URL not masked: %s", got)
	}
}
