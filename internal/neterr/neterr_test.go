package neterr_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/neterr"
)

func TestIs(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	read := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	for _, tc := range []struct {
		name          string
		err           error
		conn, timeout bool
		refused       bool
	}{
		{"nil", nil, false, false, false},
		{"dial refused", dial, true, false, true},
		{"wrapped dial refused", fmt.Errorf("acquire lease h:{lease}: %w", dial), true, false, true},
		{"read reset", read, true, false, false},
		{"read timeout", timeout, true, true, false},
		{"bare ECONNREFUSED", syscall.ECONNREFUSED, true, false, true},
		{"bare ECONNRESET", syscall.ECONNRESET, true, false, false},
		{"bare EPIPE", syscall.EPIPE, true, false, false},
		{"bare ECONNABORTED", syscall.ECONNABORTED, true, false, false},
		{"EOF", io.EOF, true, false, false},
		{"unexpected EOF", fmt.Errorf("read reply: %w", io.ErrUnexpectedEOF), true, false, false},
		{"context deadline", fmt.Errorf("load: %w", context.DeadlineExceeded), true, true, false},
		{"os deadline", os.ErrDeadlineExceeded, true, true, false},
		{"redis client closed", redis.ErrClosed, true, false, false},
		{"refused as text", errors.New("dial tcp 127.0.0.1:7001: connect: connection refused"), true, false, true},
		{"cancelled", context.Canceled, false, false, false},
		{"cancelled around a dial error", fmt.Errorf("%w: %w", context.Canceled, dial), false, false, false},
		{"redis nil", redis.Nil, false, false, false},
		{"redis error reply", errors.New("ERR unknown command"), false, false, false},
		{"noscript", errors.New("NOSCRIPT No matching script"), false, false, false},
		{"clusterdown", errors.New("CLUSTERDOWN The cluster is down"), false, false, false},
		{"a bad payload", errors.New("decode row: unexpected end of JSON input"), false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := neterr.Is(tc.err); got != tc.conn {
				t.Errorf("Is(%v) = %v, want %v", tc.err, got, tc.conn)
			}
			if got := neterr.IsTimeout(tc.err); got != tc.timeout {
				t.Errorf("IsTimeout(%v) = %v, want %v", tc.err, got, tc.timeout)
			}
			if got := neterr.IsRefused(tc.err); got != tc.refused {
				t.Errorf("IsRefused(%v) = %v, want %v", tc.err, got, tc.refused)
			}
		})
	}
}
