package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/sources/postgres"
)

// TestStatementTimeoutRoundsUp: the session's statement_timeout, read back
// from a pool connection, is the configured duration in whole milliseconds
// rounded up: a sub-millisecond value never becomes '0', which PostgreSQL
// reads as no timeout at all.
func TestStatementTimeoutRoundsUp(t *testing.T) {
	pg := testenv.Postgres(t)
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{500 * time.Microsecond, "1ms"},
		{time.Nanosecond, "1ms"},
		{1500 * time.Microsecond, "2ms"},
		{250 * time.Millisecond, "250ms"},
		{2 * time.Second, "2s"},
	} {
		src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN, MaxConns: 1, StatementTimeout: tc.d, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		// SHOW is itself bound by the 1 ms timeout: on a loaded machine it
		// can be cancelled, which proves the timeout is on; ask again.
		var got string
		for range 50 {
			err = src.Pool().QueryRow(context.Background(), "SHOW statement_timeout").Scan(&got)
			if err == nil || !strings.Contains(err.Error(), "57014") {
				break
			}
		}
		src.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("statement_timeout %s: the session has %q, want %q", tc.d, got, tc.want)
		}
	}
}
