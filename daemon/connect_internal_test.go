package daemon

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
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
