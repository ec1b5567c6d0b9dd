package main_test

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/testenv"
)

// TestShutdownFailureExitsNonZero: a close step that fails for a real reason
// makes `hearth run` exit 1, naming it. Here Redis is gone when SIGTERM comes,
// while the leader's term is still valid (a 30s lease), so giving the lease up
// is refused by the network, not cut short by a deadline: the standby would
// have to wait for the lease to expire, and the exit code says so.
func TestShutdownFailureExitsNonZero(t *testing.T) {
	srv := testenv.PrivateRedis(t)
	up := newUpstream(t)
	tm := timing{ttl: 120 * time.Second, interval: 60 * time.Second, loadTimeout: time.Second, lease: 30 * time.Second, retry: 250 * time.Millisecond}
	s := newSetup(t, srv.Addr, srv.Client(t), "", up, tm)
	a := s.start(t, "a")
	leading(t, a, 30*time.Second)

	srv.Stop(t)
	a.proc.Signal(t, syscall.SIGTERM)
	if code := a.proc.Wait(t, 30*time.Second); code != 1 {
		t.Errorf("exit code %d after SIGTERM with the lease release refused, want 1", code)
	}
	srv.Start(t) // for the namespace's cleanup
	out := a.proc.Output()
	if !strings.Contains(out, "hearth: shutdown: release lease") || !strings.Contains(out, "shutdown failed") {
		t.Errorf("the error does not name the failed release:\n%s", out)
	}
}

// TestShutdownDeadlineExitsZero: a write still in flight at
// refresh.shutdown_timeout is abandoned, which is expected: logged, exit 0.
func TestShutdownDeadlineExitsZero(t *testing.T) {
	// The load timeout outlasts the 1s shutdown timeout: only the drain
	// deadline ends the held load.
	tm := timing{ttl: 30 * time.Second, interval: 6 * time.Second, loadTimeout: 5 * time.Second, lease: 2 * time.Second, retry: 250 * time.Millisecond}
	a := leaderWithLoadInFlight(t, tm, "1s")
	a.proc.Signal(t, syscall.SIGTERM)
	if code := a.proc.Wait(t, 30*time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM with a write in flight past the deadline, want 0", code)
	}
	out := a.proc.Output()
	if !strings.Contains(out, "in-flight writes abandoned") {
		t.Errorf("the abandoned write is not logged:\n%s", out)
	}
	if strings.Contains(out, "shutdown failed") {
		t.Errorf("an abandoned write was reported as a failure:\n%s", out)
	}
}

// TestSecondSignalAbortsDrain: a write held in flight keeps the first SIGTERM's
// drain waiting (the shutdown timeout is long); the second signal makes the
// daemon abandon the drain itself (cmd/hearth closes its abort channel) and
// exit 1 saying so, well before the shutdown timeout.
func TestSecondSignalAbortsDrain(t *testing.T) {
	tm := timing{ttl: 60 * time.Second, interval: 6 * time.Second, loadTimeout: 25 * time.Second, lease: 2 * time.Second, retry: 250 * time.Millisecond}
	a := leaderWithLoadInFlight(t, tm, "30s")
	a.proc.Signal(t, syscall.SIGTERM)
	time.Sleep(500 * time.Millisecond) // draining, held by the load
	start := time.Now()
	a.proc.Signal(t, syscall.SIGTERM)
	if code := a.proc.Wait(t, 20*time.Second); code != 1 {
		t.Errorf("exit code %d after a second SIGTERM, want 1", code)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("exited %s after the second signal, want at once", took)
	}
	if out := a.proc.Output(); !strings.Contains(out, "aborted by a second signal") {
		t.Errorf("the daemon did not abort its drain itself:\n%s", out)
	}
}

// leaderWithLoadInFlight starts one leader with refresh.shutdown_timeout set
// to shutdown and returns once a scheduled load is held at the origin (until
// the test ends).
func leaderWithLoadInFlight(t *testing.T, tm timing, shutdown string) *node {
	t.Helper()
	env := testenv.Redis(t)
	up := newUpstream(t)
	s := newSetup(t, env.Addr, env.Client, env.Prefix, up, tm)
	cfg, err := os.ReadFile(s.config)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(cfg), "shutdown_timeout: 5s", "shutdown_timeout: "+shutdown, 1)
	if edited == string(cfg) {
		t.Fatal("no shutdown_timeout in the test config")
	}
	if err := os.WriteFile(s.config, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	a := s.start(t, "a")
	leading(t, a, 30*time.Second)
	arrived, release := up.holdNext()
	t.Cleanup(release)
	select {
	case <-arrived:
	case <-time.After(3 * tm.interval):
		t.Fatal("no scheduled load reached the origin")
	}
	return a
}
