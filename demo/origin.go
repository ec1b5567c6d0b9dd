package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/warmer"
)

// callerHeader tells the embedded origin who calls it, so that it can count the
// readers' calls and Hearth's apart.
const callerHeader = "X-Hearth-Demo-Caller"

// origin is the slow database the cache protects.
type origin interface {
	// fetch is a reader's load of one item after a miss.
	fetch(ctx context.Context, id int) ([]byte, error)
	// configure points Hearth's config at the origin: its source and the
	// declaration's query or path.
	configure(cfg *config.Config, key *config.Key)
	// wrap lets the origin count Hearth's calls where it cannot see them itself.
	wrap(src warmer.Source) warmer.Source
	// calls returns the calls made so far by readers and by Hearth.
	calls() (readers, hearth int64)
	describe() string
	close()
}

// httpOrigin is the embedded origin: an HTTP server on loopback that answers
// GET /items/{id} after a fixed latency and counts every call.
type httpOrigin struct {
	srv       *http.Server
	url       string
	latency   time.Duration
	client    *http.Client
	byReaders atomic.Int64
	byHearth  atomic.Int64
}

func newHTTPOrigin(latency time.Duration, readers int) (*httpOrigin, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo origin: %w", err)
	}
	o := &httpOrigin{url: "http://" + ln.Addr().String(), latency: latency}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(callerHeader) == "hearth" {
			o.byHearth.Add(1)
		} else {
			o.byReaders.Add(1)
		}
		select {
		case <-time.After(o.latency):
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"name":"item %s","loaded_at":%q}`, r.PathValue("id"), r.PathValue("id"), time.Now().Format(time.RFC3339Nano))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	o.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = o.srv.Serve(ln) }()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = readers
	o.client = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	return o, nil
}

func (o *httpOrigin) fetch(ctx context.Context, id int) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.url+"/items/"+strconv.Itoa(id), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(callerHeader, "reader")
	resp, err := o.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("origin: HTTP %d", resp.StatusCode)
	}
	return io.ReadAll(resp.Body)
}

func (o *httpOrigin) configure(cfg *config.Config, key *config.Key) {
	cfg.Sources = []config.Source{{
		Name: "origin", Type: "http", BaseURL: o.url, Timeout: 10 * time.Second,
		Headers: map[string]string{callerHeader: "hearth"}, Concurrency: 64, HealthPath: "/healthz",
	}}
	key.Path = "/items/{id}"
}

func (o *httpOrigin) wrap(src warmer.Source) warmer.Source { return src }

func (o *httpOrigin) calls() (int64, int64) { return o.byReaders.Load(), o.byHearth.Load() }

func (o *httpOrigin) describe() string {
	return fmt.Sprintf("embedded HTTP origin on %s (%s per call)", o.url, o.latency)
}

func (o *httpOrigin) close() {
	o.client.CloseIdleConnections()
	_ = o.srv.Close()
}

// pgOrigin is a real PostgreSQL: a table of items in a schema of the demo's
// own, dropped at the end, and pg_sleep as the heavy query's cost.
type pgOrigin struct {
	pool      *pgxpool.Pool
	dsn       string
	schema    string
	latency   time.Duration
	byReaders atomic.Int64
	byHearth  atomic.Int64
}

func newPGOrigin(ctx context.Context, dsn, runID string, keys, readers int, latency time.Duration) (*pgOrigin, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("--postgres: cannot parse the DSN (value withheld: it may hold a password)")
	}
	pc.MaxConns = int32(min(readers+2, 64))
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("--postgres: %w", err)
	}
	o := &pgOrigin{pool: pool, dsn: dsn, schema: "hearth_demo_" + runID, latency: latency}
	// The schema name is ours (hex digits), never user input.
	setup := fmt.Sprintf(`CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.items (id int PRIMARY KEY, payload text NOT NULL);
INSERT INTO %[1]s.items SELECT i, json_build_object('id', i, 'name', 'item ' || i)::text FROM generate_series(1, %[2]d) i;`, o.schema, keys)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := pool.Exec(cctx, setup); err != nil {
		pool.Close()
		return nil, fmt.Errorf("--postgres: create the demo table: %w", err)
	}
	return o, nil
}

func (o *pgOrigin) fetch(ctx context.Context, id int) ([]byte, error) {
	o.byReaders.Add(1)
	var v string
	err := o.pool.QueryRow(ctx, `SELECT payload FROM `+o.schema+`.items, pg_sleep($2::float8) WHERE id = $1`, id, o.latency.Seconds()).Scan(&v)
	return []byte(v), err
}

func (o *pgOrigin) configure(cfg *config.Config, key *config.Key) {
	cfg.Sources = []config.Source{{Name: "origin", Type: "postgres", DSN: o.dsn, MaxConns: 8}}
	key.Query = fmt.Sprintf(`SELECT id::text, payload FROM %s.items, pg_sleep(%.3f) WHERE id = ANY($1::int[])`, o.schema, o.latency.Seconds())
	key.Path = ""
}

// countingSource counts Hearth's queries: one per batch.
type countingSource struct {
	warmer.Source
	n *atomic.Int64
}

func (c countingSource) Load(ctx context.Context, spec *warmer.Spec, members []string) ([]warmer.Result, error) {
	c.n.Add(1)
	return c.Source.Load(ctx, spec, members)
}

func (o *pgOrigin) wrap(src warmer.Source) warmer.Source {
	return countingSource{Source: src, n: &o.byHearth}
}

func (o *pgOrigin) calls() (int64, int64) { return o.byReaders.Load(), o.byHearth.Load() }

func (o *pgOrigin) describe() string {
	return fmt.Sprintf("PostgreSQL, table %s.items (%s per query)", o.schema, o.latency)
}

func (o *pgOrigin) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = o.pool.Exec(ctx, "DROP SCHEMA "+o.schema+" CASCADE")
	o.pool.Close()
}
