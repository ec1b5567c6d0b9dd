package main

import (
	"io"
	"os"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
)

// Durations in the logs are milliseconds (a float, e.g. "took_ms":17.987),
// and every duration field's name ends in _ms (docs/operations.md#logs).
func init() {
	zerolog.DurationFieldUnit = time.Millisecond
	zerolog.DurationFieldInteger = false
}

// newLogger returns JSON logs, or the console format when asked or when w is a terminal.
func newLogger(w io.Writer, c config.Log) zerolog.Logger {
	level, err := zerolog.ParseLevel(c.Level)
	if err != nil {
		level = zerolog.InfoLevel
	}
	console := c.Format == "console"
	if c.Format == "auto" {
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			console = true
		}
	}
	if console {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}
