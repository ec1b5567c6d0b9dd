package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// TestCleanupsRunInReverse: what setup opened is closed last-opened first, on
// every return, every step runs even after one fails, and their errors join.
func TestCleanupsRunInReverse(t *testing.T) {
	var (
		undo cleanups
		ran  []string
	)
	errSources := errors.New("close sources")
	errHTTP := errors.New("close http")
	undo.push(func(context.Context) error { ran = append(ran, "redis"); return nil })
	undo.push(func(context.Context) error { ran = append(ran, "sources"); return errSources })
	undo.push(func(context.Context) error { ran = append(ran, "http"); return errHTTP })
	err := undo.run(context.Background())
	if want := []string{"http", "sources", "redis"}; !slices.Equal(ran, want) {
		t.Errorf("ran %v, want %v", ran, want)
	}
	if !errors.Is(err, errSources) || !errors.Is(err, errHTTP) {
		t.Errorf("run = %v, want both errors", err)
	}
	ran = nil
	if err := undo.run(context.Background()); err != nil || len(ran) != 0 {
		t.Errorf("a second run ran %v (%v): each step must run once", ran, err)
	}
}

// TestAbandoned: running out of the drain deadline is expected at shutdown;
// any other close error, alone or joined with deadline errors, is a failure.
func TestAbandoned(t *testing.T) {
	refused := errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	deadline := context.DeadlineExceeded
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"the drain deadline", deadline, true},
		{"a wrapped deadline", fmt.Errorf("close http: %w", deadline), true},
		{"the scheduler's drain", fmt.Errorf("close scheduler: %w", errors.Join(fmt.Errorf("drain: %w", deadline), nil)), true},
		{"deadlines joined", errors.Join(fmt.Errorf("close http: %w", deadline), fmt.Errorf("lease: close: %w", deadline)), true},
		{"a refused release", fmt.Errorf("release lease: %w", refused), false},
		{"a refused release among deadlines", errors.Join(fmt.Errorf("close http: %w", deadline), fmt.Errorf("release lease: %w", refused)), false},
		{"a wrapped join hiding a failure", fmt.Errorf("close scheduler: %w", errors.Join(fmt.Errorf("drain: %w", deadline), refused)), false},
		{"a listener close error", fmt.Errorf("close http: %w", errors.New("close tcp 127.0.0.1:9464: use of closed network connection")), false},
		{"cancelled, not timed out", context.Canceled, false},
	} {
		if got := abandoned(c.err); got != c.want {
			t.Errorf("%s: abandoned(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
