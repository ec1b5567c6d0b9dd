// Package postgres is the PostgreSQL origin: it loads a single key with a query
// that takes no parameter, and a family in one query per batch that takes every
// member as a text[] ($1) and returns (member, value) rows.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/hearth-dev/hearth/internal/redact"
	"github.com/hearth-dev/hearth/warmer"
)

// Config is a PostgreSQL source.
type Config struct {
	Name string
	// DSN is a libpq URL or keyword string; its password never appears in errors.
	DSN string
	// MaxConns bounds the pool, and with it the concurrent queries.
	MaxConns int
	// StatementTimeout is set as the session's statement_timeout.
	StatementTimeout time.Duration
}

// Source loads values with pgx from a connection pool.
type Source struct {
	name string
	pool *pgxpool.Pool
	safe string
}

var (
	_ warmer.Source       = (*Source)(nil)
	_ warmer.MemberLister = (*Source)(nil)
)

// New builds the pool; it does not connect until Ping or the first load.
func New(cfg Config) (*Source, error) {
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("source %s: parse dsn: %w", cfg.Name, RedactError(err, cfg.DSN))
	}
	if cfg.MaxConns > 0 {
		pc.MaxConns = int32(cfg.MaxConns)
	}
	if cfg.StatementTimeout > 0 {
		pc.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(cfg.StatementTimeout.Milliseconds(), 10)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "hearth"
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", cfg.Name, RedactError(err, cfg.DSN))
	}
	return &Source{name: cfg.Name, pool: pool, safe: Redact(cfg.DSN)}, nil
}

// Pool returns the connection pool (used by migrations and the access log).
func (s *Source) Pool() *pgxpool.Pool { return s.pool }

// Ping checks the database answers.
func (s *Source) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("ping %s (%s): %w", s.name, s.safe, err)
	}
	return nil
}

// Close closes the pool.
func (s *Source) Close() { s.pool.Close() }

// Load runs the declaration's query. A family's query gets all members at once as
// $1 (text[]) and must return two columns, member and value; a single key's query
// returns one column, and no row means the key does not exist.
func (s *Source) Load(ctx context.Context, spec *warmer.Spec, members []string) ([]warmer.Result, error) {
	if !spec.Template.IsFamily() {
		return s.loadSingle(ctx, spec)
	}
	rows, err := s.pool.Query(ctx, spec.Query, members)
	if err != nil {
		return nil, fmt.Errorf("query: %w", classify(err))
	}
	defer rows.Close()
	if err := columns(rows, 2, "keys["+spec.Name+"].query", "(member, value)"); err != nil {
		return nil, err
	}
	out := make([]warmer.Result, 0, len(members))
	seen := make(map[string]bool, len(members))
	for rows.Next() {
		var (
			member *string
			value  []byte
		)
		if err := rows.Scan(&member, &value); err != nil {
			return nil, fmt.Errorf("keys[%s].query: %w: %w", spec.Name, warmer.ErrBadPayload, err)
		}
		if member == nil {
			continue
		}
		r := warmer.Result{Member: *member, Value: value}
		switch {
		case seen[*member]:
			r.Err = fmt.Errorf("%w: query returned member %q twice", warmer.ErrDuplicate, *member)
		case value == nil:
			r.Err = fmt.Errorf("%w: query returned NULL for member %q", warmer.ErrNullValue, *member)
		}
		seen[*member] = true
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("query: %w", classify(err))
	}
	return dedupe(out), nil
}

// dedupe keeps one result per member: a member returned twice becomes a single
// error, whatever the order of its rows.
func dedupe(rs []warmer.Result) []warmer.Result {
	dup := map[string]warmer.Result{}
	for _, r := range rs {
		if errors.Is(r.Err, warmer.ErrDuplicate) {
			dup[r.Member] = r
		}
	}
	if len(dup) == 0 {
		return rs
	}
	out := rs[:0]
	for _, r := range rs {
		if d, ok := dup[r.Member]; ok {
			if d.Member != "" {
				out = append(out, d)
				dup[r.Member] = warmer.Result{}
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

func (s *Source) loadSingle(ctx context.Context, spec *warmer.Spec) ([]warmer.Result, error) {
	rows, err := s.pool.Query(ctx, spec.Query)
	if err != nil {
		return nil, fmt.Errorf("query: %w", classify(err))
	}
	defer rows.Close()
	if err := columns(rows, 1, "keys["+spec.Name+"].query", "(value)"); err != nil {
		return nil, err
	}
	var (
		value []byte
		n     int
	)
	for rows.Next() {
		n++
		if err := rows.Scan(&value); err != nil {
			return nil, fmt.Errorf("keys[%s].query: %w: %w", spec.Name, warmer.ErrBadPayload, err)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("query: %w", classify(err))
	}
	switch {
	case n == 0:
		return []warmer.Result{{Missing: true}}, nil
	case n > 1:
		return []warmer.Result{{Err: fmt.Errorf("%w: query returned %d rows for a single key", warmer.ErrDuplicate, n)}}, nil
	case value == nil:
		return []warmer.Result{{Err: fmt.Errorf("%w: query returned NULL", warmer.ErrNullValue)}}, nil
	}
	return []warmer.Result{{Value: value}}, nil
}

// ListMembers runs the members query (one text column), stopping with an error
// past the declaration's MaxMembers.
func (s *Source) ListMembers(ctx context.Context, spec *warmer.Spec) ([]string, error) {
	// Cancelled past MaxMembers, so that the server stops sending rows instead
	// of the client reading the rest of a huge result only to discard it.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, spec.MembersQuery)
	if err != nil {
		return nil, fmt.Errorf("members query: %w", classify(err))
	}
	defer rows.Close()
	if err := columns(rows, 1, "keys["+spec.Name+"].members_query", "(member)"); err != nil {
		return nil, err
	}
	var out []string
	for rows.Next() {
		if spec.MaxMembers > 0 && len(out) >= spec.MaxMembers {
			cancel()
			return nil, fmt.Errorf("keys[%s].members_query: %w: more than max_members %d", spec.Name, warmer.ErrTooMany, spec.MaxMembers)
		}
		var m *string
		if err := rows.Scan(&m); err != nil {
			return nil, fmt.Errorf("keys[%s].members_query: %w: %w", spec.Name, warmer.ErrBadPayload, err)
		}
		if m != nil {
			out = append(out, *m)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("members query: %w", classify(err))
	}
	return out, nil
}

// columns checks a result's shape. A query that failed at once (syntax, timeout)
// has no columns yet: its own error is the one to report.
func columns(rows pgx.Rows, want int, field, shape string) error {
	if n := len(rows.FieldDescriptions()); n != want {
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("query: %w", classify(err))
		}
		return fmt.Errorf("%s: %w: must return %d column(s) %s, got %d", field, warmer.ErrBadPayload, want, shape, n)
	}
	return nil
}

// Redact returns the DSN with its password replaced, for logs and errors.
func Redact(dsn string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "(unparsable dsn)"
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}

// RedactError makes sure an error about a DSN does not carry its password: pgx
// parse errors may quote the connection string. The result unwraps to err, so
// errors.Is and errors.As still see the cause; only the message is changed.
func RedactError(err error, dsn string) error {
	if err == nil {
		return nil
	}
	cfg, perr := pgconn.ParseConfig(dsn)
	if perr != nil {
		return redact.Withheld(err, "cannot parse the connection string (details withheld: they may contain the password)")
	}
	if cfg.Password != "" && strings.Contains(err.Error(), cfg.Password) {
		return redact.Secrets(err, dsn, cfg.Password)
	}
	return err
}
