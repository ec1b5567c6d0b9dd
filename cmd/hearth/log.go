package main

import (
	"context"
	"io"
	"os"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
)

// Durations in the logs are milliseconds (a float, e.g. "took_ms":17.987),
// and every duration field's name ends in _ms; timestamps are RFC 3339 in
// UTC to the millisecond, as the events a failover orders are milliseconds
// apart (docs/operations.md#logs).
func init() {
	zerolog.DurationFieldUnit = time.Millisecond
	zerolog.DurationFieldInteger = false
	zerolog.TimeFieldFormat = logTimeFormat
	zerolog.TimestampFunc = func() time.Time { return time.Now().UTC() }
}

// logTimeFormat is RFC 3339 with milliseconds: "2026-12-06T05:22:55.145Z".
const logTimeFormat = "2006-01-02T15:04:05.000Z07:00"

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
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	log := zerolog.New(w).Level(level).With().Timestamp().Logger()
	// go-redis prints its pool's dial failures on stderr in a format of its
	// own, once per attempt, before Hearth's own error says the same: route
	// them to this logger, at debug.
	redis.SetLogger(redisLogger{log.With().Str("component", "go-redis").Logger()})
	return log
}

// redisLogger is go-redis's internal logger on zerolog.
type redisLogger struct{ log zerolog.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug().Msgf(format, v...)
}
