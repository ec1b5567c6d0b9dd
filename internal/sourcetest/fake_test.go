package sourcetest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/sourcetest"
	"github.com/hearth-dev/hearth/warmer"
)

var spec = &warmer.Spec{Name: "p"}

// TestFakeConforms: the fake keeps the contract it stands in for.
func TestFakeConforms(t *testing.T) {
	sourcetest.Conformance(t, sourcetest.Backend{
		Name: "fake",
		New: func(t *testing.T, values map[string][]byte, delay time.Duration) (warmer.Source, *warmer.Spec) {
			f := sourcetest.New("fake")
			f.SetAll(values)
			f.SetDelay(delay)
			return f, spec
		},
		Single: func(t *testing.T, value []byte) (warmer.Source, *warmer.Spec) {
			f := sourcetest.New("fake")
			f.Set("", value)
			return f, spec
		},
		Down: func(t *testing.T) (warmer.Source, *warmer.Spec) {
			f := sourcetest.New("fake")
			f.Fail(fmt.Errorf("%w: connection refused", warmer.ErrUnavailable))
			f.FailPing(errors.New("connection refused"))
			return f, spec
		},
	})
}

func TestFake(t *testing.T) {
	ctx := context.Background()
	f := sourcetest.New("fake")
	f.Set("a", []byte("1"))
	f.Set("gone", []byte("x"))
	f.Set("gone", nil)
	f.FailMember("bad", warmer.ErrBadPayload)
	f.Answer(func(m string) (warmer.Result, bool) {
		return warmer.Result{Value: []byte("computed " + m), Version: 7, HasVersion: true}, m != "none"
	})
	rs, err := f.Load(ctx, spec, []string{"a", "gone", "bad", "c", "none"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 4 || string(rs[0].Value) != "1" || string(rs[1].Value) != "computed gone" || !errors.Is(rs[2].Err, warmer.ErrBadPayload) || string(rs[3].Value) != "computed c" || rs[3].Version != 7 {
		t.Errorf("results = %+v", rs)
	}

	f.Set("", []byte("single"))
	if rs, err := f.Load(ctx, spec, nil); err != nil || len(rs) != 1 || rs[0].Member != "" || string(rs[0].Value) != "single" {
		t.Errorf("single key: %+v, %v", rs, err)
	}

	boom := errors.New("boom")
	f.Fail(boom)
	if _, err := f.Load(ctx, spec, []string{"a"}); !errors.Is(err, boom) {
		t.Errorf("Fail: err = %v", err)
	}
	f.Fail(nil)

	if got := f.Calls(); got != 3 {
		t.Errorf("Calls = %d, want 3", got)
	}
	if l := f.Loads(); len(l) != 3 || len(l[0]) != 5 || l[1] != nil {
		t.Errorf("Loads = %q", l)
	}
	if s := f.Starts(); len(s) != 3 || s[2].Before(s[0]) {
		t.Errorf("Starts = %v", s)
	}

	release := f.Block()
	done := make(chan error)
	for range 2 {
		go func() { _, err := f.Load(ctx, spec, []string{"a"}); done <- err }()
	}
	for f.Peak() < 2 {
		time.Sleep(time.Millisecond)
	}
	select {
	case <-done:
		t.Fatal("a blocked load returned before release")
	case <-time.After(20 * time.Millisecond):
	}
	release()
	release()
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("released load: %v", err)
		}
	}
	f.Reset()
	if f.Calls() != 0 || f.Peak() != 0 {
		t.Errorf("after Reset: %d calls, peak %d", f.Calls(), f.Peak())
	}

	var seen []string
	f.OnLoad(func(_ context.Context, members []string) { seen = append(seen, members...) })
	_, _ = f.Load(ctx, spec, []string{"x", "y"})
	if fmt.Sprint(seen) != "[x y]" {
		t.Errorf("OnLoad saw %q", seen)
	}

	f.FailPing(errors.New("refused"))
	if err := f.Ping(ctx); err == nil || err.Error() != "ping fake: refused" {
		t.Errorf("Ping = %v, want it to name the source", err)
	}
	if f.Pings() != 1 {
		t.Errorf("Pings = %d", f.Pings())
	}
}
