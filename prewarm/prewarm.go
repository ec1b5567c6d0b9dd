// Package prewarm warms a Redis ahead of its readers: every declared single
// key plus the hottest keys of the access log, each matched to its
// declaration and validated, loaded in batches through the refresh engine or
// copied from another Redis (blue-green from the live cache). One run at a
// time; its progress and the last report are readable while it runs.
// It sees the engine through Engine, and writes one-shot runs through Store.
package prewarm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"github.com/hearth-dev/hearth/hotset"
	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/warmer"
)

// AccessLog ranks cache keys by how often the application read them.
type AccessLog interface {
	// EachTopKey calls fn with at most n keys read over the last window, most
	// read first, as they arrive. fn never blocks on loads: the pre-warm starts
	// loading the hottest keys while the rest are still being read.
	EachTopKey(ctx context.Context, window time.Duration, n int, fn func(key string)) error
}

// Options shapes one pre-warm.
type Options struct {
	// AccessLog supplies the hot keys; nil loads the declared single keys only.
	AccessLog AccessLog
	// TopN is how many access-log keys are read; 0 reads none.
	TopN int
	// Window is how far back the access log is read.
	Window time.Duration
	// Concurrency bounds the batch loads in flight (default 4); the warmer's
	// MaxConcurrentLoads still bounds all loads together.
	Concurrency int
	// Rate bounds the batch loads started per second; 0 means no bound.
	Rate float64
	// Reason labels the run in logs: startup, cli, admin, restart, flush.
	Reason string
	// Progress, when set, is called once the keys are known and after every
	// batch, never concurrently.
	Progress func(Progress)
	// Copy, when set, copies the wanted keys from another Redis (blue-green
	// from the live cache) instead of loading them from the origin; keys it
	// cannot give are loaded from the origin unless Copy.FromOnly.
	Copy *CopySource
}

// Reasons an access-log key is skipped, never loaded: the hot set's three
// (see hotset.SkipTooLong and the next two), and three of its own.
const (
	SkipTooLong       = hotset.SkipTooLong
	SkipNamespace     = hotset.SkipNamespace
	SkipInvalidMember = hotset.SkipInvalidMember
	// SkipMalformed: invalid UTF-8, whitespace or control characters.
	SkipMalformed = "malformed"
	// SkipUnknown: no declaration's template matches the key.
	SkipUnknown = "unknown"
	// SkipDuplicate: the ranking held the key before. A ranking Hearth stores
	// or computes never repeats a key, so this one was written by hand or by
	// another program; each key is still loaded once.
	SkipDuplicate = "duplicate"
)

// MaxLogKeyBytes bounds an access-log key before it is matched at all.
const MaxLogKeyBytes = hotset.MaxLogKeyBytes

// Report is what a pre-warm did. Wanted = Written + Negative + Present + Failed.
type Report struct {
	// Reason the run was started (see Options.Reason).
	Reason string `json:"reason,omitempty"`
	// Started is when the run began; it ended Duration later.
	Started time.Time `json:"started"`
	// Candidates is how many keys the access log returned.
	Candidates int `json:"candidates"`
	// Wanted is how many keys the run set out to load: every declared single
	// key and every access-log key that matched a declaration.
	Wanted int `json:"wanted"`
	// Written got a value; Negative got the not-found sentinel (the origin has
	// no such row, which is a warm answer too); Failed did neither.
	Written  int `json:"written"`
	Negative int `json:"negative"`
	Failed   int `json:"failed"`
	// Present found the key already holding a value and left it alone (a
	// set-if-absent store, `hearth prewarm` without --overwrite): warm, not
	// written. Fenced is how many of Failed were refused by the fence: a
	// leader took over during the run.
	Present int `json:"present"`
	Fenced  int `json:"fenced,omitempty"`
	// Skipped counts access-log keys not loaded, by reason.
	Skipped map[string]int `json:"skipped"`
	// A copy from a source Redis (Options.Copy): Copied keys were
	// written from it (values and sentinels, counted in Written and
	// Negative too), FromOrigin were loaded from the origin because the
	// source could not give them, SourceMissing is how many it could not
	// give (absent, expired or skipped; with --from-only they failed),
	// SourceSkipped counts the skipped by reason (CopySkip*) and
	// RecordsCopied the copies that carried their version record.
	Copy          bool           `json:"copy,omitempty"`
	From          string         `json:"from,omitempty"` // CopySource.Name
	Copied        int            `json:"copied,omitempty"`
	FromOrigin    int            `json:"from_origin,omitempty"`
	SourceMissing int            `json:"source_missing,omitempty"`
	SourceSkipped map[string]int `json:"source_skipped,omitempty"`
	RecordsCopied int            `json:"records_copied,omitempty"`
	// SourceScanned: the access log could not be read and the keys were
	// selected by a SCAN of the source (declared members first).
	SourceScanned bool `json:"source_scanned,omitempty"`
	// Coverage is (Written + Negative + Present) / Wanted, 1 when nothing was wanted.
	// When the access log could not be read (AccessLogFailed), the keys it did
	// not deliver are wanted and not loaded: Coverage is (Written + Negative) /
	// (Wanted + max(1, TopN − Candidates)), always below 1.
	Coverage float64 `json:"coverage"`
	// Ranking says which access-log ranking the run read, how old it was and
	// the buckets it spans, when the access log can say (accesslog.Log).
	Ranking string `json:"ranking,omitempty"`
	// AccessLogFailed is true when the ranking could not be read to its end:
	// the run's result is "error" whatever it loaded.
	AccessLogFailed bool `json:"access_log_failed,omitempty"`
	// Duration is the wall time of the run, reading the access log included.
	Duration      time.Duration `json:"duration"`
	KeysPerSecond float64       `json:"keys_per_second"`
	// Error is the first error that kept keys from loading, if any.
	Error string `json:"error,omitempty"`
}

// MarshalJSON writes Duration as a duration string ("3.302s"), as the admin
// API writes every duration, not as a count of nanoseconds.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report // without this method
	return json.Marshal(struct {
		plain
		Duration string `json:"duration"`
	}{plain(r), r.Duration.Round(time.Microsecond).String()})
}

// SkippedTotal is the number of access-log keys skipped for any reason.
func (r Report) SkippedTotal() int {
	n := 0
	for _, v := range r.Skipped {
		n += v
	}
	return n
}

// Progress is a running pre-warm's state.
type Progress struct {
	Running bool      `json:"running"`
	Reason  string    `json:"reason,omitempty"`
	Started time.Time `json:"started"`
	Wanted  int       `json:"wanted"`
	// Done = Written + Negative + Present + Failed so far.
	Done     int `json:"done"`
	Written  int `json:"written"`
	Negative int `json:"negative"`
	Failed   int `json:"failed"`
	Present  int `json:"present"`
	Skipped  int `json:"skipped"`
	// Reading is true while the access log is still being read (Wanted grows).
	Reading bool `json:"reading_access_log"`
}

// Status is what the warmer knows of pre-warms: the one running, if
// any, and the last one finished.
type Status struct {
	Current Progress `json:"current"`
	Last    *Report  `json:"last,omitempty"`
}

// Engine is the refresh engine as a pre-warm sees it (a *warmer.Warmer): the
// declarations as they are now, and the load of one batch of a declaration's
// members, written through the engine's store.
type Engine interface {
	Specs() []*warmer.Spec
	RefreshMembers(ctx context.Context, name string, members []string) (warmer.Outcome, error)
	// PrepareLoads gets the sources of specs ready for n loads at once.
	PrepareLoads(ctx context.Context, specs []*warmer.Spec, n int)
}

// Prewarmer runs pre-warms through an Engine: one run at a time, its
// progress readable while it runs.
type Prewarmer struct {
	e       Engine
	run     chan struct{}
	metrics *metrics
	log     zerolog.Logger

	mu      sync.Mutex
	current Progress
	last    *Report
}

// New builds the Prewarmer of engine e; its metrics are registered on reg.
func New(e Engine, reg prometheus.Registerer, log zerolog.Logger) *Prewarmer {
	// The pre-warm logs as a part of the warmer, as it always has.
	return &Prewarmer{e: e, run: make(chan struct{}, 1), metrics: newMetrics(reg),
		log: log.With().Str("component", "warmer").Logger()}
}

// Status returns the running pre-warm's progress and the last report.
func (p *Prewarmer) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Status{Current: p.current}
	if p.last != nil {
		last := *p.last
		last.Skipped = maps.Clone(last.Skipped)
		st.Last = &last
	}
	return st
}

// prewarmJob is one batch of one declaration, queued to load.
type prewarmJob struct {
	spec    *warmer.Spec
	members memberList
}

// memberList is a batch's members end to end in one buffer: member i is
// buf[ends[i-1]:ends[i]] (from 0 for the first). The reader queues batches
// far ahead of the loads (a ranking of 100,000 keys is read in a fraction of
// the time its loads take), and what the queue holds raises the collector's
// goal, and with it the memory the process touches. As strings, each member
// held its access-log key alive (pgx allocates one per key) and took a
// 16-byte header besides; here it takes its own bytes and 8.
type memberList struct {
	buf  []byte
	ends []int
}

// oneMember is a list of the single member m.
func oneMember(m string) memberList {
	return memberList{buf: []byte(m), ends: []int{len(m)}}
}

func (l *memberList) add(m string) {
	l.buf = append(l.buf, m...)
	l.ends = append(l.ends, len(l.buf))
}

func (l *memberList) len() int { return len(l.ends) }

// start is where member i begins in buf.
func (l *memberList) start(i int) int {
	if i == 0 {
		return 0
	}
	return l.ends[i-1]
}

// filter keeps, of the members from index from on, those whose keep[i-from]
// is true, in order (len(keep) is the number of members from from on).
func (l *memberList) filter(from int, keep []bool) {
	at := l.start(from) // where the next kept member goes
	start := at         // where member from+i begins, before any move
	n := from
	for i, ok := range keep {
		end := l.ends[from+i]
		if ok {
			at += copy(l.buf[at:], l.buf[start:end])
			l.ends[n] = at
			n++
		}
		start = end
	}
	l.buf, l.ends = l.buf[:at], l.ends[:n]
}

// strings returns the members as strings, all cut from one: a batch's
// members cost two allocations when it loads.
func (l *memberList) strings() []string {
	all := string(l.buf)
	out := make([]string, len(l.ends))
	start := 0
	for i, end := range l.ends {
		out[i] = all[start:end]
		start = end
	}
	return out
}

// Run loads every declared single key plus the top-N keys of the access log
// over the window, hottest first. Each access-log key is matched to its
// declaration by template and its parameter validated; a key that matches none
// or fails validation is skipped and counted by reason, never loaded. Members
// are loaded in batches of the declaration's batch size (one origin query per
// batch), with at most Concurrency batches in flight and at most Rate started
// per second, and written pipelined with jittered TTLs.
//
// Runs do not overlap: a second call waits for the first to finish. The report
// is returned even with an error: reading the access log failed (the single
// keys are still loaded) or ctx ended (what was loaded stays loaded).
func (p *Prewarmer) Run(ctx context.Context, po Options) (Report, error) {
	select {
	case p.run <- struct{}{}:
	case <-ctx.Done():
		return Report{Reason: po.Reason, Skipped: map[string]int{}}, fmt.Errorf("pre-warm: %w", ctx.Err())
	}
	defer func() { <-p.run }()
	// Running from the moment it holds the slot, as Start's are.
	p.setProgress(Progress{Running: true, Reason: po.Reason, Started: time.Now()})
	return p.prewarm(ctx, po)
}

// Start starts a pre-warm in the background unless one is running
// (ErrBusy), for callers such as an admin endpoint that answer at once
// and report progress through Status. The report is delivered on the
// returned channel, which is then closed; ctx bounds the run.
func (p *Prewarmer) Start(ctx context.Context, po Options) (<-chan Report, error) {
	select {
	case p.run <- struct{}{}:
	default:
		return nil, ErrBusy
	}
	// Mark it running before returning, so a status read right after sees it.
	p.setProgress(Progress{Running: true, Reason: po.Reason, Started: time.Now()})
	done := make(chan Report, 1)
	go func() {
		defer close(done)
		defer func() { <-p.run }()
		rep, _ := p.prewarm(ctx, po)
		done <- rep
	}()
	return done, nil
}

// prewarmRun is one pre-warm in progress. The access-log reader queues a batch
// as soon as a declaration has a batch's worth of keys; the workers load
// queued batches within the concurrency and rate bounds. The reader never waits
// for loads, so the two cannot starve each other of database connections.
type prewarmRun struct {
	p     *Prewarmer
	po    Options
	specs []*warmer.Spec // the declarations when the run started (a reload may change them)

	mu       sync.Mutex // guards everything down to reader
	rep      Report
	prog     Progress
	firstErr error
	queue    []prewarmJob
	closed   bool
	wake     chan struct{} // a batch was queued
	done     chan struct{} // closed with the queue: every idle worker returns
	ready    chan struct{} // closed once the sources are ready for the loads
	// copyWrite is the longest a copy's write took so far in this run
	// (nanoseconds): a copy's TTL is shortened by it up front.
	copyWrite atomic.Int64

	// reader is the access-log reader's own state, touched by it alone (add,
	// finishReading) and so without the lock: the lock is taken once per
	// batch queued, not once per key.
	reader prewarmReader
}

// prewarmReader is what the access-log reader keeps between keys.
type prewarmReader struct {
	pending map[*warmer.Spec]*pendingBatch
	order   []*pendingBatch // in order of each declaration's hottest key
	last    *pendingBatch   // the batch of the last key (keys of one family come in runs)
	// seen holds a hash of every family key queued so far, so that a key
	// repeated in the ranking is loaded once. A key names one member of one
	// declaration (templates do not overlap), so keys stand for both. Hashes,
	// not the keys: no key is kept alive past its batch, and the set holds no
	// pointers for the collector to scan. The seed is random per run, so no
	// access log can be written to collide (a collision, odds about 6 in 10^8
	// at 10^6 keys with the set's 63 bits, leaves one key to its first read).
	// A batch's keys are checked together when it is full (checkBatch).
	seen  *hashSet
	seed  maphash.Seed
	fresh []bool // checkBatch's answers, reused
	// Counted since they were last added to the report (flushLocked).
	candidates int
	skipped    map[string]int
	// scanning: keys come from a scan of a copy's source, not the ranking.
	scanning bool
}

// pendingBatch is a declaration's batch being filled by the reader.
type pendingBatch struct {
	spec    *warmer.Spec
	members memberList
	// hashes[i] is the key hash of members[checked+i]: members added since
	// the batch was last checked against the set.
	hashes  []uint64
	checked int
}

// checkBatch checks b's members added since its last check against the
// set of keys queued (all at once: hashSet.addAll), and drops the repeats.
func (rd *prewarmReader) checkBatch(b *pendingBatch) {
	if len(b.hashes) == 0 {
		return
	}
	if cap(rd.fresh) < len(b.hashes) {
		rd.fresh = make([]bool, len(b.hashes))
	}
	fresh := rd.fresh[:len(b.hashes)]
	rd.seen.addAll(b.hashes, fresh)
	repeats := 0
	for _, ok := range fresh {
		if !ok {
			repeats++
		}
	}
	if repeats > 0 {
		if !rd.scanning { // a scan finds the declared members again: not a repeat
			rd.skipped[SkipDuplicate] += repeats
		}
		b.members.filter(b.checked, fresh)
	}
	b.checked, b.hashes = b.members.len(), b.hashes[:0]
}

// checkAll checks every batch being filled: before the reading ends, and
// before its keys change from the ranking's to a scan's (or back), which
// count repeats differently.
func (rd *prewarmReader) checkAll() {
	for _, b := range rd.order {
		rd.checkBatch(b)
	}
}

func (p *Prewarmer) prewarm(ctx context.Context, po Options) (Report, error) {
	start := time.Now()
	r := &prewarmRun{
		p: p, po: po, specs: p.e.Specs(),
		rep:    Report{Reason: po.Reason, Skipped: map[string]int{}, Copy: po.Copy != nil},
		prog:   Progress{Running: true, Reason: po.Reason, Started: time.Now(), Reading: true},
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
		ready:  make(chan struct{}),
		reader: prewarmReader{pending: map[*warmer.Spec]*pendingBatch{}, skipped: map[string]int{}},
	}
	if po.Copy != nil {
		r.rep.From = po.Copy.Name
	}
	p.log.Info().Str("reason", po.Reason).Int("top_n", po.TopN).Dur("window_ms", po.Window).
		Int("concurrency", po.Concurrency).Float64("rate", po.Rate).Func(func(e *zerolog.Event) {
		if po.Copy != nil {
			e.Str("from", po.Copy.Name).Bool("from_only", po.Copy.FromOnly)
		}
	}).Msg("pre-warm started")
	// Declared single keys first: they load while the access log is read.
	for _, s := range r.specs {
		if !s.Template.IsFamily() {
			r.push(prewarmJob{spec: s, members: oneMember("")})
		}
	}
	r.progress()

	var loads errgroup.Group
	loads.Go(func() error { r.prepare(ctx); return nil })
	r.dispatch(ctx, &loads)

	var logErr error
	t0 := time.Now()
	if po.AccessLog != nil && po.TopN > 0 {
		err := po.AccessLog.EachTopKey(ctx, po.Window, po.TopN, r.add)
		if err != nil {
			logErr = fmt.Errorf("pre-warm: %w", err)
			p.metrics.accessLogErrors.Inc()
			p.log.Error().Err(err).Msg("pre-warm: access log unreadable; loading the declared single keys and the keys read so far")
		}
	}
	if po.Copy != nil && po.TopN > 0 && logErr != nil {
		// The access log is unreadable (often so during a cutover): the
		// source itself says which keys are cached.
		if err := r.scanSource(ctx, po.TopN); err != nil {
			p.log.Error().Err(err).Msg("pre-warm: the source redis could not be scanned either")
		} else {
			p.log.Warn().Err(logErr).Msg("pre-warm: access log unreadable; the keys were selected by a scan of the source redis")
			logErr = nil
			r.mu.Lock()
			r.rep.SourceScanned = true
			r.mu.Unlock()
		}
	}
	reading := time.Now().Sub(t0)
	r.finishReading()
	_ = loads.Wait()

	r.mu.Lock()
	rep, firstErr := r.rep, r.firstErr
	r.mu.Unlock()
	for reason, n := range rep.Skipped {
		p.metrics.keys.WithLabelValues("skipped_" + reason).Add(float64(n))
	}
	for reason, n := range rep.SourceSkipped {
		p.metrics.keys.WithLabelValues("source_skipped_" + reason).Add(float64(n))
	}
	if rep.Copy {
		p.metrics.keys.WithLabelValues("copied").Add(float64(rep.Copied))
		p.metrics.keys.WithLabelValues("from_origin").Add(float64(rep.FromOrigin))
	}
	rep.Failed = rep.Wanted - rep.Written - rep.Negative - rep.Present
	rep.AccessLogFailed = logErr != nil
	if d, ok := po.AccessLog.(interface{ DescribeLastRanking() string }); ok && po.TopN > 0 {
		rep.Ranking = d.DescribeLastRanking()
	}
	rep.Coverage = coverage(rep, po.TopN)
	rep.Started, rep.Duration = start, time.Now().Sub(start)
	if s := rep.Duration.Seconds(); s > 0 {
		rep.KeysPerSecond = float64(rep.Written+rep.Negative+rep.Present) / s
	}
	err := logErr
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("pre-warm: %w", context.Cause(ctx))
	}
	switch {
	case err != nil:
		rep.Error = err.Error()
	case firstErr != nil:
		rep.Error = firstErr.Error()
	}
	p.log.Debug().Dur("took_ms", reading).Int("candidates", rep.Candidates).Msg("pre-warm: access log read")
	if n := rep.Skipped[SkipDuplicate]; n > 0 {
		p.log.Warn().Int("repeated", n).
			Msg("pre-warm: the access-log ranking repeats keys (a ranking Hearth writes never does); each key was loaded once")
	}
	p.finish(rep, err)
	return rep, err
}

// coverage is the share of the keys asked for that the run loaded (see
// Report.Coverage).
func coverage(rep Report, topN int) float64 {
	loaded, wanted := rep.Written+rep.Negative+rep.Present, rep.Wanted
	if rep.AccessLogFailed {
		// The ranking failed: what it did not deliver was asked for, not loaded.
		wanted += max(1, topN-rep.Candidates)
	}
	if wanted == 0 {
		return 1
	}
	return float64(loaded) / float64(wanted)
}

// maxSeenHint bounds the size a pre-warm's de-duplication set is made with
// (it grows past it if it must).
const maxSeenHint = 1 << 20

// add takes one access-log key, in rank order: skipped and counted, or added
// to its declaration's batch, which is queued once full.
func (r *prewarmRun) add(key string) {
	rd := &r.reader
	rd.candidates++
	spec, member, reason := classify(r.specs, key)
	if reason != "" {
		rd.skipped[reason]++
		ev := r.p.log.Debug()
		if reason == SkipNamespace {
			ev = r.p.log.Warn() // someone recorded Hearth's own key as an application read
		}
		if ev.Enabled() { // the key is quoted only for a line that is written
			ev.Str("reason", reason).Str("key", quoteKey(key)).Msg("pre-warm: access-log key skipped")
		}
		return
	}
	if !spec.Template.IsFamily() {
		return // declared single keys are always loaded
	}
	b := rd.last
	if b == nil || b.spec != spec {
		if b = rd.pending[spec]; b == nil {
			b = &pendingBatch{spec: spec}
			rd.pending[spec] = b
			rd.order = append(rd.order, b)
		}
		rd.last = b
	}
	if rd.seen == nil {
		// Sized for the whole run up front: a set grown key by key to top_n
		// entries rehashes all of them at every doubling.
		rd.seen = newHashSet(min(r.po.TopN, maxSeenHint))
		rd.seed = maphash.MakeSeed()
	}
	if b.members.ends == nil && spec.BatchSize > 0 {
		// Handed on with the batch; the buffer is sized for members of
		// this one's length (up to 64 KB: a long first member does not
		// size it for a batch of long ones).
		b.members = memberList{
			buf:  make([]byte, 0, min(spec.BatchSize*len(member), 64<<10)),
			ends: make([]int, 0, spec.BatchSize),
		}
	}
	if b.hashes == nil && spec.BatchSize > 0 {
		b.hashes = make([]uint64, 0, spec.BatchSize) // kept: empty once checked
	}
	b.members.add(member)
	b.hashes = append(b.hashes, maphash.String(rd.seed, key))
	if size := spec.BatchSize; size > 0 && b.members.len() >= size {
		// Full: checked for repeats, and queued unless some were dropped.
		if rd.checkBatch(b); b.members.len() < size {
			return
		}
		r.mu.Lock()
		r.flushLocked()
		r.pushLocked(prewarmJob{spec: spec, members: b.members})
		r.mu.Unlock()
		b.members, b.checked = memberList{}, 0
	} else if size <= 0 && len(b.hashes) >= uncheckedMax {
		rd.checkBatch(b) // one batch for all its keys: checked as it grows
	}
}

// uncheckedMax bounds the keys a declaration without a batch size holds
// before they are checked for repeats.
const uncheckedMax = 1024

// flushLocked adds what the reader counted since the last flush to the
// report and the progress.
func (r *prewarmRun) flushLocked() {
	rd := &r.reader
	r.rep.Candidates += rd.candidates
	rd.candidates = 0
	for reason, n := range rd.skipped {
		r.rep.Skipped[reason] += n
		r.prog.Skipped += n
	}
	clear(rd.skipped)
}

// finishReading queues the partial batches and closes the queue.
func (r *prewarmRun) finishReading() {
	r.reader.checkAll()
	r.mu.Lock()
	r.flushLocked()
	for _, b := range r.reader.order {
		if b.members.len() > 0 {
			r.pushLocked(prewarmJob{spec: b.spec, members: b.members})
			b.members, b.hashes, b.checked = memberList{}, nil, 0
		}
	}
	r.closed = true
	r.prog.Reading = false
	r.mu.Unlock()
	close(r.done)
	r.progress()
}

func (r *prewarmRun) push(j prewarmJob) {
	r.mu.Lock()
	r.pushLocked(j)
	r.mu.Unlock()
}

func (r *prewarmRun) pushLocked(j prewarmJob) {
	r.queue = append(r.queue, j)
	r.rep.Wanted += j.members.len()
	r.prog.Wanted = r.rep.Wanted
	r.signal()
}

func (r *prewarmRun) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// next returns the next queued batch, waiting for one; false once the queue is
// closed and empty, or ctx ended.
func (r *prewarmRun) next(ctx context.Context) (prewarmJob, bool) {
	for {
		r.mu.Lock()
		if len(r.queue) > 0 {
			j := r.queue[0]
			r.queue[0] = prewarmJob{}
			r.queue = r.queue[1:]
			more := len(r.queue) > 0
			r.mu.Unlock()
			if more {
				r.signal() // one wake-up per signal: pass it on to the next idle worker
			}
			return j, true
		}
		closed := r.closed
		r.mu.Unlock()
		if closed {
			return prewarmJob{}, false
		}
		select {
		case <-r.wake:
		case <-r.done:
		case <-ctx.Done():
			return prewarmJob{}, false
		}
	}
}

// prepare has the sources open the workers' connections and describe the
// queries while the access log is read (a live ranking keeps PostgreSQL busy
// on one core for a while), then lets the workers start. A copy from another
// Redis leaves the origin alone: it may be down, and --from-only never
// touches it.
func (r *prewarmRun) prepare(ctx context.Context) {
	defer close(r.ready)
	if r.po.Copy != nil {
		return
	}
	var bound time.Duration
	for _, s := range r.specs {
		bound = max(bound, s.LoadTimeout)
	}
	if bound > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, bound)
		defer cancel()
	}
	r.p.e.PrepareLoads(ctx, r.specs, r.concurrency())
}

// concurrency is how many batches load at once.
func (r *prewarmRun) concurrency() int {
	if r.po.Concurrency <= 0 {
		return 4
	}
	return r.po.Concurrency
}

// dispatch loads the queued batches, hottest first, with Concurrency workers
// that each take the next batch as soon as their last one is written (no
// hand-off through another goroutine between two batches), starting at most
// Rate batches per second between them.
func (r *prewarmRun) dispatch(ctx context.Context, loads *errgroup.Group) {
	limit := rate.Inf
	if r.po.Rate > 0 {
		limit = rate.Limit(r.po.Rate)
	}
	limiter := rate.NewLimiter(limit, 1)
	for range r.concurrency() {
		loads.Go(func() error {
			select {
			case <-r.ready:
			case <-ctx.Done():
				return nil
			}
			for {
				j, ok := r.next(ctx)
				if !ok || limiter.Wait(ctx) != nil {
					return nil
				}
				r.load(ctx, j)
			}
		})
	}
}

// load loads and writes one batch and adds its outcome to the run.
func (r *prewarmRun) load(ctx context.Context, j prewarmJob) {
	var (
		o   warmer.Outcome
		err error
	)
	if r.po.Copy != nil {
		var c copyOutcome
		c, err = r.copyBatch(ctx, j)
		o = c.Outcome
		r.mu.Lock()
		r.rep.Copied += c.Copied
		r.rep.FromOrigin += c.FromOrigin
		r.rep.SourceMissing += c.SourceMissing
		r.rep.RecordsCopied += c.RecordsCopied
		r.mu.Unlock()
	} else {
		o, err = r.p.e.RefreshMembers(ctx, j.spec.Name, j.members.strings())
	}
	r.mu.Lock()
	if err != nil && r.firstErr == nil {
		r.firstErr = err
	}
	r.rep.Written += o.Written
	r.rep.Negative += o.Negative
	r.rep.Present += o.Present
	r.rep.Fenced += o.Fenced
	r.prog.Written, r.prog.Negative, r.prog.Present = r.rep.Written, r.rep.Negative, r.rep.Present
	r.prog.Failed += j.members.len() - o.Written - o.Negative - o.Present
	r.prog.Done = r.prog.Written + r.prog.Negative + r.prog.Present + r.prog.Failed
	r.mu.Unlock()
	r.progress()
}

// progress publishes the current progress; the callback is never called concurrently.
func (r *prewarmRun) progress() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.p.setProgress(r.prog)
	if r.po.Progress != nil {
		r.po.Progress(r.prog)
	}
}

func (p *Prewarmer) setProgress(pr Progress) {
	p.mu.Lock()
	p.current = pr
	p.mu.Unlock()
}

func (p *Prewarmer) finish(rep Report, err error) {
	m := p.metrics
	result := "ok"
	switch {
	case rep.AccessLogFailed:
		// The hot keys are what a pre-warm is for: without them it failed.
		result = "error"
	case err != nil && rep.Written+rep.Negative+rep.Present == 0 && rep.Wanted > 0:
		result = "error"
	case err != nil || rep.Failed > 0:
		result = "partial"
	}
	m.runs.WithLabelValues(result).Inc()
	m.duration.Observe(rep.Duration.Seconds())
	m.coverage.Set(rep.Coverage)
	m.keys.WithLabelValues("written").Add(float64(rep.Written))
	m.keys.WithLabelValues("negative").Add(float64(rep.Negative))
	m.keys.WithLabelValues("failed").Add(float64(rep.Failed))
	m.keys.WithLabelValues("present").Add(float64(rep.Present))
	p.mu.Lock()
	p.current = Progress{}
	last := rep
	p.last = &last
	p.mu.Unlock()
	ev := p.log.Info()
	if result != "ok" {
		ev = p.log.Warn()
	}
	ev.Str("reason", rep.Reason).Str("result", result).Int("candidates", rep.Candidates).
		Int("wanted", rep.Wanted).Int("written", rep.Written).
		Int("negative", rep.Negative).Int("present", rep.Present).Int("failed", rep.Failed).Int("fenced", rep.Fenced).Int("skipped", rep.SkippedTotal()).
		Float64("coverage", rep.Coverage).Dur("took_ms", rep.Duration).Func(func(e *zerolog.Event) {
		if rep.Error != "" {
			e.Str("error", rep.Error)
		}
	}).Msg("pre-warm finished")
}

// classify matches an access-log key to its declaration. It returns the
// declaration and member, or the reason the key is skipped.
func classify(specs []*warmer.Spec, key string) (*warmer.Spec, string, string) {
	if len(key) > MaxLogKeyBytes {
		return nil, "", SkipTooLong
	}
	for _, s := range specs {
		if ns := s.Template.Namespace(); ns != "" && keytmpl.InNamespace(key, ns) {
			return nil, "", SkipNamespace
		}
	}
	var family *warmer.Spec
	for _, s := range specs {
		if !s.Template.IsFamily() {
			if key == s.Template.String() {
				return s, "", ""
			}
			continue
		}
		if family == nil && s.Template.CouldMatch(key) {
			family = s
		}
	}
	if family != nil {
		// Template literals hold no whitespace or control characters, and
		// Match validates the member: a match is a clean key.
		if member, ok := family.Template.Match(key); ok {
			return family, member, ""
		}
	}
	// Not loadable; say why.
	if key == "" || !utf8.ValidString(key) || strings.ContainsFunc(key, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r)
	}) {
		return nil, "", SkipMalformed
	}
	if family == nil {
		return nil, "", SkipUnknown
	}
	return nil, "", SkipInvalidMember
}

// quoteKey makes a hostile key safe and short for a log line.
func quoteKey(k string) string {
	if len(k) > 80 {
		k = k[:80]
	}
	return fmt.Sprintf("%q", k)
}

// ErrBusy is returned by Start while a pre-warm is running.
var ErrBusy = errors.New("a pre-warm is already running")

type metrics struct {
	runs            *prometheus.CounterVec
	keys            *prometheus.CounterVec
	duration        prometheus.Histogram
	coverage        prometheus.Gauge
	accessLogErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		runs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_prewarm_runs_total",
			Help: "Pre-warm runs by result (ok, partial, error: nothing loaded, or the access log could not be read).",
		}, []string{"result"}),
		keys: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_prewarm_keys_total",
			Help: "Keys handled by pre-warms, by outcome (written, negative, present: left alone by a set-if-absent pre-warm, failed, skipped_<reason>; a copy from a source Redis also copied, from_origin, source_skipped_<reason>).",
		}, []string{"outcome"}),
		duration: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "hearth_prewarm_duration_seconds",
			Help:    "Wall time of a pre-warm run.",
			Buckets: prometheus.ExponentialBuckets(0.01, 3, 10),
		}),
		coverage: f.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_prewarm_coverage_ratio",
			Help: "Share of the wanted keys the last pre-warm loaded (value or negative sentinel).",
		}),
		accessLogErrors: f.NewCounter(prometheus.CounterOpts{
			Name: "hearth_prewarm_access_log_errors_total",
			Help: "Pre-warms that could not read the access log to its end (they loaded the declared single keys and the keys read before the error; result error, coverage below 1).",
		}),
	}
	for _, o := range []string{"written", "negative", "present", "failed", "skipped_" + SkipTooLong, "skipped_" + SkipMalformed,
		"skipped_" + SkipUnknown, "skipped_" + SkipInvalidMember, "skipped_" + SkipNamespace, "skipped_" + SkipDuplicate,
		"copied", "from_origin", "source_skipped_" + CopySkipWrongType, "source_skipped_" + CopySkipNoTTL, "source_skipped_" + CopySkipTooLarge} {
		m.keys.WithLabelValues(o)
	}
	for _, r := range []string{"ok", "partial", "error"} {
		m.runs.WithLabelValues(r)
	}
	return m
}

// Rewarm is the pre-warm a re-warm runs (warmer.RewarmOptions.Prewarm): po
// for the reason given and unpaced (the engine's load bound and each source's
// protection still apply), reading only the access-log keys keep accepts
// when keep is set (a re-warm of one Cluster master's slots).
func (p *Prewarmer) Rewarm(po Options) func(ctx context.Context, reason string, keep func(string) bool) error {
	return func(ctx context.Context, reason string, keep func(string) bool) error {
		po := po
		po.Reason, po.Rate = reason, 0
		if keep != nil && po.AccessLog != nil {
			po.AccessLog = filteredLog{po.AccessLog, keep}
		}
		_, err := p.Run(ctx, po)
		return err
	}
}

// filteredLog passes on the access-log keys keep accepts.
type filteredLog struct {
	AccessLog
	keep func(string) bool
}

func (f filteredLog) EachTopKey(ctx context.Context, window time.Duration, n int, fn func(key string)) error {
	return f.AccessLog.EachTopKey(ctx, window, n, func(key string) {
		if f.keep(key) {
			fn(key)
		}
	})
}
