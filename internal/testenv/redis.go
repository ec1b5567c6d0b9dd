package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// defaultRedisAddr is the shared Redis server's address.
const defaultRedisAddr = "127.0.0.1:6379"

// RedisEnv is a test's isolated view of the shared Redis server.
type RedisEnv struct {
	// Addr is the server's address, host:port.
	Addr string
	// Prefix is unique to this call; the test must put all its keys under it.
	Prefix string
	// Client is connected to Addr and closed at cleanup.
	Client *redis.Client
}

// Redis returns the shared Redis server's address ("127.0.0.1:6379", or
// HEARTH_TEST_REDIS_ADDR, or a fallback private server's if the shared one is
// not reachable) and a unique key prefix for this test, of the form
// "t:<sanitised test name>:<random>:".
//
// At cleanup every key under the prefix is deleted and the client is closed.
// The test must not flush, stop or pause the server: use [PrivateRedis] for
// that.
func Redis(t testing.TB) *RedisEnv {
	t.Helper()
	addr, note, err := sharedRedisAddr()
	if err != nil {
		RequireServer(t, "%v", err)
		return nil
	}
	if note != "" {
		t.Log(note)
	}
	env := &RedisEnv{
		Addr:   addr,
		Prefix: "t:" + sanitize(t.Name(), 80) + ":" + randomHex(4) + ":",
		Client: newRedisClient(addr),
	}
	t.Cleanup(func() { _ = env.Client.Close() })
	CleanupPrefix(t, addr, env.Prefix)
	return env
}

// CleanupPrefix deletes every key under prefix on the Redis at addr when the
// test ends (glob characters in prefix are matched literally).
func CleanupPrefix(t testing.TB, addr, prefix string) {
	t.Helper()
	t.Cleanup(func() {
		if err := deleteKeys(addr, prefix); err != nil {
			t.Errorf("testenv: deleting redis keys under %q: %v", prefix, err)
		}
	})
}

func newRedisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr})
}

// deleteKeys removes every key under prefix, with a client of its own so that
// it works even when the test closed its client.
func deleteKeys(addr, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newRedisClient(addr)
	defer c.Close()
	match := escapeGlob(prefix) + "*"
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, match, 1000).Result()
		if err != nil {
			return fmt.Errorf("scan: %w", err)
		}
		if len(keys) > 0 {
			if err := c.Unlink(ctx, keys...).Err(); err != nil {
				return fmt.Errorf("unlink: %w", err)
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// escapeGlob escapes the characters that are special in Redis glob patterns.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '\\', '*', '?', '[', ']', '^', '-':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// sharedRedis is the address Redis hands out, resolved once per test binary.
var sharedRedis struct {
	once sync.Once
	addr string
	note string // set when a fallback server is used
	err  error
}

func sharedRedisAddr() (addr, note string, err error) {
	sharedRedis.once.Do(func() {
		addr := os.Getenv("HEARTH_TEST_REDIS_ADDR")
		if addr == "" {
			addr = defaultRedisAddr
		}
		perr := pingRedis(addr, 2*time.Second)
		if perr == nil {
			sharedRedis.addr = addr
			return
		}
		srv, err := newRedisServer()
		if err != nil {
			sharedRedis.err = fmt.Errorf("shared redis at %s is not reachable (%v) and no private one could be started: %w", addr, perr, err)
			return
		}
		registerPackageServer(srv)
		sharedRedis.addr = srv.Addr
		sharedRedis.note = fmt.Sprintf("testenv: shared redis at %s is not reachable (%v); using this test binary's private redis at %s", addr, perr, srv.Addr)
	})
	return sharedRedis.addr, sharedRedis.note, sharedRedis.err
}

// pingRedis sends PING over a raw connection and expects +PONG.
func pingRedis(addr string, timeout time.Duration) error {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return fmt.Errorf("set deadline: %w", err)
	}
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return fmt.Errorf("write ping: %w", err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("read ping reply: %w", err)
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("unexpected ping reply %q", line)
	}
	return nil
}

// redisPID asks the server at addr for its process_id (INFO server) over a
// raw connection.
func redisPID(addr string, timeout time.Duration) (int, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return 0, fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return 0, fmt.Errorf("set deadline: %w", err)
	}
	if _, err := conn.Write([]byte("*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")); err != nil {
		return 0, fmt.Errorf("write info: %w", err)
	}
	r := bufio.NewReader(conn)
	head, err := r.ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("read info reply: %w", err)
	}
	head = strings.TrimSpace(head)
	if !strings.HasPrefix(head, "$") {
		return 0, fmt.Errorf("unexpected info reply %q", head)
	}
	n, err := strconv.Atoi(head[1:])
	if err != nil || n < 0 {
		return 0, fmt.Errorf("unexpected info reply %q", head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, fmt.Errorf("read info reply: %w", err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, err := strconv.Atoi(v)
			if err != nil {
				return 0, fmt.Errorf("bad process_id %q: %w", v, err)
			}
			return pid, nil
		}
	}
	return 0, errors.New("no process_id in info reply")
}

// RedisServer is a redis-server of a test's own. Its methods must be called
// from the test's goroutine.
type RedisServer struct {
	// Addr is the server's address, 127.0.0.1:Port.
	Addr string
	// Port is the server's TCP port; it stays the same across restarts.
	Port int

	bin  string
	dir  string   // working directory and log
	args []string // extra redis-server arguments (cluster, sentinel)
	conf string   // config file, for a sentinel (it rewrites it)

	mu     sync.Mutex
	proc   *proc // nil while stopped
	paused bool
}

// PrivateRedis starts a redis-server of the test's own on a free port, with
// persistence off. It is stopped at cleanup.
func PrivateRedis(t testing.TB) *RedisServer {
	t.Helper()
	s, err := newRedisServer()
	if err != nil {
		RequireServer(t, "cannot start a private redis: %v", err)
		return nil
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("testenv: stopping private redis at %s: %v", s.Addr, err)
		}
	})
	return s
}

func newRedisServer(args ...string) (*RedisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found: %w", err)
	}
	dir, err := os.MkdirTemp("", "hearth-redis-")
	if err != nil {
		return nil, fmt.Errorf("make redis dir: %w", err)
	}
	s := &RedisServer{bin: bin, dir: dir, args: args}
	// Another process may take the free port before redis binds it: retry.
	var lastErr error
	offset := 0
	if slices.Contains(args, "--cluster-enabled") {
		offset = ClusterBusOffset // its bus port must be free too
	}
	for range 5 {
		port, err := freePorts(offset)
		if err != nil {
			lastErr = err
			break
		}
		s.mu.Lock()
		err = s.startLocked(port)
		s.mu.Unlock()
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

func (s *RedisServer) logPath() string { return filepath.Join(s.dir, "redis.log") }

// startLocked starts redis-server on port and waits until it answers PING.
func (s *RedisServer) startLocked(port int) error {
	if s.proc != nil {
		return fmt.Errorf("redis at %s is already running", s.Addr)
	}
	logFile, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("open redis log: %w", err)
	}
	defer logFile.Close()
	var conf []string
	if s.conf != "" {
		conf = []string{s.conf}
	}
	cmd := exec.Command(s.bin, append(append(conf,
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", s.dir,
		"--loglevel", "warning",
	), s.args...)...)
	cmd.Dir = s.dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// SIGKILL, because a paused (SIGSTOPped) server ignores SIGTERM.
	p, err := startProc(cmd, syscall.SIGKILL)
	if err != nil {
		return err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	err = waitFor(15*time.Second, 10*time.Millisecond, p.done, func() error {
		// Check the pid too: if another server holds the port, ours exits
		// but the other one would answer PING.
		pid, err := redisPID(addr, time.Second)
		if err != nil {
			return err
		}
		if pid != p.pid() {
			return fmt.Errorf("port %d is served by another redis (pid %d)", port, pid)
		}
		return nil
	})
	if err != nil {
		note := p.exitNote()
		_ = p.kill()
		return fmt.Errorf("redis-server on port %d did not answer%s: %w%s", port, note, err, logTail(s.logPath()))
	}
	s.proc, s.paused = p, false
	s.Port, s.Addr = port, addr
	return nil
}

// Client returns a new client connected to the server, closed at cleanup.
func (s *RedisServer) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := newRedisClient(s.Addr)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop stops the server with SIGTERM (resuming it first if paused) and waits
// for it to exit. Stopping a stopped server does nothing.
func (s *RedisServer) Stop(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stopLocked(); err != nil {
		t.Fatalf("testenv: stopping redis at %s: %v", s.Addr, err)
	}
}

func (s *RedisServer) stopLocked() error {
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc, s.paused = nil, false
	// A stopped process does not act on SIGTERM until it is continued.
	if err := p.signal(syscall.SIGCONT); err != nil {
		return err
	}
	if err := p.signal(syscall.SIGTERM); err != nil {
		return err
	}
	if p.wait(15 * time.Second) {
		return nil
	}
	if err := p.kill(); err != nil {
		return err
	}
	return fmt.Errorf("redis-server did not exit on SIGTERM and was killed%s", logTail(s.logPath()))
}

// Start starts the stopped server again on the same port and waits until it
// answers PING. The new server has a new run_id and no data.
func (s *RedisServer) Start(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.startLocked(s.Port); err != nil {
		t.Fatalf("testenv: starting redis again on port %d: %v", s.Port, err)
	}
}

// Restart stops and starts the server on the same port: it comes back with a
// new run_id and empty data.
func (s *RedisServer) Restart(t testing.TB) {
	t.Helper()
	s.Stop(t)
	s.Start(t)
}

// RestartTimed restarts the server like [RedisServer.Restart], staying
// stopped for down first, and returns when it accepted connections again: the
// first PING answered on a new connection, dialled every millisecond from the
// moment it stopped (a pooled client would back off its own dials and see it
// later).
func (s *RedisServer) RestartTimed(t testing.TB, down time.Duration) time.Time {
	t.Helper()
	s.Stop(t)
	up, addr := make(chan time.Time, 1), s.Addr // read before Start rewrites it
	go func() { up <- firstPong(addr, time.Minute+down) }()
	time.Sleep(down)
	s.Start(t)
	return <-up
}

// StartTimed starts a stopped server like [RedisServer.Start] and returns
// when it accepted connections again, as [RedisServer.RestartTimed] times it.
func (s *RedisServer) StartTimed(t testing.TB) time.Time {
	t.Helper()
	up, addr := make(chan time.Time, 1), s.Addr
	go func() { up <- firstPong(addr, time.Minute) }()
	s.Start(t)
	return <-up
}

// firstPong dials addr every millisecond, each time on a new connection,
// until a PING is answered or timeout passes, and returns when that was.
func firstPong(addr string, timeout time.Duration) time.Time {
	buf := make([]byte, len("+PONG\r\n"))
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			continue
		}
		_ = c.SetDeadline(time.Now().Add(100 * time.Millisecond))
		_, err = c.Write([]byte("PING\r\n"))
		if err == nil {
			_, err = io.ReadFull(c, buf)
		}
		_ = c.Close()
		if err == nil && string(buf) == "+PONG\r\n" {
			return time.Now()
		}
	}
	return time.Now()
}

// Pause freezes the server with SIGSTOP: connections are still accepted by
// the kernel but no command is answered until [RedisServer.Resume].
func (s *RedisServer) Pause(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		t.Fatalf("testenv: pausing redis at %s: it is not running", s.Addr)
	}
	if err := s.proc.signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("testenv: pausing redis at %s: %v", s.Addr, err)
	}
	if err := waitState(s.proc.pid(), "T", false); err != nil {
		t.Fatalf("testenv: pausing redis at %s: %v", s.Addr, err)
	}
	s.paused = true
}

// Resume continues a paused server with SIGCONT.
func (s *RedisServer) Resume(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		t.Fatalf("testenv: resuming redis at %s: it is not running", s.Addr)
	}
	if err := s.proc.signal(syscall.SIGCONT); err != nil {
		t.Fatalf("testenv: resuming redis at %s: %v", s.Addr, err)
	}
	if err := waitState(s.proc.pid(), "T", true); err != nil {
		t.Fatalf("testenv: resuming redis at %s: %v", s.Addr, err)
	}
	s.paused = false
}

// stop stops the server and removes its directory.
func (s *RedisServer) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.stopLocked()
	if rerr := os.RemoveAll(s.dir); rerr != nil && err == nil {
		err = fmt.Errorf("remove %s: %w", s.dir, rerr)
	}
	return err
}

// CommandCalls is how many times the Redis behind rdb ran each of cmds (lower
// case, as INFO names them), from INFO commandstats; a command never run is
// absent.
func CommandCalls(t testing.TB, rdb *redis.Client, cmds ...string) map[string]int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("testenv: INFO commandstats: %v", err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		for _, c := range cmds {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+c+":calls="); ok {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				out[c] = n
			}
		}
	}
	return out
}
