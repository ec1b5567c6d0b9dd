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

	refusals := 0
	conn, err := redialRefused(func(context.Context, string, string) (net.Conn, error) {
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
