package testenv

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Main runs the tests and stops private servers started for the package.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// It exits the process with the tests' exit code.
func Main(m *testing.M) {
	code := m.Run()
	if err := stopPackageServers(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: stopping package servers: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// RequireServer fails the test, with the message, unless skipping was asked
// for with HEARTH_ALLOW_SKIP=1 (and CI is not "true"): then it skips.
//
// Use it when a test needs a server and cannot get one. A missing server is a
// broken environment (`make test` installs and starts what the suite needs,
// see scripts/test-deps); letting it pass as a skip would make a bare machine's
// run green and hollow, so a skip is opt-in.
func RequireServer(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	switch {
	case inCI():
		t.Fatalf("testenv: %s (CI=true, so a missing server is a failure, not a skip)", msg)
	case allowSkip():
		t.Skipf("testenv: %s (skipping: HEARTH_ALLOW_SKIP=1)", msg)
	default:
		t.Fatalf("testenv: %s (a missing server is a failure; run `make test`, which installs and starts the servers, or set HEARTH_ALLOW_SKIP=1 to skip)", msg)
	}
}

// allowSkip tells whether tests may skip when a server is missing.
func allowSkip() bool { return os.Getenv("HEARTH_ALLOW_SKIP") == "1" }

func inCI() bool { return os.Getenv("CI") == "true" }

// package-level servers started as fallbacks, stopped by Main.
var (
	pkgMu      sync.Mutex
	pkgServers []interface{ stop() error }
)

func registerPackageServer(s interface{ stop() error }) {
	pkgMu.Lock()
	defer pkgMu.Unlock()
	pkgServers = append(pkgServers, s)
}

func stopPackageServers() error {
	pkgMu.Lock()
	servers := pkgServers
	pkgServers = nil
	pkgMu.Unlock()
	var errs []error
	for _, s := range servers {
		if err := s.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// FreePort returns a free TCP port on 127.0.0.1.
//
// The port is chosen below the kernel's ephemeral port range, so outgoing
// connections never take it, and it is not handed out twice by one process.
// Another process can still bind it before the caller does; servers started
// by this package retry with another port when that happens.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatalf("testenv: finding a free port: %v", err)
	}
	return port
}

var (
	portsMu sync.Mutex
	issued  = map[int]bool{}
)

func freePort() (int, error) { return freePorts(0) }

// ClusterBusOffset is how far above its port a Redis Cluster node listens
// for its cluster bus.
const ClusterBusOffset = 10000

// FreeClusterPort returns a free port for a Redis Cluster node: both it and
// its bus port (ClusterBusOffset above) are free and below the ephemeral
// range, where an outgoing connection could otherwise hold the bus port and
// keep the node from starting.
func FreeClusterPort(t testing.TB) int {
	t.Helper()
	port, err := freePorts(ClusterBusOffset)
	if err != nil {
		t.Fatalf("testenv: finding a free cluster port: %v", err)
	}
	return port
}

// freePorts finds a port that is free, and, with offset > 0, whose
// port+offset is free too, both below the ephemeral range.
func freePorts(offset int) (int, error) {
	lo, hi := 10000, ephemeralLow()-offset
	if hi-lo < 1000 {
		if offset > 0 {
			return 0, fmt.Errorf("no room below the ephemeral range (from %d) for a port and its port+%d", ephemeralLow(), offset)
		}
		// A strange ephemeral range; let the kernel choose.
		return kernelPort()
	}
	free := func(port int) bool {
		if issued[port] {
			return false
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return false
		}
		_ = l.Close()
		return true
	}
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(hi-lo)))
		if err != nil {
			return 0, fmt.Errorf("random port: %w", err)
		}
		port := lo + int(n.Int64())
		if !free(port) || offset > 0 && !free(port+offset) {
			continue
		}
		issued[port] = true
		if offset > 0 {
			issued[port+offset] = true
		}
		return port, nil
	}
	if offset > 0 {
		return 0, fmt.Errorf("no free port with a free port+%d after 200 tries", offset)
	}
	return kernelPort()
}

func kernelPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("listen on 127.0.0.1:0: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow returns the lowest port of the kernel's ephemeral range.
func ephemeralLow() int {
	f, err := os.Open("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 32768
	}
	fields := strings.Fields(sc.Text())
	if len(fields) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(fields[0])
	if err != nil {
		return 32768
	}
	return n
}

// randomHex returns n random bytes as lower-case hex.
func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("testenv: crypto/rand: %v", err))
	}
	return hex.EncodeToString(b)
}

// sanitize keeps ASCII letters, digits and underscores of s, maps every other
// run of characters to one underscore and cuts the result to max bytes.
func sanitize(s string, max int) string {
	var b strings.Builder
	under := false
	for _, r := range s {
		ok := r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
		if !ok {
			if !under {
				b.WriteByte('_')
				under = true
			}
			continue
		}
		b.WriteRune(r)
		under = r == '_'
	}
	out := strings.Trim(b.String(), "_")
	if len(out) > max {
		out = strings.TrimRight(out[:max], "_")
	}
	if out == "" {
		out = "x"
	}
	return out
}

// waitFor polls cond every interval until it returns nil, done is closed or
// timeout passes; it returns the last error.
func waitFor(timeout, interval time.Duration, done <-chan struct{}, cond func() error) error {
	deadline := time.Now().Add(timeout)
	err := errors.New("not tried")
	for {
		select {
		case <-done:
			return fmt.Errorf("process exited: %w", err)
		default:
		}
		if err = cond(); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up after %v: %w", timeout, err)
		}
		select {
		case <-done:
			return fmt.Errorf("process exited: %w", err)
		case <-time.After(interval):
		}
	}
}

// Eventually polls cond every 20ms until it holds, or fails the test after d,
// naming what it waited for.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
