// Package postgres is the PostgreSQL origin: it loads a single key with a query
// that takes no parameter, and a family in one query per batch that takes every
// member as a text[] ($1) and returns (member, value) rows.
package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"golang.org/x/sync/singleflight"

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
	// Log receives values refused as over max_value_bytes (sampled); the zero
	// value discards them.
	Log zerolog.Logger
}

// Source loads values with pgx from a connection pool.
type Source struct {
	name string
	pool *pgxpool.Pool
	safe string
	log  zerolog.Logger
	// shapes caches, per declaration query, the bounded query that runs it.
	shapes sync.Map // query string → *shape
	// describing runs one description per query at a time: the loads that
	// need it meanwhile (a pre-warm's first batches, all at once) wait for it
	// rather than each taking a connection to describe it again.
	describing singleflight.Group
	described  atomic.Int64 // descriptions started, for tests
}

var (
	_ warmer.Source       = (*Source)(nil)
	_ warmer.MemberLister = (*Source)(nil)
	_ warmer.Preparer     = (*Source)(nil)
)

// statementTimeoutMS is d in PostgreSQL's whole milliseconds, rounded up: a
// sub-millisecond timeout truncated to 0 would switch the timeout off.
func statementTimeoutMS(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

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
		pc.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(statementTimeoutMS(cfg.StatementTimeout), 10)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "hearth"
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", cfg.Name, RedactError(err, cfg.DSN))
	}
	// A whole family of oversize values would log one line per member: a
	// burst, then one per period (every member is still counted).
	log := cfg.Log.With().Str("component", "source").Str("source", cfg.Name).Logger().
		Sample(&zerolog.BurstSampler{Burst: 5, Period: time.Minute})
	return &Source{name: cfg.Name, pool: pool, safe: Redact(cfg.DSN), log: log}, nil
}

// Prepare opens up to n connections at once (at most the pool's size) and
// describes the queries of specs, so that the first n loads find both ready
// instead of each opening a connection; a failure is left to the loads. Each
// connection goes back to the pool as soon as it is open: an access-log read
// that needs one meanwhile never waits for the others.
func (s *Source) Prepare(ctx context.Context, specs []*warmer.Spec, n int) {
	var wg sync.WaitGroup
	for range min(n, int(s.pool.Config().MaxConns)) {
		wg.Go(func() {
			if c, err := s.pool.Acquire(ctx); err == nil {
				c.Release()
			}
		})
	}
	wg.Wait()
	for _, spec := range specs {
		_, _ = s.shape(ctx, spec)
	}
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
// $1 (text[], or a typed array such as bigint[] that only members written as the
// type writes them are sent in) and must return two columns, member and value;
// a single key's query returns one column, and no row means the key does not
// exist.
//
// The query runs wrapped, so that the server sends a value only if it is at most
// the declaration's max_value_bytes: a larger one arrives as its length alone and
// fails just its member (warmer.ErrTooLarge), without ever being held in memory.
func (s *Source) Load(ctx context.Context, spec *warmer.Spec, members []string) ([]warmer.Result, error) {
	sh, err := s.shape(ctx, spec)
	if err != nil {
		return nil, err
	}
	if !spec.Template.IsFamily() {
		return s.loadSingle(ctx, spec, sh)
	}
	// A member the typed parameter would not give back as written ("01"
	// for a bigint is 1, answered as "1") fails alone, unsent: its answer
	// would come back under another member's name, and the member itself be
	// written as not found.
	var refused []warmer.Result
	if sh.canon != "" {
		if members, refused, err = s.canonical(ctx, sh, members); err != nil {
			return nil, err
		}
	}
	param, out := bindMembers(sh.param, members)
	out = append(out, refused...)
	if param == nil {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, sh.sql, param, valueBound(spec))
	if err != nil {
		return nil, s.queryError(spec, err)
	}
	defer rows.Close()
	// A text member column is read from its raw bytes and answered with the
	// asked member's own string (found without a copy): no string per row.
	// Only an answer for a member not asked for is copied. Rows usually come
	// in the order asked (an index scan of a batch in key order), so a row
	// is first compared with the next member; asked (each member's first
	// position) is built only when a row comes out of that order. The
	// members matched in order must rise strictly (shorter first, then
	// bytewise: numbers without leading zeros rise as numbers), so that
	// none of them is matched twice through a repeated member.
	fds := rows.FieldDescriptions()
	rawMember := len(fds) > 0 && (fds[0].DataTypeOID == pgtype.TextOID || fds[0].DataTypeOID == pgtype.VarcharOID)
	// An integer member column (SELECT id, …) is read from its binary
	// form and written out as the database writes it, id::text's digits,
	// into num: the same bytes, without the server converting each row.
	intMember := 0
	if len(fds) > 0 && fds[0].Format == pgtype.BinaryFormatCode {
		switch fds[0].DataTypeOID {
		case pgtype.Int8OID:
			intMember = 8
		case pgtype.Int4OID:
			intMember = 4
		case pgtype.Int2OID:
			intMember = 2
		}
	}
	var num [20]byte
	var asked map[string]int
	next := 0 // the member the next row is expected to answer
	position := func(raw []byte) (int, bool) {
		if next < len(members) && members[next] == string(raw) && (next == 0 || warmer.MemberRises(members[next-1], members[next])) {
			next++
			return next - 1, true
		}
		next = len(members) // out of order: asked from now on
		if asked == nil {
			asked = make(map[string]int, len(members))
			for i := len(members) - 1; i >= 0; i-- {
				asked[members[i]] = i
			}
		}
		i, ok := asked[string(raw)]
		return i, ok
	}
	answered := make([]bool, len(members))
	var nulls []int          // the positions in out of the values that came back NULL
	var seen map[string]bool // the other members answered
	twice := false           // some member was answered twice: dedupe the results
	var (
		// Scanned into values, not pointers, through one destination list:
		// no allocation per row for them. Each scan gives value a new slice.
		member  pgtype.Text
		value   []byte
		version any
		ver8    pgtype.Int8
	)
	dest := []any{&member, &value}
	if rawMember || intMember > 0 {
		dest[0] = nil // read from RawValues
	}
	// A text value is copied from its raw bytes into a buffer shared by the
	// batch's values, not into a slice of its own per row. Each buffer is
	// sized for the rows still expected at the size of the one that needs
	// it, up to 32 KB: a change-driven load of two short values does not
	// allocate (and clear) 32 KB.
	rawValue := len(fds) > 1 && (fds[1].DataTypeOID == pgtype.TextOID || fds[1].DataTypeOID == pgtype.VarcharOID)
	var arena []byte
	rowsRead := 0
	if rawValue {
		dest[1] = nil
	}
	int8Version := sh.versioned && len(fds) == 3 && fds[2].DataTypeOID == pgtype.Int8OID
	if int8Version {
		dest = append(dest, &ver8) // no boxing of each row's version
	} else if sh.versioned {
		dest = append(dest, &version)
	}
	for rows.Next() {
		rowsRead++
		value, version = nil, nil
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("keys[%s].query: %w: %w", spec.Name, warmer.ErrBadPayload, err)
		}
		if rawValue {
			switch raw := rows.RawValues()[1]; {
			case raw == nil: // NULL
			case len(raw) == 0:
				value = []byte{} // empty, not NULL (a slice of no buffer yet would be nil)
			default:
				if cap(arena)-len(arena) < len(raw) {
					left := max(1, len(members)-rowsRead+1)
					arena = make([]byte, 0, max(len(raw), min(32<<10, left*len(raw))))
				}
				at := len(arena)
				arena = append(arena, raw...)
				value = arena[at:len(arena):len(arena)]
			}
		}
		var m string
		dup, isAsked := false, false
		if rawMember || intMember > 0 {
			raw := rows.RawValues()[0]
			if raw == nil {
				continue
			}
			if intMember > 0 {
				if len(raw) != intMember {
					return nil, fmt.Errorf("keys[%s].query: %w: a %d-byte integer member, want %d bytes", spec.Name, warmer.ErrBadPayload, len(raw), intMember)
				}
				raw = appendIntMember(num[:0], raw)
			}
			if i, ok := position(raw); ok {
				m, dup, isAsked = members[i], answered[i], true
				answered[i] = true
			} else {
				m, dup = string(raw), seen[string(raw)]
			}
		} else {
			if !member.Valid {
				continue
			}
			m, dup = member.String, seen[member.String]
		}
		if !isAsked {
			if seen == nil {
				seen = make(map[string]bool)
			}
			seen[m] = true
		}
		r := warmer.Result{Member: m, Value: value}
		if int8Version {
			if ver8.Valid {
				r.Version, r.HasVersion = ver8.Int64, true
			} else {
				_, r.Err = versionOf(spec, nil)
			}
		} else if sh.versioned {
			r.Version, r.Err = versionOf(spec, version)
			r.HasVersion = r.Err == nil
		}
		switch {
		case r.Err != nil:
		case dup:
			r.Err = fmt.Errorf("%w: query returned member %q twice", warmer.ErrDuplicate, m)
			twice = true
		case value == nil:
			// Over the bound, or NULL: told apart once the rows are read.
			nulls = append(nulls, len(out))
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.queryError(spec, err)
	}
	if len(nulls) > 0 {
		rows.Close() // its connection back first: the sizes are read on another
		s.explainNulls(ctx, spec, sh, out, nulls)
	}
	if twice {
		return dedupe(out), nil
	}
	return out, nil
}

// appendIntMember appends the decimal digits of raw, a big-endian integer of
// 8, 4 or 2 bytes (PostgreSQL's binary bigint, integer or smallint), as the
// database writes it as text.
func appendIntMember(dst, raw []byte) []byte {
	var v int64
	switch len(raw) {
	case 8:
		v = int64(binary.BigEndian.Uint64(raw))
	case 4:
		v = int64(int32(binary.BigEndian.Uint32(raw)))
	case 2:
		v = int64(int16(binary.BigEndian.Uint16(raw)))
	}
	return strconv.AppendInt(dst, v, 10)
}

// paramKind is the type of a family query's member parameter ($1), for how
// members are bound.
type paramKind int

const (
	// paramText: text[], or a type Hearth does not parse; members bound
	// as text, the server casts them (checked first by shape.canon when
	// the type allows).
	paramText paramKind = iota
	paramInt8
	paramInt4
	paramInt2
	paramUUID
)

func kindOf(oid uint32) paramKind {
	switch oid {
	case pgtype.Int8ArrayOID:
		return paramInt8
	case pgtype.Int4ArrayOID:
		return paramInt4
	case pgtype.Int2ArrayOID:
		return paramInt2
	case pgtype.UUIDArrayOID:
		return paramUUID
	}
	return paramText
}

// canonicalUUID is a uuid as PostgreSQL prints it (uuid::text).
var canonicalUUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// bindMembers returns the parameter for members and, failed as bad members,
// those that do not round-trip through the parameter's type: a member is
// sent only if the type's text form of the parsed value is the member itself
// ("01", "+1", " 1", "1.0" are not a bigint's; an upper-case uuid is not a
// uuid's), since the query answers under that text form. The parameter is nil
// when no member is left to send.
func bindMembers(kind paramKind, members []string) (any, []warmer.Result) {
	out := make([]warmer.Result, 0, len(members))
	refuse := func(m, typ string) {
		out = append(out, warmer.Result{Member: m, Err: fmt.Errorf("%w: %q is not how the database writes a %s value: its answer would come back under another name", warmer.ErrBadMember, m, typ)})
	}
	var param any
	switch kind {
	case paramText:
		return members, out
	case paramInt8, paramInt4, paramInt2:
		bits, typ := 64, "bigint"
		if kind == paramInt4 {
			bits, typ = 32, "integer"
		} else if kind == paramInt2 {
			bits, typ = 16, "smallint"
		}
		// Bound as the array's text, {1,2,3}, of the members that are the
		// type's own text: pgx sends a string as it is (text format) and the
		// server parses it, where a []int64 was boxed an element at a time
		// to be encoded (an allocation per member).
		size := 2
		for _, m := range members {
			size += len(m) + 1
		}
		arr := make([]byte, 0, size)
		arr = append(arr, '{')
		var buf [20]byte
		for _, m := range members {
			n, err := strconv.ParseInt(m, 10, bits)
			if err != nil || string(strconv.AppendInt(buf[:0], n, 10)) != m { // compared without a copy
				refuse(m, typ)
				continue
			}
			if len(arr) > 1 {
				arr = append(arr, ',')
			}
			arr = append(arr, m...)
		}
		if len(arr) > 1 {
			param = string(append(arr, '}'))
		}
	case paramUUID:
		ok := make([]string, 0, len(members))
		for _, m := range members {
			if !canonicalUUID.MatchString(m) {
				refuse(m, "uuid")
				continue
			}
			ok = append(ok, m)
		}
		if len(ok) > 0 {
			param = ok
		}
	}
	return param, out
}

// canonQuery builds the query that writes members as the element type of the
// array type oid writes them, and ranks the members equal under the type's
// own equality; "" if oid is not an array, or its element has no equality
// (the query does not prepare). The type's name is the server's own
// format_type, quoted by the server.
func canonQuery(ctx context.Context, conn *pgx.Conn, oid uint32) string {
	var elem *string
	if err := conn.QueryRow(ctx, `SELECT format_type(typelem, NULL) FROM pg_type WHERE oid = $1 AND typelem <> 0 AND typlen = -1`, oid).Scan(&elem); err != nil || elem == nil {
		return ""
	}
	q := `SELECT c.m::text, row_number() OVER (PARTITION BY c.m ORDER BY c.o)
FROM (SELECT u.x::` + *elem + ` AS m, u.o FROM unnest($1::text[]) WITH ORDINALITY AS u(x, o)) AS c
ORDER BY c.o`
	if _, err := conn.PgConn().Prepare(ctx, "", q, nil); err != nil {
		return ""
	}
	return q
}

// canonical asks the server how the parameter's type writes each member: a
// member it writes otherwise ("2024-1-5" for a date is "2024-01-05"), or that
// equals an earlier member under the type's equality ("1.0" after "1" for a
// numeric: one row answers both, under one name), is refused as a bad member.
// A member the type cannot read fails the batch, as the query itself would.
func (s *Source) canonical(ctx context.Context, sh *shape, members []string) ([]string, []warmer.Result, error) {
	rows, err := s.pool.Query(ctx, sh.canon, members)
	if err != nil {
		return nil, nil, fmt.Errorf("query: %w", classify(err))
	}
	defer rows.Close()
	keep := make([]string, 0, len(members))
	var refused []warmer.Result
	var (
		text string
		rank int64
		i    int
	)
	for rows.Next() {
		if err := rows.Scan(&text, &rank); err != nil || i >= len(members) {
			return nil, nil, fmt.Errorf("query: canonical members: %w", errors.Join(err, warmer.ErrBadPayload))
		}
		m := members[i]
		i++
		switch {
		case text != m:
			refused = append(refused, warmer.Result{Member: m, Err: fmt.Errorf("%w: %q is written %q by the database: its answer would come back under another name", warmer.ErrBadMember, m, text)})
		case rank > 1:
			refused = append(refused, warmer.Result{Member: m, Err: fmt.Errorf("%w: %q equals another member of the batch for the database: one answer would come back for both", warmer.ErrBadMember, m)})
		default:
			keep = append(keep, m)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("query: %w", classify(err))
	}
	if i != len(members) {
		return nil, nil, fmt.Errorf("query: canonical members: %w: %d of %d", warmer.ErrBadPayload, i, len(members))
	}
	return keep, refused, nil
}

// explainNulls tells the values that came back NULL (out[i] for i in at)
// apart: over max_value_bytes (not sent; the old value is kept), or NULL. It
// reads their sizes with a query of their own; if that fails, each is failed
// with its error.
func (s *Source) explainNulls(ctx context.Context, spec *warmer.Spec, sh *shape, out []warmer.Result, at []int) {
	var (
		rows   pgx.Rows
		err    error
		family = spec.Template.IsFamily()
	)
	if family {
		members := make([]string, len(at))
		for k, i := range at {
			members[k] = out[i].Member
		}
		param, _ := bindMembers(sh.param, members) // each bound once already
		rows, err = s.pool.Query(ctx, sh.sizes, param)
	} else {
		rows, err = s.pool.Query(ctx, sh.sizes)
	}
	sizes := map[string]int64{}
	if err == nil {
		var (
			m    string
			size *int64
		)
		dest := []any{&size}
		if family {
			dest = []any{&m, &size}
		}
		for rows.Next() && err == nil {
			if err = rows.Scan(dest...); err == nil && size != nil {
				sizes[m] = *size
			}
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	for _, i := range at {
		r := &out[i]
		r.Value = nil
		name := ""
		if family {
			name = fmt.Sprintf(" for member %q", r.Member)
		}
		switch size, ok := sizes[r.Member]; {
		case err != nil:
			r.Err = fmt.Errorf("%w: NULL or over max_value_bytes%s, and its size could not be read: %w", warmer.ErrNullValue, name, s.queryError(spec, err))
		case ok && size > valueBound(spec):
			r.Err = tooLarge(size, spec)
			ev, what := s.log.Warn().Str("family", spec.Name), "key"
			if family {
				ev, what = ev.Str("member", r.Member), "member"
			}
			ev.Int64("bytes", size).Int("max_value_bytes", spec.MaxValueBytes).
				Msg("value over max_value_bytes not fetched; the " + what + "'s old value is kept")
		default:
			r.Err = fmt.Errorf("%w: query returned NULL%s", warmer.ErrNullValue, name)
		}
	}
}

// valueBound is the largest value the server may send for spec.
func valueBound(spec *warmer.Spec) int64 {
	if spec.MaxValueBytes <= 0 {
		return math.MaxInt32 // no bound declared: octet_length is an int4
	}
	return int64(spec.MaxValueBytes)
}

func tooLarge(size int64, spec *warmer.Spec) error {
	return fmt.Errorf("%w: %d bytes, max_value_bytes is %d (not fetched)", warmer.ErrTooLarge, size, spec.MaxValueBytes)
}

// shape is a declaration query checked and wrapped so that the value column
// is sent only within the bound (NULL over it).
type shape struct {
	sql string
	// sizes reads the size of the value of each member of $1 (a family's:
	// member and size) or of the single key's value, as the bound measures
	// it: what tells a value over the bound from a NULL one.
	sizes string
	// versioned: the query returns the declaration's version column last,
	// and the wrapper passes it through.
	versioned bool
	// param is the type of the query's member parameter ($1).
	param paramKind
	// canon, for an array type Hearth does not parse (numeric[], date[]…),
	// gives each member as the type writes it and its rank among the
	// members equal to it (see canonical); "" when the type has no equality.
	canon string
}

// shape describes the declaration's query once (its columns and parameters,
// without running it) and builds the bounded query around it. The wrapper is a
// plain subquery, which the planner pulls up: the query keeps its index. (For a
// jsonb value the text conversion sits in a subquery of its own that is not
// pulled up, OFFSET 0; the query inside it is planned as it is, index and all.)
func (s *Source) shape(ctx context.Context, spec *warmer.Spec) (*shape, error) {
	key := shapeKey(spec)
	if sh, ok := s.shapes.Load(key); ok {
		return sh.(*shape), nil
	}
	for {
		ch := s.describing.DoChan(key, func() (any, error) {
			if sh, ok := s.shapes.Load(key); ok {
				return sh, nil
			}
			sh, err := s.describe(ctx, spec)
			if err != nil {
				return nil, err
			}
			s.shapes.Store(key, sh)
			return sh, nil
		})
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("query: %w", classify(ctx.Err()))
		case res := <-ch:
			if res.Err == nil {
				return res.Val.(*shape), nil
			}
			if res.Shared && ctx.Err() == nil &&
				(errors.Is(res.Err, context.Canceled) || errors.Is(res.Err, context.DeadlineExceeded)) {
				continue // the load that described it gave up; this one has time left
			}
			return nil, res.Err
		}
	}
}

// shapeKey names a declaration's query in the shape cache.
func shapeKey(spec *warmer.Spec) string {
	return fmt.Sprintf("%t\x00%s\x00%s", spec.Template.IsFamily(), spec.VersionColumn, spec.Query)
}

// describe prepares the declaration's query (without running it), checks its
// columns and parameters, and builds the bounded query around it.
func (s *Source) describe(ctx context.Context, spec *warmer.Spec) (*shape, error) {
	s.described.Add(1)
	family := spec.Template.IsFamily()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("query: %w", classify(err))
	}
	defer conn.Release()
	sd, err := conn.Conn().PgConn().Prepare(ctx, "", spec.Query, nil)
	if err != nil {
		return nil, fmt.Errorf("query: %w", classify(err))
	}
	field, wantCols, wantParams, cols := "keys["+spec.Name+"].query", 1, 0, "(value)"
	if family {
		wantCols, wantParams, cols = 2, 1, "(member, value)"
	}
	versioned := spec.VersionColumn != ""
	if versioned {
		wantCols++
		cols = strings.TrimSuffix(cols, ")") + ", " + spec.VersionColumn + ")"
	}
	if n := len(sd.Fields); n != wantCols {
		return nil, fmt.Errorf("%s: %w: must return %d column(s) %s, got %d", field, warmer.ErrBadPayload, wantCols, cols, n)
	}
	if versioned {
		last := sd.Fields[wantCols-1]
		if last.Name != spec.VersionColumn {
			return nil, fmt.Errorf("keys[%s].version_column: %w: the query's last column is %q, not %q", spec.Name, warmer.ErrBadPayload, last.Name, spec.VersionColumn)
		}
		switch last.DataTypeOID {
		case pgtype.Int8OID, pgtype.Int4OID, pgtype.Int2OID, pgtype.TimestamptzOID, pgtype.TimestampOID:
		default:
			return nil, fmt.Errorf("keys[%s].version_column: %w: column %q must be bigint, integer, timestamptz or timestamp (xmin: xmin::text::bigint), got type oid %d",
				spec.Name, warmer.ErrBadPayload, spec.VersionColumn, last.DataTypeOID)
		}
		wantCols--
	}
	if n := len(sd.ParamOIDs); n > wantParams {
		return nil, fmt.Errorf("%s: %w: takes %d parameters, but only %d is bound", field, warmer.ErrBadPayload, n, wantParams)
	}
	// octet_length of a text or bytea reads the stored length (no detoasting);
	// any other type is measured as the text it would be sent as.
	size := "octet_length(q.v::text)"
	switch sd.Fields[wantCols-1].DataTypeOID {
	case pgtype.ByteaOID, pgtype.TextOID, pgtype.VarcharOID, pgtype.BPCharOID:
		size = "octet_length(q.v)"
	}
	// The query goes on its own lines, so a trailing -- comment cannot swallow
	// the wrapper; a trailing semicolon would end the subquery.
	inner := strings.TrimRight(strings.TrimSpace(spec.Query), ";")
	var sql string
	ver, verCol := "", ""
	if versioned {
		ver, verCol = ", q.ver", ", ver"
	}
	switch {
	case sd.Fields[wantCols-1].DataTypeOID == pgtype.JSONBOID:
		// A jsonb is measured as its text, and sent as the same text (the
		// bytes pgx decodes a binary jsonb to): converted once per row in a
		// subquery kept apart (OFFSET 0), not once for the bound, once for
		// the size and once more to send it.
		outer, in, cols, bound := "", "", "v", "$1"
		if family {
			outer, in, cols, bound = "x.m, ", "q.m, ", "m, v", "$2"
		}
		xver := ""
		if versioned {
			xver, cols = ", x.ver", cols+", ver"
		}
		sql = "SELECT " + outer + "CASE WHEN octet_length(x.v) <= " + bound + " THEN x.v END" + xver +
			"\nFROM (SELECT " + in + "q.v::text" + ver + " FROM (\n" + inner + "\n) AS q(" + cols + ") OFFSET 0) AS x(" + cols + ")"
	case family:
		sql = fmt.Sprintf("SELECT q.m, CASE WHEN %[1]s <= $2 THEN q.v END%[3]s\nFROM (\n%[2]s\n) AS q(m, v%[4]s)", size, inner, ver, verCol)
	default:
		sql = fmt.Sprintf("SELECT CASE WHEN %[1]s <= $1 THEN q.v END%[3]s\nFROM (\n%[2]s\n) AS q(v%[4]s)", size, inner, ver, verCol)
	}
	// The sizes are asked for only when a value comes back NULL (rare), so
	// that no row of a load carries its size.
	sizes := fmt.Sprintf("SELECT %s\nFROM (\n%s\n) AS q(v%s)", size, inner, verCol)
	if family {
		sizes = fmt.Sprintf("SELECT q.m::text, %s\nFROM (\n%s\n) AS q(m, v%s)", size, inner, verCol)
	}
	sh := &shape{sql: sql, sizes: sizes, versioned: versioned}
	if family && len(sd.ParamOIDs) == 1 {
		oid := sd.ParamOIDs[0]
		sh.param = kindOf(oid)
		if sh.param == paramText && oid != pgtype.TextArrayOID && oid != pgtype.VarcharArrayOID {
			sh.canon = canonQuery(ctx, conn.Conn(), oid)
		}
	}
	return sh, nil
}

// queryError classifies a failed query and, if the cause may be a changed
// column type (the wrapper's size expression no longer fits), forgets the
// query's shape so that the next load describes it again.
func (s *Source) queryError(spec *warmer.Spec, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "42") || pe.Code == "0A000") {
		s.shapes.Delete(shapeKey(spec))
	}
	return fmt.Errorf("query: %w", classify(err))
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

func (s *Source) loadSingle(ctx context.Context, spec *warmer.Spec, sh *shape) ([]warmer.Result, error) {
	rows, err := s.pool.Query(ctx, sh.sql, valueBound(spec))
	if err != nil {
		return nil, s.queryError(spec, err)
	}
	defer rows.Close()
	var (
		value   []byte
		version any
		n       int
	)
	dest := []any{&value}
	if sh.versioned {
		dest = append(dest, &version)
	}
	for rows.Next() {
		n++
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("keys[%s].query: %w: %w", spec.Name, warmer.ErrBadPayload, err)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, s.queryError(spec, err)
	}
	switch {
	case n == 0:
		return []warmer.Result{{Missing: true}}, nil
	case n > 1:
		return []warmer.Result{{Err: fmt.Errorf("%w: query returned %d rows for a single key", warmer.ErrDuplicate, n)}}, nil
	case value == nil:
		rows.Close()
		out := []warmer.Result{{}}
		s.explainNulls(ctx, spec, sh, out, []int{0})
		return out, nil
	}
	r := warmer.Result{Value: value}
	if sh.versioned {
		r.Version, r.Err = versionOf(spec, version)
		r.HasVersion = r.Err == nil
		if r.Err != nil {
			r.Value = nil
		}
	}
	return []warmer.Result{r}, nil
}

// ListMembers runs the members query (one text column), stopping with an error
// past the declaration's MaxMembers.
func (s *Source) ListMembers(ctx context.Context, spec *warmer.Spec, prev []string) ([]string, error) {
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
	// A text column's bytes are the member in either wire format: read them
	// as they are, and keep prev's string where the row repeats it.
	raw := false
	switch rows.FieldDescriptions()[0].DataTypeOID {
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.BPCharOID, pgtype.NameOID:
		raw = true
	}
	out := make([]string, 0, len(prev))
	var m pgtype.Text
	for rows.Next() {
		if spec.MaxMembers > 0 && len(out) >= spec.MaxMembers {
			cancel()
			return nil, fmt.Errorf("keys[%s].members_query: %w: more than max_members %d", spec.Name, warmer.ErrTooMany, spec.MaxMembers)
		}
		if raw {
			b := rows.RawValues()[0]
			switch i := len(out); {
			case b == nil: // NULL: not a member
			case i < len(prev) && prev[i] == string(b): // compared without a copy
				out = append(out, prev[i])
			default: // checked member by member by the warmer, as any listing
				out = append(out, string(b))
			}
			continue
		}
		if err := rows.Scan(&m); err != nil {
			return nil, fmt.Errorf("keys[%s].members_query: %w: %w", spec.Name, warmer.ErrBadPayload, err)
		}
		if m.Valid {
			out = append(out, m.String)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("members query: %w", classify(err))
	}
	if len(out) < cap(out)/2 {
		out = slices.Clone(out) // far fewer than last time: do not keep last time's room
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

// versionOf converts a version column's value: an integer as it is, a
// timestamp as microseconds since 1970. NULL fails the member (its old value
// is kept), as a value of another type would.
func versionOf(spec *warmer.Spec, v any) (int64, error) {
	switch v := v.(type) {
	case int64:
		return v, nil
	case int32:
		return int64(v), nil
	case int16:
		return int64(v), nil
	case time.Time:
		return v.UnixMicro(), nil
	case nil:
		return 0, fmt.Errorf("%w: version column %s is NULL", warmer.ErrBadPayload, spec.VersionColumn)
	}
	return 0, fmt.Errorf("%w: version column %s holds %T, not an integer or a timestamp", warmer.ErrBadPayload, spec.VersionColumn, v)
}
