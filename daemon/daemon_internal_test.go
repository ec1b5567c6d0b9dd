package daemon

import (
	"context"
	"errors"
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
