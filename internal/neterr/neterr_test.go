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
	}{
		{"nil", nil, false, false},
		{"dial refused", dial, true, false},
		{"wrapped dial refused", fmt.Errorf("acquire lease h:{lease}: %w", dial), true, false},
		{"read reset", read, true, false},
		{"read timeout", timeout, true, true},
		{"bare ECONNREFUSED", syscall.ECONNREFUSED, true, false},
		{"bare ECONNRESET", syscall.ECONNRESET, true, false},
		{"bare EPIPE", syscall.EPIPE, true, false},
		{"bare ECONNABORTED", syscall.ECONNABORTED, true, false},
		{"EOF", io.EOF, true, false},
		{"unexpected EOF", fmt.Errorf("read reply: %w", io.ErrUnexpectedEOF), true, false},
		{"context deadline", fmt.Errorf("load: %w", context.DeadlineExceeded), true, true},
		{"os deadline", os.ErrDeadlineExceeded, true, true},
		{"redis client closed", redis.ErrClosed, true, false},
		{"refused as text", errors.New("dial tcp 127.0.0.1:7001: connect: connection refused"), true, false},
		{"cancelled", context.Canceled, false, false},
		{"cancelled around a dial error", fmt.Errorf("%w: %w", context.Canceled, dial), false, false},
		{"redis nil", redis.Nil, false, false},
		{"redis error reply", errors.New("ERR unknown command"), false, false},
		{"noscript", errors.New("NOSCRIPT No matching script"), false, false},
		{"clusterdown", errors.New("CLUSTERDOWN The cluster is down"), false, false},
		{"a bad payload", errors.New("decode row: unexpected end of JSON input"), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := neterr.Is(tc.err); got != tc.conn {
				t.Errorf("Is(%v) = %v, want %v", tc.err, got, tc.conn)
			}
			if got := neterr.IsTimeout(tc.err); got != tc.timeout {
				t.Errorf("IsTimeout(%v) = %v, want %v", tc.err, got, tc.timeout)
			}
		})
	}
}
