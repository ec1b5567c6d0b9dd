package daemon

import (
	"context"
	"errors"
	"net"
	"strings"
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
