package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// defaultPGAddr is the shared PostgreSQL server's address.
const defaultPGAddr = "127.0.0.1:5432"

// PostgresEnv is a test's isolated view of the shared PostgreSQL server.
type PostgresEnv struct {
	// DSN is a postgres:// URL for database test whose search_path is Schema.
	DSN string
	// Schema is the test's own schema, dropped (CASCADE) at cleanup.
	Schema string
	// Pool is connected with DSN and closed at cleanup.
	Pool *pgxpool.Pool
}

// Postgres returns a DSN for database test whose search_path is a fresh
// schema created for this test (named "t_<sanitised test name>_<random>"),
// and a pool connected with it. At cleanup the pool is closed and the schema
// dropped with CASCADE.
//
// The DSN has the form
// postgres://USER@HOST:PORT/test?sslmode=disable&search_path=SCHEMA; pgx sends
// unknown URL parameters such as search_path to the server as run-time
// parameters. The shared server (127.0.0.1:5432, or HEARTH_TEST_PG_ADDR) is
// tried as user root, then postgres; if neither works, a private server
// started once per test binary is used.
//
// The test must not stop the server or change anything outside its schema:
// use [PrivatePostgres] for that.
func Postgres(t testing.TB) *PostgresEnv {
	t.Helper()
	base, note, err := sharedPostgresDSN()
	if err != nil {
		RequireServer(t, "%v", err)
		return nil
	}
	if note != "" {
		t.Log(note)
	}
	schema := "t_" + strings.ToLower(sanitize(t.Name(), 40)) + "_" + randomHex(4)
	ident := pgx.Identifier{schema}.Sanitize()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pgExec(ctx, base, "CREATE SCHEMA "+ident); err != nil {
		t.Fatalf("testenv: creating schema %s: %v", schema, err)
	}
	dropSchema := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return pgExec(ctx, base, "DROP SCHEMA IF EXISTS "+ident+" CASCADE")
	}
	env := &PostgresEnv{
		DSN:    base + "&search_path=" + url.QueryEscape(schema),
		Schema: schema,
	}
	cfg, err := pgxpool.ParseConfig(env.DSN)
	if err != nil {
		_ = dropSchema()
		t.Fatalf("testenv: parsing dsn %s: %v", env.DSN, err)
	}
	// Many tests share the server; keep each pool small.
	cfg.MaxConns = 4
	env.Pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		_ = dropSchema()
		t.Fatalf("testenv: connecting pool to %s: %v", env.DSN, err)
	}
	t.Cleanup(func() {
		env.Pool.Close()
		if err := dropSchema(); err != nil {
			t.Errorf("testenv: dropping schema %s: %v", schema, err)
		}
	})
	return env
}

// pgExec runs sql on a connection of its own.
func pgExec(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("exec %q: %w", sql, err)
	}
	return nil
}

// sharedPG is the base DSN Postgres hands out, resolved once per test binary.
var sharedPG struct {
	once sync.Once
	dsn  string // postgres://USER@HOST:PORT/test?sslmode=disable
	note string // set when a fallback server is used
	err  error
}

func sharedPostgresDSN() (dsn, note string, err error) {
	sharedPG.once.Do(func() {
		addr := os.Getenv("HEARTH_TEST_PG_ADDR")
		if addr == "" {
			addr = defaultPGAddr
		}
		var errs []error
		for _, u := range []string{"root", "postgres"} {
			dsn := "postgres://" + u + "@" + addr + "/test?sslmode=disable"
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := pgExec(ctx, dsn+"&connect_timeout=2", "SELECT 1")
			cancel()
			if err == nil {
				sharedPG.dsn = dsn
				return
			}
			errs = append(errs, fmt.Errorf("as %s: %w", u, err))
		}
		perr := errors.Join(errs...)
		srv, err := newPostgresServer()
		if err != nil {
			sharedPG.err = fmt.Errorf("shared postgresql at %s is not usable (%v) and no private one could be started: %w", addr, perr, err)
			return
		}
		registerPackageServer(srv)
		sharedPG.dsn = srv.DSN()
		sharedPG.note = fmt.Sprintf("testenv: shared postgresql at %s is not usable (%v); using this test binary's private postgresql at port %d", addr, oneLine(perr), srv.Port)
	})
	return sharedPG.dsn, sharedPG.note, sharedPG.err
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// PostgresServer is a PostgreSQL server of a test's own, with trust
// authentication, superuser postgres and a database named test. Its methods
// must be called from the test's goroutine.
type PostgresServer struct {
	// Port is the server's TCP port on 127.0.0.1; it stays the same across
	// restarts.
	Port int

	binDir string
	dir    string // owned by the server's user: socket, log and data/
	runas  string // path of runuser when running as root, else ""

	mu   sync.Mutex
	proc *proc // nil while stopped
}

// PrivatePostgres starts a PostgreSQL server of the test's own on a free port
// (fsync off, listening on 127.0.0.1 only). It is stopped and its files removed
// at cleanup. Starting one takes a second or two.
func PrivatePostgres(t testing.TB) *PostgresServer {
	t.Helper()
	s, err := newPostgresServer()
	if err != nil {
		RequireServer(t, "cannot start a private postgresql: %v", err)
		return nil
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("testenv: stopping private postgresql on port %d: %v", s.Port, err)
		}
	})
	return s
}

// DSN returns postgres://postgres@127.0.0.1:PORT/test?sslmode=disable.
func (s *PostgresServer) DSN() string {
	return "postgres://postgres@" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) + "/test?sslmode=disable"
}

func (s *PostgresServer) adminDSN() string {
	return "postgres://postgres@" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) + "/postgres?sslmode=disable&connect_timeout=2"
}

func (s *PostgresServer) dataDir() string { return filepath.Join(s.dir, "data") }
func (s *PostgresServer) logPath() string { return filepath.Join(s.dir, "postgres.log") }

// findPGBin returns the newest /usr/lib/postgresql/<version>/bin, or the
// directory of initdb on PATH.
func findPGBin() (string, error) {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	type cand struct {
		dir string
		ver float64
	}
	var cands []cand
	for _, m := range matches {
		dir := filepath.Dir(m)
		ver, err := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
		if err != nil {
			continue
		}
		cands = append(cands, cand{dir, ver})
	}
	if len(cands) > 0 {
		sort.Slice(cands, func(i, j int) bool { return cands[i].ver > cands[j].ver })
		return cands[0].dir, nil
	}
	p, err := exec.LookPath("initdb")
	if err != nil {
		return "", fmt.Errorf("no /usr/lib/postgresql/*/bin/initdb and %w", err)
	}
	return filepath.Dir(p), nil
}

func newPostgresServer() (*PostgresServer, error) {
	binDir, err := findPGBin()
	if err != nil {
		return nil, err
	}
	s := &PostgresServer{binDir: binDir}
	base := os.TempDir()
	uid, gid := -1, -1
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root: run it as user postgres, in a
		// directory that user owns and can reach.
		s.runas, err = exec.LookPath("runuser")
		if err != nil {
			for _, p := range []string{"/usr/sbin/runuser", "/sbin/runuser"} {
				if _, serr := os.Stat(p); serr == nil {
					s.runas, err = p, nil
					break
				}
			}
			if err != nil {
				return nil, fmt.Errorf("running as root needs runuser: %w", err)
			}
		}
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs user postgres: %w", err)
		}
		if uid, err = strconv.Atoi(u.Uid); err != nil {
			return nil, fmt.Errorf("uid of postgres: %w", err)
		}
		if gid, err = strconv.Atoi(u.Gid); err != nil {
			return nil, fmt.Errorf("gid of postgres: %w", err)
		}
		base = "/tmp" // TMPDIR may be somewhere user postgres cannot reach
	}
	s.dir, err = os.MkdirTemp(base, "hearth-pg-")
	if err != nil {
		return nil, fmt.Errorf("make postgresql dir: %w", err)
	}
	fail := func(err error) (*PostgresServer, error) {
		_ = os.RemoveAll(s.dir)
		return nil, err
	}
	if err := os.Chmod(s.dir, 0o755); err != nil {
		return fail(fmt.Errorf("chmod %s: %w", s.dir, err))
	}
	if uid >= 0 {
		if err := os.Chown(s.dir, uid, gid); err != nil {
			return fail(fmt.Errorf("chown %s to postgres: %w", s.dir, err))
		}
	}
	out, err := s.command("initdb",
		"-D", s.dataDir(), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync",
	).CombinedOutput()
	if err != nil {
		return fail(fmt.Errorf("initdb: %w\n%s", err, strings.TrimSpace(string(out))))
	}
	// Another process may take the free port before postgres binds it: retry.
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			lastErr = err
			break
		}
		s.mu.Lock()
		err = s.startLocked(port)
		s.mu.Unlock()
		if err == nil {
			lastErr = nil
			break
		}
		lastErr = err
	}
	if lastErr != nil {
		return fail(lastErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pgExec(ctx, s.adminDSN(), "CREATE DATABASE test"); err != nil {
		_ = s.stop()
		return nil, fmt.Errorf("create database test: %w", err)
	}
	return s, nil
}

// command returns a command running the PostgreSQL binary name, as user
// postgres when the tests run as root.
func (s *PostgresServer) command(name string, args ...string) *exec.Cmd {
	bin := filepath.Join(s.binDir, name)
	var cmd *exec.Cmd
	if s.runas != "" {
		cmd = exec.Command(s.runas, append([]string{"-u", "postgres", "--", bin}, args...)...)
	} else {
		cmd = exec.Command(bin, args...)
	}
	cmd.Dir = s.dir
	return cmd
}

// startLocked runs postgres in the foreground (so that it gets a parent-death
// signal) and waits until it accepts connections.
func (s *PostgresServer) startLocked(port int) error {
	if s.proc != nil {
		return fmt.Errorf("postgresql on port %d is already running", s.Port)
	}
	logFile, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open postgresql log: %w", err)
	}
	defer logFile.Close()
	cmd := s.command("postgres",
		"-D", s.dataDir(),
		"-p", strconv.Itoa(port),
		"-k", s.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "shared_buffers=32MB",
	)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// SIGTERM: runuser passes it on to postgres, which then shuts down
	// (SIGKILL would orphan postgres under runuser).
	p, err := startProc(cmd, syscall.SIGTERM)
	if err != nil {
		return err
	}
	s.Port = port
	err = waitFor(60*time.Second, 20*time.Millisecond, p.done, func() error {
		// Check the data directory too: if another server holds the port,
		// ours exits but the other one would accept connections.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, s.adminDSN())
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		defer conn.Close(context.Background())
		var dataDir string
		if err := conn.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dataDir); err != nil {
			return fmt.Errorf("query data_directory: %w", err)
		}
		if dataDir != s.dataDir() {
			return fmt.Errorf("port %d is served by another postgresql (data directory %s)", port, dataDir)
		}
		return nil
	})
	if err != nil {
		note := p.exitNote()
		s.proc = p
		serr := s.stopLocked()
		return errors.Join(fmt.Errorf("postgresql on port %d did not accept connections%s: %w%s", port, note, err, logTail(s.logPath())), serr)
	}
	s.proc = p
	return nil
}

// Stop stops the server with "pg_ctl stop -m fast" and waits for it to exit.
// Stopping a stopped server does nothing.
func (s *PostgresServer) Stop(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stopLocked(); err != nil {
		t.Fatalf("testenv: stopping postgresql on port %d: %v", s.Port, err)
	}
}

func (s *PostgresServer) stopLocked() error {
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc = nil
	if p.exited() {
		return nil
	}
	out, err := s.command("pg_ctl", "stop", "-D", s.dataDir(), "-m", "fast", "-w", "-t", "60").CombinedOutput()
	if err == nil && p.wait(30*time.Second) {
		return nil
	}
	stopErr := fmt.Errorf("pg_ctl stop: %v: %s", err, strings.TrimSpace(string(out)))
	// Fall back to an immediate shutdown of the postmaster, then to killing
	// what we started.
	if pid, perr := s.postmasterPID(); perr == nil {
		_ = syscall.Kill(pid, syscall.SIGQUIT)
		if p.wait(10 * time.Second) {
			return stopErr
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if kerr := p.kill(); kerr != nil {
		return errors.Join(stopErr, kerr)
	}
	return stopErr
}

func (s *PostgresServer) postmasterPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(s.dataDir(), "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

// Start starts the stopped server again with the same port and data and
// waits until it accepts connections.
func (s *PostgresServer) Start(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.startLocked(s.Port); err != nil {
		t.Fatalf("testenv: starting postgresql again on port %d: %v", s.Port, err)
	}
}

// stop stops the server and removes its directory.
func (s *PostgresServer) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.stopLocked()
	if rerr := os.RemoveAll(s.dir); rerr != nil && err == nil {
		err = fmt.Errorf("remove %s: %w", s.dir, rerr)
	}
	return err
}
