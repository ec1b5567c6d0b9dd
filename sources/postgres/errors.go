package postgres

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/hearth-dev/hearth/warmer"
)

// classify marks the errors worth retrying with warmer.ErrUnavailable: the
// connection failed, dropped or timed out, or the server is shutting down,
// starting, out of connections or cancelled the statement (statement_timeout).
// Anything else (a syntax error, a missing table, a bad payload) is returned
// as it is: retrying would get the same answer.
func classify(err error) error {
	if err == nil || errors.Is(err, warmer.ErrUnavailable) {
		return err
	}
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe):
		if strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "53") ||
			strings.HasPrefix(pe.Code, "57P") || pe.Code == "57014" || pe.Code == "40001" || pe.Code == "40P01" {
			return fmt.Errorf("%w: %w", warmer.ErrUnavailable, err)
		}
		return err
	case pgconn.Timeout(err), pgconn.SafeToRetry(err), errors.Is(err, pgconn.ErrConnClosed):
		return fmt.Errorf("%w: %w", warmer.ErrUnavailable, err)
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return fmt.Errorf("%w: %w", warmer.ErrUnavailable, err)
	}
	return err
}
