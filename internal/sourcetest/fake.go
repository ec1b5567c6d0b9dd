// Package sourcetest is the one fake warmer.Source of the tests, and the
// conformance suite every real Source passes (sources/postgres, sources/http,
// sources/protect). It is test harness: it never links into the daemon.
package sourcetest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hearth-dev/hearth/warmer"
)

// Fake is an in-memory origin whose values, failures, pace and calls the test
// controls. Its Load answers each member it holds a value for (or Answer
// computes one for), and leaves the others out of its results: missing, as
// a database leaves out the rows it has not. A single key is the member "".
// The zero value is not ready: use New.
type Fake struct {
	mu      sync.Mutex
	name    string
	values  map[string][]byte
	answer  func(member string) (warmer.Result, bool)
	memErr  map[string]error
	err     error
	pingErr error
	delay   time.Duration
	gate    chan struct{} // non-nil: loads wait for it to close
	onLoad  func(ctx context.Context, members []string)
	loads   [][]string
	starts  []time.Time
	pings   int
	running int
	peak    int
}

// New returns an empty origin named name (what its Ping errors name).
func New(name string) *Fake {
	return &Fake{name: name, values: map[string][]byte{}, memErr: map[string]error{}}
}

// Set makes member's value v; a nil v deletes the member.
func (f *Fake) Set(member string, v []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v == nil {
		delete(f.values, member)
		return
	}
	f.values[member] = v
}

// SetAll holds exactly values from now on.
func (f *Fake) SetAll(values map[string][]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.values = maps.Clone(values)
	if f.values == nil {
		f.values = map[string][]byte{}
	}
}

// Answer computes the result of every member Set has no value for (found is
// false: the member is missing); nil removes it.
func (f *Fake) Answer(fn func(member string) (r warmer.Result, found bool)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer = fn
}

// Fail makes every load fail whole with err from now on; nil ends it.
func (f *Fake) Fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

// FailMember makes member fail alone with err (a Result.Err); nil ends it.
func (f *Fake) FailMember(member string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.memErr, member)
		return
	}
	f.memErr[member] = err
}

// FailPing makes Ping fail with err, named after the source; nil ends it.
func (f *Fake) FailPing(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pingErr = err
}

// SetDelay makes every load take d from now on (cut short by its context).
func (f *Fake) SetDelay(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delay = d
}

// Block holds every load from now on until release is called (or the load's
// context ends); release is idempotent.
func (f *Fake) Block() (release func()) {
	gate := make(chan struct{})
	f.mu.Lock()
	f.gate = gate
	f.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			if f.gate == gate {
				f.gate = nil
			}
			f.mu.Unlock()
			close(gate)
		})
	}
}

// OnLoad calls fn at the start of every load, outside the fake's lock, with
// the load's context and members (nil for a single key); nil removes it.
func (f *Fake) OnLoad(fn func(ctx context.Context, members []string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onLoad = fn
}

// Calls is how many loads were made (Reset clears it).
func (f *Fake) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.loads)
}

// Loads is a copy of the members of every load, in the order they started.
func (f *Fake) Loads() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([][]string, len(f.loads))
	for i, l := range f.loads {
		out[i] = slices.Clone(l)
	}
	return out
}

// Asked is every member the loads asked for, in the order asked ("" for
// a single key).
func (f *Fake) Asked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, l := range f.loads {
		if l == nil {
			l = []string{""}
		}
		out = append(out, l...)
	}
	return out
}

// Starts is when each load started.
func (f *Fake) Starts() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.starts)
}

// Peak is the most loads that ran at once.
func (f *Fake) Peak() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.peak
}

// Pings is how many times Ping was called.
func (f *Fake) Pings() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pings
}

// Reset forgets the loads, their starts and the peak recorded so far.
func (f *Fake) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loads, f.starts, f.peak = nil, nil, f.running
}

// Load implements warmer.Source.
func (f *Fake) Load(ctx context.Context, _ *warmer.Spec, members []string) ([]warmer.Result, error) {
	f.mu.Lock()
	f.loads = append(f.loads, slices.Clone(members))
	f.starts = append(f.starts, time.Now())
	f.running++
	f.peak = max(f.peak, f.running)
	delay, gate, onLoad := f.delay, f.gate, f.onLoad
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.running--
		f.mu.Unlock()
	}()
	if onLoad != nil {
		onLoad(ctx, members)
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, fmt.Errorf("query: %w", ctx.Err())
		}
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, fmt.Errorf("query: %w", ctx.Err())
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	if members == nil {
		members = []string{""}
	}
	var out []warmer.Result
	for _, m := range members {
		if err := f.memErr[m]; err != nil {
			out = append(out, warmer.Result{Member: m, Err: err})
			continue
		}
		if v, ok := f.values[m]; ok {
			out = append(out, warmer.Result{Member: m, Value: v})
			continue
		}
		if f.answer != nil {
			if r, ok := f.answer(m); ok {
				r.Member = m
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// Ping implements warmer.Source.
func (f *Fake) Ping(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pings++
	if f.pingErr != nil {
		return fmt.Errorf("ping %s: %w", f.name, f.pingErr)
	}
	return nil
}
