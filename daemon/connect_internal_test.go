package daemon

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/internal/neterr"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// TestRedialRefused: with the port closed for good a dial fails with the
// refusal after refusedFor, not sooner and not much later; a dial refused a
// few times is dialled again until it connects; any other dial error is
// returned at once.
func TestRedialRefused(t *testing.T) {
	var d net.Dialer
	dial := redialRefused(d.DialContext)
	ctx := context.Background()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()

	t0 := time.Now()
	_, err = dial(ctx, "tcp", addr)
	if took := time.Since(t0); !errors.Is(err, syscall.ECONNREFUSED) || took < refusedFor-50*time.Millisecond || took > refusedFor+time.Second {
		t.Errorf("dial of a closed port: %v after %v, want connection refused after about %v", err, took, refusedFor)
	}

	// Known down: the next dial tries once, and a dial that connects ends that.
	t0 = time.Now()
	if _, err = dial(ctx, "tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) || time.Since(t0) > refusedFor/2 {
		t.Errorf("dial while known down: %v after %v, want connection refused at once", err, time.Since(t0))
	}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial of a listening port while known down: %v", err)
	}
	_ = conn.Close()
	_ = ln.Close()
	t0 = time.Now()
	if _, err = dial(ctx, "tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) || time.Since(t0) < refusedFor-50*time.Millisecond {
		t.Errorf("dial after a connection: %v after %v, want the redial window again", err, time.Since(t0))
	}

	refusals := 0
	conn, err = redialRefused(func(context.Context, string, string) (net.Conn, error) {
		if refusals < 5 {
			refusals++
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		}
		c, _ := net.Pipe()
		return c, nil
	})(ctx, "tcp", addr)
	if err != nil || refusals != 5 {
		t.Fatalf("dial refused 5 times, then accepted: %v after %d refusals, want a connection", err, refusals)
	}
	_ = conn.Close()

	boom := errors.New("no route")
	calls := 0
	_, err = redialRefused(func(context.Context, string, string) (net.Conn, error) { calls++; return nil, boom })(ctx, "tcp", addr)
	if !errors.Is(err, boom) || calls != 1 {
		t.Errorf("other dial error: %v after %d calls, want it at once", err, calls)
	}
}

// TestRefusedKeepsDialling: a single node's client refused many more times
// than its pool size (go-redis stops dialling after PoolSize failed dials and
// probes once a second) fails each command with the refusal, counted as a
// connection failure, and the first command after Redis accepts connections
// again succeeds.
func TestRefusedKeepsDialling(t *testing.T) {
	srv := testenv.PrivateRedis(t)
	rdb := NewRedis(config.Redis{Addrs: []string{srv.Addr}, PoolSize: 2, DialTimeout: 2 * time.Second,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	srv.Stop(t)
	for i := range 20 {
		err := rdb.Ping(ctx).Err()
		if !neterr.Is(err) || !strings.Contains(err.Error(), srv.Addr) {
			t.Fatalf("ping %d while Redis is down: %v, want the refused dial of %s", i, err, srv.Addr)
		}
	}
	srv.Start(t)
	testenv.Eventually(t, 10*time.Second, "redis accepts connections", func() bool {
		c, err := net.Dial("tcp", srv.Addr)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Errorf("first ping once Redis accepts connections again: %v", err)
	}
}

// TestAnsweredDial: a connection accepted and closed before any reply (a
// proxy in front of a Redis that is down) is a refused dial, which
// redialRefused dials again until Redis answers; any reply, an error
// included, is an answer; a server slower than probeWait is handed over as
// connected; and the probe's reply is never left for go-redis to read.
func TestAnsweredDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var mode atomic.Value // what the server does with a connection
	mode.Store("close")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, len(pingCommand))
				switch mode.Load() {
				case "close":
					return
				case "slow":
					if _, err := io.ReadFull(c, buf); err == nil {
						time.Sleep(3 * probeWait)
						_, _ = io.WriteString(c, "+PONG\r\n+NEXT\r\n")
						time.Sleep(time.Second)
					}
				case "noauth":
					if _, err := io.ReadFull(c, buf); err == nil {
						_, _ = io.WriteString(c, "-NOAUTH Authentication required.\r\n+NEXT\r\n")
						time.Sleep(time.Second)
					}
				case "pong":
					if _, err := io.ReadFull(c, buf); err == nil && string(buf) == pingCommand {
						_, _ = io.WriteString(c, "+PONG\r\n+NEXT\r\n")
						time.Sleep(time.Second)
					}
				}
			}()
		}
	}()
	var d net.Dialer
	ctx := context.Background()
	addr := ln.Addr().String()

	_, err = answered(d.DialContext, time.Second)(ctx, "tcp", addr)
	var op *net.OpError
	closed := errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
	if !errors.Is(err, syscall.ECONNREFUSED) || !closed || !errors.As(err, &op) || !neterr.IsRefused(err) {
		t.Fatalf("accepted and closed: %v, want a refused dial (a *net.OpError) that keeps its cause (EOF or reset)", err)
	}

	// Closed for a while, then answering: redialRefused dials until it answers.
	dial := redialRefused(answered(d.DialContext, time.Second))
	time.AfterFunc(100*time.Millisecond, func() { mode.Store("pong") })
	t0 := time.Now()
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("closed for 100ms, then answering: %v after %v, want a connection", err, time.Since(t0))
	}
	if took := time.Since(t0); took < 100*time.Millisecond {
		t.Errorf("closed for 100ms, then answering: connected after %v, before it answered", took)
	}
	readsNext(t, conn, "after the probe")

	mode.Store("noauth")
	conn, err = answered(d.DialContext, time.Second)(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("an error reply is an answer: %v", err)
	}
	readsNext(t, conn, "after the probe's error reply")

	// No dial timeout set (0, as go-redis's own default leaves it): the
	// probe still waits probeWait, not nothing.
	mode.Store("pong")
	conn, err = answered(d.DialContext, 0)(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial timeout 0: %v, want the connection", err)
	}
	readsNext(t, conn, "dial timeout 0")

	// A server slower than probeWait (paused, busy) is not a refusal: the
	// connection is handed over, and the late PONG is not read as the reply
	// to go-redis's first command.
	mode.Store("slow")
	t0 = time.Now()
	conn, err = answered(d.DialContext, time.Second)(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("a server slower than probeWait: %v, want the connection", err)
	}
	if took := time.Since(t0); took > 3*probeWait {
		t.Errorf("a server slower than probeWait: connected after %v, want about probeWait (%v)", took, probeWait)
	}
	readsNext(t, conn, "after a late PONG")
}

// readsNext checks that conn's next read is what the server sent after its
// reply to the probe's PING, then closes it.
func readsNext(t *testing.T, conn net.Conn, when string) {
	t.Helper()
	line := make([]byte, len("+NEXT\r\n"))
	if _, err := io.ReadFull(conn, line); err != nil || string(line) != "+NEXT\r\n" {
		t.Errorf("%s the connection reads %q, %v: want what follows the reply to PING", when, line, err)
	}
	_ = conn.Close()
}
