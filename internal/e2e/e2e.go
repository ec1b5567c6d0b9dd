// Package e2e runs the real hearth binary in tests: it builds it once per test
// binary, starts processes with a config, signals them, and reads their metrics.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/testenv"
)

// Binary builds cmd/hearth once (with the race detector when the tests use it)
// and returns its path, or returns $HEARTH_BIN when that is set.
func Binary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("HEARTH_BIN"); bin != "" {
		return bin // a binary built elsewhere: a release, or another commit to compare with
	}
	return Build(t, "./cmd/hearth")
}

// CPUTime is the user plus system CPU time process pid has used (Linux /proc).
func CPUTime(t testing.TB, pid int) time.Duration {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration((utime + stime) / ticks * float64(time.Second))
}

type build struct {
	once sync.Once
	path string
	err  error
}

var (
	buildsMu sync.Mutex
	builds   = map[string]*build{}
	// buildDirs holds one directory per race setting, so that the binaries
	// built alike lie side by side, as make and a release put them: hearth
	// finds hearth-demo next to itself.
	buildDirs = map[bool]string{}
)

// Build builds the main package pkg (a path from the module's root, such as
// "./cmd/hearth") once per test binary, with the race detector when the tests
// use it, and returns the executable's path.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	return buildWith(t, pkg, raceEnabled)
}

// BuildPlain builds the main package pkg without the race detector, whatever
// the tests use: for harnesses such as a load generator, whose goroutines
// would exceed the race detector's limit (8,128) or whose speed matters.
func BuildPlain(t testing.TB, pkg string) string {
	t.Helper()
	return buildWith(t, pkg, false)
}

func buildWith(t testing.TB, pkg string, race bool) string {
	t.Helper()
	id := fmt.Sprintf("%s race=%v", pkg, race)
	buildsMu.Lock()
	bd := builds[id]
	if bd == nil {
		bd = &build{}
		builds[id] = bd
	}
	dir, ok := buildDirs[race]
	if !ok {
		var err error
		if dir, err = os.MkdirTemp("", "hearth-e2e-"); err != nil {
			buildsMu.Unlock()
			t.Fatalf("build %s: %v", pkg, err)
		}
		buildDirs[race] = dir
	}
	buildsMu.Unlock()
	bd.once.Do(func() {
		bd.path = filepath.Join(dir, filepath.Base(pkg))
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		args := []string{"build", "-o", bd.path}
		if race {
			args = append(args, "-race")
		}
		args = append(args, pkg)
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			bd.err = fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
		}
	})
	if bd.err != nil {
		t.Fatalf("build %s: %v", pkg, bd.err)
	}
	return bd.path
}

// Proc is a running hearth process.
type Proc struct {
	Cmd    *exec.Cmd
	mu     sync.Mutex
	output bytes.Buffer
	done   chan struct{}
	err    error
}

// Start runs the binary with args and extra environment ("K=V"); the process
// is killed at cleanup if still running.
func Start(t testing.TB, args []string, env ...string) *Proc {
	t.Helper()
	return StartBinary(t, Binary(t), args, env...)
}

// PlainBinary is $HEARTH_BIN when set, else cmd/hearth built without the race
// detector: for tests that bound latency or the daemon's own CPU from outside,
// which the detector's 5-10x slowdown would measure instead of Hearth.
func PlainBinary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("HEARTH_BIN"); bin != "" {
		return bin
	}
	return BuildPlain(t, "./cmd/hearth")
}

// WithDemo makes sure hearth-demo lies next to the hearth binary bin (from
// Binary or PlainBinary), as `hearth demo` needs: it builds cmd/hearth-demo
// alike, or, when bin is $HEARTH_BIN, requires the one installed next to it.
func WithDemo(t testing.TB, bin string) {
	t.Helper()
	next := filepath.Join(filepath.Dir(bin), "hearth-demo")
	if os.Getenv("HEARTH_BIN") != "" {
		if _, err := os.Stat(next); err != nil {
			t.Fatalf("HEARTH_BIN=%s: hearth demo needs hearth-demo next to it: %v", bin, err)
		}
		return
	}
	buildsMu.Lock()
	race := buildDirs[true] == filepath.Dir(bin)
	buildsMu.Unlock()
	if got := buildWith(t, "./cmd/hearth-demo", race); got != next {
		t.Fatalf("hearth-demo built at %s, not next to %s", got, bin)
	}
}

// StartBinary is Start with the binary at bin.
func StartBinary(t testing.TB, bin string, args []string, env ...string) *Proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	p := &Proc{Cmd: cmd, done: make(chan struct{})}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatalf("start hearth: %v", err)
	}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.output.Write(sc.Bytes())
			p.output.WriteByte('\n')
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, pr) // a line over the buffer: keep the pipe drained
	}()
	go func() {
		p.err = cmd.Wait()
		_ = pw.Close()
		<-copied // Output is complete once Wait reports the exit
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("hearth %v output:\n%s", args, p.Output())
		}
	})
	return p
}

// Output returns everything the process wrote so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.output.String()
}

// Signal sends sig to the process.
func (p *Proc) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// Wait waits up to d for the process to exit and returns its exit code.
func (p *Proc) Wait(t testing.TB, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("hearth did not exit within %s", d)
	}
	if p.err == nil {
		return 0
	}
	if ee, ok := p.err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	t.Fatalf("wait: %v", p.err)
	return -1
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// FreeAddr returns a free 127.0.0.1:port.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// WaitHTTP polls url until it answers want, or fails the test after d.
func WaitHTTP(t testing.TB, url string, want int, d time.Duration) {
	t.Helper()
	waitHTTP(t, nil, url, want, d)
}

// WaitHTTP is the package's WaitHTTP for a URL this process serves: it fails
// the test as soon as the process exits (a refused config, say) instead of
// polling out the whole of d, and the test's clean-up prints its output.
func (p *Proc) WaitHTTP(t testing.TB, url string, want int, d time.Duration) {
	t.Helper()
	waitHTTP(t, p, url, want, d)
}

func waitHTTP(t testing.TB, p *Proc, url string, want int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	var last string
	for time.Now().Before(deadline) {
		if p != nil && p.Exited() {
			t.Fatalf("%s: hearth %v exited (%v) before it answered %d (last: %s)", url, p.Cmd.Args[1:], p.err, want, last)
		}
		resp, err := http.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == want {
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s did not answer %d within %s (last: %s)", url, want, d, last)
}

// Metrics scrapes a /metrics endpoint into series name{labels} → value.
func Metrics(t testing.TB, url string) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out
}

// Sum adds every series of a metric whose labels contain all the given
// name="value" pairs.
func Sum(m map[string]float64, name string, labels ...string) float64 {
	var total float64
	for series, v := range m {
		base, rest, _ := strings.Cut(series, "{")
		if base != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				ok = false
				break
			}
		}
		if ok {
			total += v
		}
	}
	return total
}

// Namespace returns a fresh redis.namespace for one Hearth run and deletes every
// key under it at cleanup: Hearth's own keys (lease, epoch, fences, markers)
// live there, outside the test's key prefix.
func Namespace(t testing.TB, c *redis.Client) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ns := "hearth-" + hex.EncodeToString(b)
	testenv.CleanupPrefix(t, c.Options().Addr, ns+":")
	return ns
}
