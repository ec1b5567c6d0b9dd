package sourcetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/sources/protect"
	"github.com/hearth-dev/hearth/warmer"
)

// Backend is one Source implementation under the conformance suite.
type Backend struct {
	// Name is the source's name in the config, which its Ping errors name.
	Name string
	// New returns a source on an origin that holds exactly values (member to
	// value; members are digits, letters, '-' and '_') and answers every call
	// after delay, and a family declaration of it. Both end with t.
	New func(t *testing.T, values map[string][]byte, delay time.Duration) (warmer.Source, *warmer.Spec)
	// Single returns a source and a single-key declaration of it, whose
	// origin holds value for the key (nil: holds nothing).
	Single func(t *testing.T, value []byte) (warmer.Source, *warmer.Spec)
	// Down returns a source whose origin does not answer (nothing listens),
	// and a family declaration of it.
	Down func(t *testing.T) (warmer.Source, *warmer.Spec)
}

// Conformance states what every Source does, whatever its origin:
//
//   - a found member comes back once, under its own name, with its value byte
//     for byte; a member the origin has not is left out or Missing, never
//     given a value or an error;
//   - a single key (members nil) comes back as the member "", or, when the
//     origin has not it, left out or Missing;
//   - a batch of hundreds loads in one call, no member lost, duplicated or
//     added;
//   - a load whose context is cancelled or whose deadline passes returns
//     soon, and says so: the batch's error, or every member's, wraps the
//     context's error, and no member is reported found or missing;
//   - an origin that does not answer fails the load (the batch or every
//     member) with an error the origin protection retries, and reports no
//     member missing; Ping fails naming the source. Load errors need not name
//     the source: the warmer wraps them as "load KEY from SOURCE: …".
func Conformance(t *testing.T, b Backend) {
	t.Run("found and not found", func(t *testing.T) {
		src, spec := b.New(t, map[string][]byte{"1": []byte("\x00\xffone\n"), "b-2_x": []byte("two")}, 0)
		if err := src.Ping(t.Context()); err != nil {
			t.Errorf("Ping of a healthy origin: %v", err)
		}
		rs, err := src.Load(t.Context(), spec, []string{"1", "b-2_x", "404"})
		if err != nil {
			t.Fatalf("Load: %v", err)
		}
		got := check(t, rs, []string{"1", "b-2_x", "404"})
		if v := got["1"]; string(v.Value) != "\x00\xffone\n" || v.Missing || v.Err != nil {
			t.Errorf("member 1 = %+v, want its value %q byte for byte", v, "\x00\xffone\n")
		}
		if v := got["b-2_x"]; string(v.Value) != "two" || v.Missing || v.Err != nil {
			t.Errorf("member b-2_x = %+v, want %q", v, "two")
		}
		if v, ok := got["404"]; ok && (!v.Missing || v.Value != nil || v.Err != nil) {
			t.Errorf("member 404, not in the origin = %+v, want left out or Missing", v)
		}
	})

	t.Run("a single key", func(t *testing.T) {
		src, spec := b.Single(t, []byte("\x00single"))
		rs, err := src.Load(t.Context(), spec, nil)
		if err != nil {
			t.Fatalf("Load: %v", err)
		}
		if len(rs) != 1 || rs[0].Member != "" || string(rs[0].Value) != "\x00single" || rs[0].Missing || rs[0].Err != nil {
			t.Errorf("single key = %+v, want one result, member \"\", value %q", rs, "\x00single")
		}
		src, spec = b.Single(t, nil)
		rs, err = src.Load(t.Context(), spec, nil)
		if err != nil {
			t.Fatalf("Load of a key the origin has not: %v", err)
		}
		if len(rs) > 1 || len(rs) == 1 && (rs[0].Member != "" || !rs[0].Missing || rs[0].Value != nil || rs[0].Err != nil) {
			t.Errorf("single key the origin has not = %+v, want left out or Missing", rs)
		}
	})

	t.Run("a batch of hundreds, none lost, duplicated or added", func(t *testing.T) {
		values := map[string][]byte{}
		var members []string
		for i := range 300 {
			m := strconv.Itoa(i)
			members = append(members, m)
			if i%3 != 0 {
				values[m] = []byte("value of " + m)
			}
		}
		src, spec := b.New(t, values, 0)
		rs, err := src.Load(t.Context(), spec, members)
		if err != nil {
			t.Fatalf("Load: %v", err)
		}
		got := check(t, rs, members)
		for _, m := range members {
			r, ok := got[m]
			switch want, found := values[m]; {
			case found && (!ok || string(r.Value) != string(want) || r.Err != nil):
				t.Errorf("member %s = %+v (returned: %v), want %q", m, r, ok, want)
			case !found && ok && (!r.Missing || r.Value != nil || r.Err != nil):
				t.Errorf("member %s, not in the origin = %+v, want left out or Missing", m, r)
			}
		}
	})

	t.Run("a cancelled load says so", func(t *testing.T) {
		src, spec := b.New(t, map[string][]byte{"1": []byte("one"), "2": []byte("two")}, 0)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		failed(t, src, ctx, spec, []string{"1", "2"}, time.Second, func(err error) bool { return errors.Is(err, context.Canceled) }, "wrap context.Canceled")
	})

	t.Run("a slow origin is cut at the deadline", func(t *testing.T) {
		src, spec := b.New(t, map[string][]byte{"1": []byte("one"), "2": []byte("two")}, 3*time.Second)
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		failed(t, src, ctx, spec, []string{"1", "2"}, 1500*time.Millisecond, func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }, "wrap context.DeadlineExceeded")
	})

	t.Run("an origin that does not answer", func(t *testing.T) {
		src, spec := b.Down(t)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		failed(t, src, ctx, spec, []string{"1", "2"}, 10*time.Second, protect.Retryable, "be one the origin protection retries (protect.Retryable)")
		err := src.Ping(ctx)
		if err == nil || !strings.Contains(err.Error(), b.Name) {
			t.Errorf("Ping of an origin that does not answer: %v, want an error naming the source %q", err, b.Name)
		}
	})
}

// check fails on a result for a member not asked for, or for one twice, and
// returns the results by member.
func check(t *testing.T, rs []warmer.Result, members []string) map[string]warmer.Result {
	t.Helper()
	asked := map[string]bool{}
	for _, m := range members {
		asked[m] = true
	}
	got := map[string]warmer.Result{}
	for _, r := range rs {
		if !asked[r.Member] {
			t.Errorf("a result for member %q, not asked for: %+v", r.Member, r)
		}
		if _, dup := got[r.Member]; dup {
			t.Errorf("member %q returned twice", r.Member)
		}
		got[r.Member] = r
	}
	return got
}

// failed loads members and requires the load to fail within limit, as a
// batch or member by member, every error satisfying is.
func failed(t *testing.T, src warmer.Source, ctx context.Context, spec *warmer.Spec, members []string, limit time.Duration, is func(error) bool, want string) {
	t.Helper()
	start := time.Now()
	rs, err := src.Load(ctx, spec, members)
	if took := time.Since(start); took > limit {
		t.Errorf("Load returned after %s, want within %s", took.Round(time.Millisecond), limit)
	}
	if err != nil {
		if !is(err) {
			t.Errorf("Load: %v; want the error to %s", err, want)
		}
		return
	}
	got := check(t, rs, members)
	for _, m := range members {
		r, ok := got[m]
		switch {
		case !ok:
			t.Errorf("member %s left out (missing) of a load that failed: the warmer would write it as not found", m)
		case r.Err == nil:
			t.Errorf("member %s = %+v, want an error: the load failed", m, r)
		case !is(r.Err):
			t.Errorf("member %s: %v; want the error to %s", m, r.Err, want)
		}
	}
	if t.Failed() {
		t.Logf("results: %s", fmt.Sprint(rs))
	}
}
