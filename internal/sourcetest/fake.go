// Package sourcetest is the one fake warmer.Source of the tests (Fake), a
// recorder of the loads a real Source is asked for (Record), and the
// conformance suite every Source passes (sources/postgres, sources/http,
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
	*Recorder
	o *origin
}

// origin is the Fake's answers; the Recorder in front of it records the calls.
type origin struct {
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
	pings   int
	// prepared is the n of each Prepare, and loadsBefore how many loads had
	// started by then.
	prepared, loadsBefore []int
}

// New returns an empty origin named name (what its Ping errors name).
func New(name string) *Fake {
	o := &origin{name: name, values: map[string][]byte{}, memErr: map[string]error{}}
	return &Fake{Recorder: Record(o), o: o}
}

// Set makes member's value v; a nil v deletes the member.
func (f *Fake) Set(member string, v []byte) {
	f.o.mu.Lock()
	defer f.o.mu.Unlock()
	if v == nil {
		delete(f.o.values, member)
		return
	}
	f.o.values[member] = v
}

// SetAll holds exactly values from now on.
func (f *Fake) SetAll(values map[string][]byte) {
	f.o.mu.Lock()
	defer f.o.mu.Unlock()
	f.o.values = maps.Clone(values)
	if f.o.values == nil {
		f.o.values = map[string][]byte{}
	}
}

// Answer computes the result of every member Set has no value for (found is
// false: the member is missing); nil removes it.
func (f *Fake) Answer(fn func(member string) (r warmer.Result, found bool)) {
	f.o.mu.Lock()
	defer f.o.mu.Unlock()
	f.o.answer = fn
}

// Fail makes every load fail whole with err from now on; nil ends it.
func (f *Fake) Fail(err error) {
	f.o.mu.Lock()
	defer f.o.mu.Unlock()
	f.o.err = err
}

// FailMember makes member fail alone with err (a Result.Err); nil ends it.
func (f *Fake) FailMember(member string, err error) {
	f.o.mu.Lock()
	defer f.o.mu.Unlock()
	if err == nil {
		delete(f.o.memErr, member)
		return
	}
	f.o.memErr[member] = err
}

// FailPing makes Ping fail with err, named after the source; nil ends it.
func (f *Fake) FailPing(err error) {
	f.o.mu.Lock()
	defer f.o.mu.Unlock()
	f.o.pingErr = err
}

// SetDelay makes every load take d from now on (cut short by its context).
func (f *Fake) SetDelay(d time.Duration) {
	f.o.mu.Lock()
	defer f.o.mu.Unlock()
	f.o.delay = d
}

// Block holds every load from now on until release is called (or the load's
// context ends); release is idempotent.
func (f *Fake) Block() (release func()) {
	gate := make(chan struct{})
	f.o.mu.Lock()
	f.o.gate = gate
	f.o.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.o.mu.Lock()
			if f.o.gate == gate {
				f.o.gate = nil
			}
			f.o.mu.Unlock()
			close(gate)
		})
	}
}

// OnLoad calls fn at the start of every load, outside the fake's lock, with
// the load's context and members (nil for a single key); nil removes it.
func (f *Fake) OnLoad(fn func(ctx context.Context, members []string)) {
	f.o.mu.Lock()
	defer f.o.mu.Unlock()
	f.o.onLoad = fn
}

// Prepare records a warmer.Preparer call: it opens nothing.
func (f *Fake) Prepare(_ context.Context, _ []*warmer.Spec, n int) {
	calls := f.Calls()
	f.o.mu.Lock()
	defer f.o.mu.Unlock()
	f.o.prepared = append(f.o.prepared, n)
	f.o.loadsBefore = append(f.o.loadsBefore, calls)
}

// Prepared is the n of every Prepare call, in order, and how many loads
// had started by each.
func (f *Fake) Prepared() (ns, loadsBefore []int) {
	f.o.mu.Lock()
	defer f.o.mu.Unlock()
	return slices.Clone(f.o.prepared), slices.Clone(f.o.loadsBefore)
}

// Pings is how many times Ping was called.
func (f *Fake) Pings() int {
	f.o.mu.Lock()
	defer f.o.mu.Unlock()
	return f.o.pings
}

func (f *origin) Load(ctx context.Context, _ *warmer.Spec, members []string) ([]warmer.Result, error) {
	f.mu.Lock()
	delay, gate, onLoad := f.delay, f.gate, f.onLoad
	f.mu.Unlock()
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

func (f *origin) Ping(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pings++
	if f.pingErr != nil {
		return fmt.Errorf("ping %s: %w", f.name, f.pingErr)
	}
	return nil
}

// Recorder is a Source that records the loads it passes on to another one:
// the members asked, when, and how many ran at once. Fake records through
// one; Record puts one in front of a real source.
type Recorder struct {
	warmer.Source
	mu      sync.Mutex
	loads   [][]string
	starts  []time.Time
	running int
	peak    int
}

// Record returns src behind a Recorder.
func Record(src warmer.Source) *Recorder { return &Recorder{Source: src} }

// Load records the load and passes it on.
func (r *Recorder) Load(ctx context.Context, spec *warmer.Spec, members []string) ([]warmer.Result, error) {
	r.mu.Lock()
	r.loads = append(r.loads, slices.Clone(members))
	r.starts = append(r.starts, time.Now())
	r.running++
	r.peak = max(r.peak, r.running)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running--
		r.mu.Unlock()
	}()
	return r.Source.Load(ctx, spec, members)
}

// Calls is how many loads were made (Reset clears it).
func (r *Recorder) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.loads)
}

// Loads is a copy of the members of every load, in the order they started.
func (r *Recorder) Loads() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([][]string, len(r.loads))
	for i, l := range r.loads {
		out[i] = slices.Clone(l)
	}
	return out
}

// Asked is every member the loads asked for, in the order asked ("" for
// a single key).
func (r *Recorder) Asked() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range r.loads {
		if l == nil {
			l = []string{""}
		}
		out = append(out, l...)
	}
	return out
}

// Starts is when each load started.
func (r *Recorder) Starts() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.starts)
}

// Peak is the most loads that ran at once.
func (r *Recorder) Peak() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.peak
}

// Reset forgets the loads, their starts and the peak recorded so far.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.loads, r.starts, r.peak = nil, nil, r.running
}
