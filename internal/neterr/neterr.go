// Package neterr is Hearth's one classifier of connection failures: an error
// that says the other end (Redis, PostgreSQL, an HTTP origin) could not be
// reached, dropped or refused the connection, or did not answer in time, as
// opposed to an answer Hearth did not expect. The lease, the origin
// protection's retries, the Cluster topology hook and the re-warm watch all
// ask it, so that they agree on what a network error is.
package neterr

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Is reports whether err is a connection failure:
//   - a net.Error anywhere in its chain: a dial, read or write error
//     (*net.OpError), a deadline (context.DeadlineExceeded and
//     os.ErrDeadlineExceeded are net.Errors), and every syscall.Errno
//     (ECONNREFUSED, ECONNRESET, EPIPE, ECONNABORTED …), which is one too;
//   - io.EOF or io.ErrUnexpectedEOF: the peer closed the connection mid-reply;
//   - redis.ErrClosed: the client's pool was closed under the call;
//   - an error whose text says "connection refused" (one that lost its type
//     on the way, as a Redis Cluster redirection's can).
//
// A cancelled context is not one (the caller gave up; nothing is wrong with
// the peer), even when a network error is wrapped with it.
func Is(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, redis.ErrClosed) {
		return true
	}
	return strings.Contains(err.Error(), "connection refused")
}

// IsRefused reports whether err says the peer's host answered that nothing
// listens on the port (ECONNREFUSED, or its text when the type was lost): a
// server restarting, not one that is slow or unreachable. Such a dial costs
// the peer nothing and fails at once, so a caller may try again soon, where
// it backs off after a timeout.
func IsRefused(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(err.Error(), "connection refused")
}

// IsTimeout is the narrower question a reader of a live connection asks: did
// a read wait out its deadline (a net.Error whose Timeout is true, a context
// deadline included)? A quiet subscription times out so; a dropped one fails
// with another error, which Is still counts as a connection failure.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// IsTopology reports whether err says the node that was asked is gone or no
// longer serves the slot — a connection failure (Is), or a Redis reply
// CLUSTERDOWN, TRYAGAIN, MASTERDOWN or LOADING (a master failing over) — as
// opposed to an answer. The Cluster client's slot-map reload and the lease's
// failover grace ask it.
func IsTopology(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return false
	}
	if Is(err) {
		return true
	}
	s := err.Error()
	for _, p := range []string{"CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "LOADING"} {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
