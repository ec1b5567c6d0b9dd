// Package soak is Hearth's nemesis soak: a seeded schedule of faults (processes
// killed, paused, drained and reloaded; Redis restarted, flushed and paused;
// PostgreSQL stopped; the origin's connections slowed and reset; one
// instance's link to Redis slowed, narrowed, reset or cut) and an outside
// checker that judges what a reader of Redis saw.
//
// The checker shares no code with Hearth: it sees the rows the updater
// committed to PostgreSQL, the values, version records, fence and lease an
// observer read from Redis, and what each instance's /metrics said, and
// judges them against the rules and windows of docs/soak.md. The harness that runs real processes is
// TestSoak in soak_test.go (`make soak`).
package soak

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Kind names a fault.
type Kind string

// The faults of the schedule. Instance faults target the leader or a standby
// (resolved when the fault starts); server faults target Redis, PostgreSQL or
// the proxy in front of PostgreSQL.
const (
	Kill        Kind = "kill -9 + restart"
	PauseShort  Kind = "SIGSTOP < lease"
	PauseLong   Kind = "SIGSTOP > lease"
	Term        Kind = "SIGTERM + restart"
	Reload      Kind = "hot reload (SIGHUP)"
	RedisDown   Kind = "redis stopped + started"
	RedisFlush  Kind = "FLUSHDB"
	RedisPause  Kind = "redis paused"
	PGDown      Kind = "postgres stopped + started"
	OriginSlow  Kind = "origin latency"
	OriginReset Kind = "origin connections reset"
	// One instance's link to Redis (its own proxy; the others and the
	// observer reach Redis directly).
	LinkSlow   Kind = "redis link latency"
	LinkNarrow Kind = "redis link bandwidth"
	LinkReset  Kind = "redis link resets"
	LinkCut    Kind = "redis link cut (one-way)"
	LinkRenew  Kind = "redis replies slow at renewal"
	// The Cluster variant's faults (SOAK_CLUSTER=1), each on one node of a
	// 3-master, 3-replica Redis Cluster.
	MasterKill  Kind = "master kill -9 + rejoin"
	Failover    Kind = "CLUSTER FAILOVER"
	Reshard     Kind = "reshard 2,000 slots"
	MasterPause Kind = "master paused < node-timeout"
)

// InstanceKinds, ServerKinds and LinkKinds are the three tracks of the
// schedule; faults of one track follow each other, the tracks overlap.
var (
	InstanceKinds = []Kind{Kill, PauseShort, PauseLong, Term, Reload}
	ServerKinds   = []Kind{RedisDown, RedisFlush, RedisPause, PGDown, OriginSlow, OriginReset}
	LinkKinds     = []Kind{LinkSlow, LinkNarrow, LinkReset, LinkCut, LinkRenew}
)

// In the Cluster variant the server track keeps the origin's faults only and
// a cluster track replaces the link track: a Redis restart, FLUSHDB and pause
// of the only node become a master's kill -9, failover and pause; the link
// faults are left out (Hearth finds the nodes by CLUSTER SLOTS, so a proxy in
// front of one seed would not carry its traffic).
var (
	ClusterServerKinds = []Kind{PGDown, OriginSlow, OriginReset}
	ClusterKinds       = []Kind{MasterKill, Failover, Reshard, MasterPause}
)

// AllKinds is every fault kind of the single-node soak, in the order the
// verdict prints them.
func AllKinds() []Kind { return Params{}.Kinds() }

// Tracks are the schedule's tracks: instance, server and link faults on a
// single node; instance, origin and cluster faults on a Cluster.
func (p Params) Tracks() [][]Kind {
	if p.Cluster {
		return [][]Kind{InstanceKinds, ClusterServerKinds, ClusterKinds}
	}
	return [][]Kind{InstanceKinds, ServerKinds, LinkKinds}
}

// Kinds is every fault kind of the soak p describes, in the order the verdict
// prints them.
func (p Params) Kinds() []Kind {
	var out []Kind
	for _, t := range p.Tracks() {
		out = append(out, t...)
	}
	return out
}

// Params are the timings of the soak's config and of Hearth's documented
// behaviour that the windows are built from.
type Params struct {
	TTL, Interval, LoadTimeout time.Duration
	Spread                     float64
	Lease, Retry               time.Duration
	MaxStale                   time.Duration
	RewarmCheck                time.Duration
	RewarmGap                  time.Duration // re-warms are coalesced at least this far apart (10 s)
	BreakerOpenFor             time.Duration
	Slack                      time.Duration // scheduling noise of 2 shared cores under -race
	// Cluster: the soak runs on a Redis Cluster (its tracks, per-slot fences
	// and per-master windows).
	Cluster bool
	// TolerateSpill reports FAILOVER-SPILL without failing the run
	// (SOAK_CLUSTER_TOLERATE_SPILL=1): the known cost of a failover, issue 26.
	TolerateSpill bool
}

// Cycle is how long a healthy leader may take to rewrite every key: one
// interval, the pacing spread over it, one load, and the slack.
func (p Params) Cycle() time.Duration {
	return p.Interval + time.Duration(float64(p.Interval)*p.Spread) + p.LoadTimeout + p.Slack
}

// Takeover is how long a standby may take to lead and catch up after the
// leader went: lease + retry period, one load for the catch-up, the slack.
func (p Params) Takeover() time.Duration { return p.Lease + p.Retry + p.LoadTimeout + p.Slack }

// HardStale bounds the age of any value, faults or not: a value is kept alive
// at most max_stale past its last good load, and then lives one TTL.
func (p Params) HardStale() time.Duration { return p.MaxStale + p.TTL + p.Cycle() }

// Event is a fault as it was executed.
type Event struct {
	Kind       Kind
	Target     string // process (name#generation) for instance faults, else the server
	Start, End time.Time
	Note       string
	// Slots are the slots the target master served when a cluster fault
	// began, as [start, end] ranges (nil for other faults).
	Slots [][2]int
	// Promoted is when a failover's replica became master (kill -9 and
	// CLUSTER FAILOVER).
	Promoted time.Time
	// Up is when a restarted Redis accepted connections again (redis
	// stopped + started): the first PING answered on a new connection.
	Up time.Time
}

// Read is one pass of the observer over every key: version per key index, -1
// for absent, -2 for a value that is not one the origin produces. One MGET
// reads the values, their version records, the fence and the lease, so they
// are one instant of Redis.
type Read struct {
	Sent, Recv time.Time
	Versions   []int64
	Raw        []string // the values, kept only for unparsable ones
	// Records holds each key's version record as Hearth's docs spell it,
	// <epoch>:<seq>:<version>:<hash> (the writer's epoch first), "" when
	// absent or for a family without records; nil when none was read.
	Records []string
	// Fence is the epoch the fence key held, Lease the epoch in the lease key
	// (<epoch>:<token>); 0 when absent, Lease -1 when it could not be read.
	Fence, Lease int64
	// Fences is, on a Cluster, each key's own fence (its slot's), read with
	// the key and its record in one MGET; nil on a single node, where Fence
	// guards every key.
	Fences []int64
	// Unread marks the keys whose MGET failed (their master down, paused or
	// failing over): nothing is judged of them in this read. Nil when every
	// key was read.
	Unread []bool
}

func (rd *Read) unread(i int) bool { return rd.Unread != nil && rd.Unread[i] }

// Commit is a version the updater committed: Ack is when COMMIT returned (the
// real commit is earlier, so staleness measured from Ack is never overstated).
type Commit struct {
	Version int64
	Ack     time.Time
}

// Sample is one scrape of an instance's /metrics.
type Sample struct {
	Proc       string // name#generation: one process
	Sent, Recv time.Time
	Leader     bool
	Epoch      int64
	Writes     float64 // hearth_keys_written_total + hearth_stale_extensions_total: writes that landed
}

// Input is everything one soak recorded.
type Input struct {
	Params  Params
	Start   time.Time // judging starts here (every key warm)
	End     time.Time
	Keys    []string
	Events  []Event
	Reads   []Read
	Commits [][]Commit // per key index, ascending versions
	Samples []Sample
	Crashes []string // processes whose output shows a panic or a data race
	// LeaseKey is the lease's key name: on a Cluster, a master killed while
	// serving its slot may come back (promoted) without the last lease.
	LeaseKey string
}

// Rule names a checker rule.
type Rule string

// The rules.
const (
	Missing    Rule = "MISSING"
	Regression Rule = "REGRESSION"
	Staleness  Rule = "STALENESS"
	Foreign    Rule = "FOREIGN"
	SameEpoch  Rule = "SAME-EPOCH"
	TwoWriters Rule = "TWO-WRITERS"
	Lease      Rule = "LEASE"
	Crash      Rule = "CRASH"
	// FailoverSpill is a key absent on a master that did not fail, during a
	// failover of another (kill -9 or CLUSTER FAILOVER, to the promotion +
	// takeover): the known cost of issue 26 item 4, reported apart from
	// MISSING and tolerated only with Params.TolerateSpill.
	FailoverSpill Rule = "FAILOVER-SPILL"
)

// Violation is one breach, with the time span it covers.
type Violation struct {
	Rule        Rule
	Key         string
	First, Last time.Time
	Count       int
	Detail      string
}

// Report is the checker's verdict.
type Report struct {
	Violations []Violation
	Reads      int
	Absent     int // absences excused by a window
	MaxAge     time.Duration
	MaxAgeKey  string
	MaxAbsent  time.Duration // longest a key stayed absent (first absent read to the next read that found it)
	// WriterChecks counts the scrape intervals in which a process landed
	// writes that TWO-WRITERS judged.
	WriterChecks int
	// RecordWrites counts the writes seen in the version records (a record
	// that changed between two reads), each judged by TWO-WRITERS and LEASE.
	RecordWrites int
	Commits      int
	Epochs       int
	Leaders      int // distinct processes that led
	// Kinds is, per fault kind, how often it ran and the longest absence
	// that overlapped one of its windows.
	Kinds []KindStat
	// Failovers is, per failover (kill -9 of a master, CLUSTER FAILOVER),
	// what went missing on the failed master and on the others.
	Failovers []FailoverStat
	// Tolerated are the FAILOVER-SPILL violations, kept out of Violations
	// when Params.TolerateSpill is set.
	Tolerated []Violation
}

// FailoverStat is what one failover cost, from the fault to the promotion
// plus a takeover (lengthened by the faults overlapping that, as the
// FAILOVER-SPILL window): absent key-reads and distinct keys absent, on the master
// that failed (its slots when the fault began) and on the others, and the
// key-reads that could not be read at all (the failed master's, until the
// promotion).
type FailoverStat struct {
	Kind                          Kind
	Target                        string
	Start                         time.Time
	Promotion                     time.Duration // fault to promotion
	Until                         time.Time     // the window's end
	FailedReads, FailedKeys       int
	SurvivingReads, SurvivingKeys int
	Unread                        int
}

// KindStat is what one fault kind did in a soak.
type KindStat struct {
	Kind      Kind
	Count     int           // executed (not skipped for want of a target)
	MaxAbsent time.Duration // the longest key absence overlapping the fault's window
	// MaxFromUp is, over the runs that know when Redis accepted connections
	// again (Event.Up: a Redis restart), the longest time from that moment
	// to every key back (BackAfter); FromUp lists each run's.
	MaxFromUp time.Duration
	FromUp    []time.Duration
}

// OK reports whether there was no violation.
func (r Report) OK() bool { return len(r.Violations) == 0 }

type window struct{ start, end time.Time }

func (w window) overlaps(a, b time.Time) bool { return !a.After(w.end) && !b.Before(w.start) }

func dataLoss(k Kind) bool { return k == RedisDown || k == RedisFlush }

func failover(k Kind) bool { return k == MasterKill || k == Failover }

// keyWindow is a window for some keys: every key when slots is nil, else the
// keys in slots (or outside them, when outside is set).
type keyWindow struct {
	window
	slots   [][2]int
	outside bool
	spill   bool // a failover's spill window: its absences are FAILOVER-SPILL
	ev      int  // the event it came from
}

func (w keyWindow) covers(slot int) bool {
	return w.slots == nil || inSlots(w.slots, slot) != w.outside
}

// promoted is when e's replica was promoted, or its end if it never was.
func promoted(e Event) time.Time {
	if e.Promoted.IsZero() {
		return e.End
	}
	return e.Promoted
}

// missingWindows are the spans in which a declared key may be absent: after
// Redis lost its data (restart, FLUSHDB), until the coalesced re-warm or a new
// term's catch-up has run; while Redis is paused and until the new term's
// catch-up reloaded the keys that expired meanwhile. A window that overlaps
// another fault (no leader, origin down) lasts until that fault's own window
// ends plus a takeover, since the reload cannot happen before.
//
// On a Cluster the windows are a master's: a paused master's keys until
// SIGCONT + takeover; a failed master's keys (kill -9, CLUSTER FAILOVER) until
// the promotion + re-warm gap + rewarm_check + takeover (the promoted
// replica's new run_id re-warms its keys, and the lease may have been there).
// A failover also has a spill window for the keys of the other masters, from
// the fault to the promotion + takeover: their absences are FAILOVER-SPILL,
// not excused. A failover's own staleness window does not lengthen its
// windows (its end is the old master's rejoin, not the promotion).
func missingWindows(p Params, evs []Event) []keyWindow {
	var ms []keyWindow
	for n, e := range evs {
		switch e.Kind {
		case RedisDown, RedisFlush:
			ms = append(ms, keyWindow{window: window{e.Start, e.End.Add(p.RewarmGap + p.RewarmCheck + p.Takeover())}, ev: -1})
		case RedisPause:
			ms = append(ms, keyWindow{window: window{e.Start, e.End.Add(p.Takeover())}, ev: -1})
		case MasterPause:
			ms = append(ms, keyWindow{window: window{e.Start, e.End.Add(p.Takeover())}, slots: e.Slots, ev: -1})
		case MasterKill, Failover:
			ms = append(ms, keyWindow{window: window{e.Start, promoted(e).Add(p.RewarmGap + p.RewarmCheck + p.Takeover())}, slots: e.Slots, ev: -1},
				keyWindow{window: window{e.Start, promoted(e).Add(p.Takeover())}, slots: e.Slots, outside: true, spill: true, ev: -1})
		default:
			continue
		}
		for i := len(ms) - 1; i >= 0 && ms[i].ev < 0; i-- {
			ms[i].ev = n
		}
	}
	var others []window
	var from []int
	for n, e := range evs {
		if e.Kind != Reload {
			others = append(others, window{e.Start, e.End.Add(recovery(p, e.Kind))})
			from = append(from, n)
		}
	}
	// A spill window is lengthened by the faults overlapping it as it was
	// planned (one in progress at the promotion may delay the takeover), not
	// from one to the next: an absence long after the failover is not its cost.
	for i := range ms {
		if !ms[i].spill {
			continue
		}
		orig := ms[i].window
		for k, o := range others {
			if from[k] != ms[i].ev && o.overlaps(orig.start, orig.end) {
				if end := o.end.Add(p.Takeover()); end.After(ms[i].end) {
					ms[i].end = end
				}
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for i := range ms {
			if ms[i].spill {
				continue
			}
			for k, o := range others {
				if from[k] == ms[i].ev && failover(evs[ms[i].ev].Kind) {
					continue
				}
				if o.overlaps(ms[i].start, ms[i].end) {
					if end := o.end.Add(p.Takeover()); end.After(ms[i].end) {
						ms[i].end, changed = end, true
					}
				}
			}
			for j := range ms {
				if j != i && !ms[j].spill && ms[j].slots == nil && ms[j].overlaps(ms[i].start, ms[i].end) && ms[j].end.After(ms[i].end) {
					ms[i].end, changed = ms[j].end, true
				}
			}
		}
	}
	return ms
}

// staleWindows are the spans in which refreshing may stop: every fault but a
// hot reload, from its start to its end plus the time Hearth documents for
// recovering from it.
func staleWindows(p Params, evs []Event) []window {
	var ws []window
	for _, e := range evs {
		if e.Kind == Reload {
			continue
		}
		ws = append(ws, window{e.Start, e.End.Add(recovery(p, e.Kind))})
	}
	return ws
}

// recovery is how long after its end a fault may still hold refreshing up.
// A link fault may end the target's term (its renewals time out or are
// refused), so it recovers like a leader that went.
func recovery(p Params, k Kind) time.Duration {
	switch k {
	case Kill, PauseShort, PauseLong, Term, RedisPause, LinkSlow, LinkNarrow, LinkReset, LinkCut, LinkRenew,
		MasterPause, Reshard:
		return p.Takeover()
	case RedisDown, RedisFlush, MasterKill, Failover:
		return p.RewarmGap + p.RewarmCheck + p.Takeover()
	case PGDown, OriginSlow, OriginReset:
		return p.BreakerOpenFor + p.LoadTimeout + p.Slack
	}
	return 0
}

// longestUndisturbed is the longest stretch of [a, b] outside every window.
func longestUndisturbed(a, b time.Time, ws []window) time.Duration {
	var cut []window
	for _, w := range ws {
		if w.overlaps(a, b) {
			cut = append(cut, w)
		}
	}
	sort.Slice(cut, func(i, j int) bool { return cut[i].start.Before(cut[j].start) })
	var best time.Duration
	cur := a
	for _, w := range cut {
		if w.start.After(cur) {
			best = max(best, w.start.Sub(cur))
		}
		if w.end.After(cur) {
			cur = w.end
		}
	}
	if b.After(cur) {
		best = max(best, b.Sub(cur))
	}
	return best
}

// Judge applies every rule to what one soak recorded.
func Judge(in Input) Report {
	p := in.Params
	r := Report{}
	open := map[string]int{} // rule+key → index of the violation being extended
	flag := func(rule Rule, key string, at time.Time, detail string) {
		id := string(rule) + "\x00" + key
		if i, ok := open[id]; ok && at.Sub(r.Violations[i].Last) < 2*time.Second {
			r.Violations[i].Last, r.Violations[i].Count = at, r.Violations[i].Count+1
			return
		}
		r.Violations = append(r.Violations, Violation{Rule: rule, Key: key, First: at, Last: at, Count: 1, Detail: detail})
		open[id] = len(r.Violations) - 1
	}

	for _, c := range in.Crashes {
		flag(Crash, "", in.Start, c)
	}

	missing := missingWindows(p, in.Events)
	stale := staleWindows(p, in.Events)
	slots := make([]int, len(in.Keys))
	for i, k := range in.Keys {
		slots[i] = Slot(k)
	}
	fos := failoverStats(p, in.Events, missing)
	foKeys := make([]map[int]bool, len(fos))
	for i := range foKeys {
		foKeys[i] = map[int]bool{}
	}
	seen := make([]int64, len(in.Keys))
	absentSince := make([]time.Time, len(in.Keys))
	var absences []window // each key's absent stretch: first absent read to the next read that found it
	for _, cs := range in.Commits {
		r.Commits += len(cs)
	}
	for _, rd := range in.Reads {
		if rd.Sent.Before(in.Start) {
			continue
		}
		r.Reads++
		var now []keyWindow
		for _, w := range missing {
			if w.overlaps(rd.Sent, rd.Recv) {
				now = append(now, w)
			}
		}
		var foNow []int
		for j, f := range fos {
			if f.w.overlaps(rd.Sent, rd.Recv) {
				foNow = append(foNow, j)
			}
		}
		for i, v := range rd.Versions {
			key := in.Keys[i]
			if rd.unread(i) {
				for _, j := range foNow {
					fos[j].Unread++
				}
				continue // its master did not answer: nothing to judge
			}
			if v == -1 && absentSince[i].IsZero() {
				absentSince[i] = rd.Sent
			} else if v != -1 && !absentSince[i].IsZero() {
				r.MaxAbsent = max(r.MaxAbsent, rd.Sent.Sub(absentSince[i]))
				absences = append(absences, window{absentSince[i], rd.Sent})
				absentSince[i] = time.Time{}
			}
			switch {
			case v == -1:
				for _, j := range foNow {
					if inSlots(fos[j].slots, slots[i]) {
						fos[j].FailedReads++
					} else {
						fos[j].SurvivingReads++
					}
					foKeys[j][i] = true
				}
				var excused bool
				var spill *Event
				for _, w := range now {
					if !w.covers(slots[i]) {
						continue
					}
					if !w.spill {
						excused = true
					} else if e := &in.Events[w.ev]; spill == nil || e.Start.After(spill.Start) {
						spill = e // the latest failover it overlaps
					}
				}
				switch {
				case excused:
					r.Absent++
				case spill != nil:
					flag(FailoverSpill, key, rd.Sent, fmt.Sprintf("absent on a master that did not fail, during %s of %s at %s (promoted after %s)",
						spill.Kind, spill.Target, clock(spill.Start), promoted(*spill).Sub(spill.Start).Round(time.Millisecond)))
				default:
					flag(Missing, key, rd.Sent, "absent outside every documented window")
				}
				continue
			case v == -2:
				raw := ""
				if i < len(rd.Raw) {
					raw = rd.Raw[i]
				}
				flag(Foreign, key, rd.Sent, fmt.Sprintf("value %q is not one the origin produces", raw))
				continue
			}
			if v < seen[i] {
				flag(Regression, key, rd.Sent, fmt.Sprintf("version %d after %d was seen", v, seen[i]))
			} else {
				seen[i] = v
			}
			// The first commit newer than what was read: the value is at
			// least as old as that commit.
			cs := in.Commits[i]
			j := sort.Search(len(cs), func(j int) bool { return cs[j].Version > v })
			if j == len(cs) || !cs[j].Ack.Before(rd.Sent) {
				continue
			}
			age := rd.Sent.Sub(cs[j].Ack)
			if age > r.MaxAge {
				r.MaxAge, r.MaxAgeKey = age, key
			}
			if age > p.HardStale() {
				flag(Staleness, key, rd.Sent, fmt.Sprintf("version %d, %d committed %s earlier: over max_stale + ttl + cycle %s", v, cs[j].Version, age.Round(time.Millisecond), p.HardStale()))
			} else if u := longestUndisturbed(cs[j].Ack, rd.Sent, stale); u > p.Cycle() {
				flag(Staleness, key, rd.Sent, fmt.Sprintf("version %d, %d committed %s earlier, %s of it with no fault: over the cycle %s", v, cs[j].Version, age.Round(time.Millisecond), u.Round(time.Millisecond), p.Cycle()))
			}
		}
	}

	if len(in.Reads) > 0 {
		last := in.Reads[len(in.Reads)-1].Sent
		for _, a := range absentSince {
			if !a.IsZero() {
				r.MaxAbsent = max(r.MaxAbsent, last.Sub(a))
				absences = append(absences, window{a, last})
			}
		}
	}
	r.Kinds = kindStats(p, in.Events, absences, in.Reads, len(in.Keys))
	for j := range fos {
		for i := range foKeys[j] {
			if inSlots(fos[j].slots, slots[i]) {
				fos[j].FailedKeys++
			} else {
				fos[j].SurvivingKeys++
			}
		}
		r.Failovers = append(r.Failovers, fos[j].FailoverStat)
	}

	judgeWriters(in, &r, flag)
	judgeRecords(in, &r, flag)
	sort.SliceStable(r.Violations, func(i, j int) bool { return r.Violations[i].First.Before(r.Violations[j].First) })
	if p.TolerateSpill {
		kept := r.Violations[:0]
		for _, v := range r.Violations {
			if v.Rule == FailoverSpill {
				r.Tolerated = append(r.Tolerated, v)
			} else {
				kept = append(kept, v)
			}
		}
		r.Violations = kept
	}
	return r
}

type failoverWindow struct {
	FailoverStat
	w     window
	slots [][2]int
}

// failoverStats are the failovers of evs, each with its spill window: the
// fault to the promotion + takeover, lengthened by the faults overlapping it.
func failoverStats(p Params, evs []Event, ms []keyWindow) []failoverWindow {
	var out []failoverWindow
	for n, e := range evs {
		if !failover(e.Kind) || strings.HasPrefix(e.Note, "skipped") {
			continue
		}
		w := window{e.Start, promoted(e).Add(p.Takeover())}
		for _, m := range ms {
			if m.spill && m.ev == n {
				w = m.window
			}
		}
		out = append(out, failoverWindow{
			FailoverStat: FailoverStat{Kind: e.Kind, Target: e.Target, Start: e.Start, Promotion: promoted(e).Sub(e.Start), Until: w.end},
			w:            w,
			slots:        e.Slots,
		})
	}
	return out
}

// judgeWriters applies SAME-EPOCH and TWO-WRITERS to the scrapes.
//
// SAME-EPOCH: two processes never lead with the same epoch.
//
// TWO-WRITERS: a process X whose latest epoch e stayed the same between two
// scrapes s1 and s2, and whose landed writes grew between them, wrote with
// epoch e after s1 was sent. If another process Y had already been seen
// leading with an epoch above e before that, Y had raised every fence to its
// epoch, so X's writes must have been refused: a violation. A write counted
// after s1 may have landed a little before (the count follows the reply), so
// s1 must be sent at least guard after Y was seen, with X running (not
// SIGSTOPped) through the guard; and a Redis data loss (restart, FLUSHDB)
// after Y raised its fences takes the fences with it, so it excuses the pair.
func judgeWriters(in Input, r *Report, flag func(Rule, string, time.Time, string)) {
	const guard = 2 * time.Second
	byProc := map[string][]Sample{}
	epochOwner := map[int64]string{}
	leaders := map[string]bool{}
	for _, s := range in.Samples {
		byProc[s.Proc] = append(byProc[s.Proc], s)
		if !s.Leader || s.Epoch <= 0 {
			continue
		}
		leaders[s.Proc] = true
		if o, ok := epochOwner[s.Epoch]; ok && o != s.Proc {
			flag(SameEpoch, "", s.Recv, fmt.Sprintf("%s and %s both lead with epoch %d", o, s.Proc, s.Epoch))
		} else {
			epochOwner[s.Epoch] = s.Proc
		}
	}
	r.Epochs, r.Leaders = len(epochOwner), len(leaders)

	// First sighting of each (proc, epoch) as leader, and the scrape before it.
	type sighting struct {
		proc     string
		epoch    int64
		seen     time.Time // Recv of the first scrape showing it
		raisedBy time.Time // the fences were raised after this (the previous scrape's Sent)
	}
	var sightings []sighting
	for proc, ss := range byProc {
		last := map[int64]bool{}
		for i, s := range ss {
			if !s.Leader || s.Epoch <= 0 || last[s.Epoch] {
				continue
			}
			last[s.Epoch] = true
			before := s.Sent.Add(-time.Hour)
			if i > 0 {
				before = ss[i-1].Sent
			}
			sightings = append(sightings, sighting{proc, s.Epoch, s.Recv, before})
		}
	}
	stopped := map[string][]window{}
	var losses []time.Time
	for _, e := range in.Events {
		switch {
		case e.Kind == PauseShort || e.Kind == PauseLong:
			stopped[e.Target] = append(stopped[e.Target], window{e.Start, e.End})
		case dataLoss(e.Kind), e.Kind == MasterKill:
			// A kill -9 of a master may lose the fences it had not yet
			// replicated: its promoted replica may hold older ones.
			losses = append(losses, e.Start)
		}
	}
	for proc, ss := range byProc {
		for i := 1; i < len(ss); i++ {
			s1, s2 := ss[i-1], ss[i]
			if s1.Epoch <= 0 || s1.Epoch != s2.Epoch || s2.Writes <= s1.Writes {
				continue
			}
			from := s1.Sent.Add(-guard)
			paused := false
			for _, w := range stopped[proc] {
				if w.overlaps(from, s1.Sent) {
					paused = true
				}
			}
			if paused {
				continue
			}
			r.WriterChecks++
			for _, y := range sightings {
				if y.proc == proc || y.epoch <= s1.Epoch || y.seen.After(from) {
					continue
				}
				lost := false
				for _, l := range losses {
					if !l.Before(y.raisedBy) && !l.After(s2.Recv) {
						lost = true
					}
				}
				if lost {
					continue
				}
				flag(TwoWriters, "", s2.Recv, fmt.Sprintf("%s landed %.0f writes with epoch %d between %s and %s, after %s led with epoch %d (seen %s)",
					proc, s2.Writes-s1.Writes, s1.Epoch, clock(s1.Sent), clock(s2.Recv), y.proc, y.epoch, clock(y.seen)))
				break
			}
		}
	}
}

// kindStats counts the faults of each kind that ran, and the longest absence
// that overlapped one of them, from its start to its end plus its recovery;
// for a run that knows when Redis accepted connections again, how long after
// that every key was back (BackAfter).
func kindStats(p Params, evs []Event, absences []window, reads []Read, keys int) []KindStat {
	idx := map[Kind]int{}
	var out []KindStat
	for _, k := range p.Kinds() {
		idx[k] = len(out)
		out = append(out, KindStat{Kind: k})
	}
	for _, e := range evs {
		if strings.HasPrefix(e.Note, "skipped") {
			continue
		}
		i, ok := idx[e.Kind]
		if !ok {
			idx[e.Kind] = len(out)
			out = append(out, KindStat{Kind: e.Kind})
			i = len(out) - 1
		}
		out[i].Count++
		if !e.Up.IsZero() {
			d := BackAfter(e.Up, reads, keys)
			out[i].FromUp = append(out[i].FromUp, d)
			out[i].MaxFromUp = max(out[i].MaxFromUp, d)
		}
		w := window{e.Start, e.End.Add(recovery(p, e.Kind))}
		for _, a := range absences {
			if w.overlaps(a.start, a.end) {
				out[i].MaxAbsent = max(out[i].MaxAbsent, a.end.Sub(a.start))
			}
		}
	}
	return out
}

// BackAfter is how long after up (a restarted Redis accepting connections
// again) every key was back: from up to the end of the first read, sent at
// or after up, by which each key had been found holding a value the origin
// produces, once. The absence figure counts from the first read that found a
// key gone, which a restart's window makes the moment Redis went down; this
// one is what the re-warm alone took. Reads are in the order they were sent;
// a key a read could not reach (a Cluster master down) waits for the next.
// A key never back is counted to the last read.
func BackAfter(up time.Time, reads []Read, keys int) time.Duration {
	back := make([]bool, keys)
	left := keys
	var last time.Time
	for i := sort.Search(len(reads), func(i int) bool { return !reads[i].Sent.Before(up) }); i < len(reads); i++ {
		rd := &reads[i]
		last = rd.Recv
		for k, v := range rd.Versions {
			if k < keys && !back[k] && v >= 0 && !rd.unread(k) {
				back[k] = true
				left--
			}
		}
		if left == 0 {
			break
		}
	}
	if last.IsZero() {
		return 0
	}
	return last.Sub(up)
}

// judgeRecords applies TWO-WRITERS and LEASE to what is in Redis: the version
// records, each of which carries the epoch of the term that wrote it, read in
// the same MGET as the fence and the lease.
//
// A record that differs from the one the previous read found is a write that
// landed between the two reads (a record names its writer's load: epoch, seq,
// version and hash, so the same record is never written twice but by a
// retransmission). TWO-WRITERS: its epoch is below the highest fence an
// earlier read saw. A leader raises the fence to its epoch before its term
// begins and the fence never goes down, so a write with an older epoch after
// that read had to be refused. Only a data loss (Redis restart or FLUSHDB)
// takes the fence away: it resets what the checker saw of it.
//
// LEASE: its epoch's lease was seen gone (another epoch or no one in the lease
// key, after a read saw that epoch hold it) more than leaseGuard before the
// previous read. The holder stops counting itself leader before Redis expires
// its lease, so a write that lands later was in flight that long: more than
// the client's timeout plus the link's delay. A data loss takes the lease with
// it, so it excuses the epoch (its holder learns at its next renewal); a
// SIGSTOP of the epoch's process (from /metrics) excuses it too, since a
// process stopped between its check and its write sends it when it wakes (the
// fence, not the lease, stops that one).
//
// On a Cluster each key is judged against its own slot's fence, read with it;
// a kill -9 of a master is a data loss for the slots it served (its replica
// may not have the last fences; the lease too, if its slot was there).
//
// On a Cluster a leader whose lease's master does not answer writes on under
// its failover grace (leader.failover_grace), past its lease, to the slots
// whose fences still carry its epoch. LEASE still holds unchanged there: the
// grace starts only while the lease's master does not answer, and the checker
// reads the lease from that same master. A kill -9 of it resets what was seen
// held (above), so the promoted replica's empty lease ends no epoch; a paused
// master, once it answers, shows the leader's lease (renewed, or expired: the
// leader's next renewal, at most a retry period later, sees that too and
// ends the term). What the grace adds — a leader cut off from the lease's
// master alone, writing while another takes over — is not in the schedule
// (no per-instance link fault runs on a Cluster); there the bound would be
// the lease seen gone + the new leader's raise (its fences refuse the old
// epoch, TWO-WRITERS) and at most leader.failover_grace.
func judgeRecords(in Input, r *Report, flag func(Rule, string, time.Time, string)) {
	type loss struct {
		at    time.Time
		slots [][2]int // nil: every slot
	}
	var losses []loss
	stopped := map[string][]window{}
	for _, e := range in.Events {
		switch {
		case dataLoss(e.Kind):
			losses = append(losses, loss{at: e.Start})
		case e.Kind == MasterKill:
			losses = append(losses, loss{at: e.Start, slots: e.Slots})
		case e.Kind == PauseShort || e.Kind == PauseLong:
			stopped[e.Target] = append(stopped[e.Target], window{e.Start, e.End})
		}
	}
	sort.Slice(losses, func(i, j int) bool { return losses[i].at.Before(losses[j].at) })
	slots := make([]int, len(in.Keys))
	for i, k := range in.Keys {
		slots[i] = Slot(k)
	}
	leaseSlot := -1
	if in.LeaseKey != "" {
		leaseSlot = Slot(in.LeaseKey)
	}
	owner := map[int64]string{}
	for _, s := range in.Samples {
		if s.Leader && s.Epoch > 0 && owner[s.Epoch] == "" {
			owner[s.Epoch] = s.Proc
		}
	}
	last := make([]string, len(in.Keys))
	var prev *Read
	floor := make([]int64, len(in.Keys)) // the highest fence seen guarding each key
	floorAt := make([]time.Time, len(in.Keys))
	rebase := make([]bool, len(in.Keys))
	held := map[int64]bool{}       // epochs seen holding the lease since the last data loss
	ended := map[int64]time.Time{} // epoch → the read that found its lease gone
	li := 0
	for k := range in.Reads {
		rd := &in.Reads[k]
		for ; li < len(losses) && !losses[li].at.After(rd.Recv); li++ {
			l := losses[li]
			for i := range floor {
				if l.slots == nil || inSlots(l.slots, slots[i]) {
					floor[i] = 0
					// The promoted replica may hold an older record: the
					// next one read is where judging starts again.
					rebase[i] = l.slots != nil
				}
			}
			if l.slots == nil || leaseSlot < 0 || inSlots(l.slots, leaseSlot) {
				held = map[int64]bool{}
			}
		}
		if rd.Records != nil {
			for i, rec := range rd.Records {
				if i >= len(last) || rd.unread(i) {
					continue
				}
				if rebase[i] {
					last[i], rebase[i] = rec, false
					continue
				}
				if rec == last[i] {
					continue
				}
				last[i] = rec
				if rec == "" {
					continue
				}
				key := in.Keys[i]
				es, _, _ := strings.Cut(rec, ":")
				e, err := strconv.ParseInt(es, 10, 64)
				if err != nil || strings.Count(rec, ":") != 3 {
					flag(Foreign, key, rd.Sent, fmt.Sprintf("version record %q is not <epoch>:<seq>:<version>:<hash>", rec))
					continue
				}
				r.RecordWrites++
				if prev == nil {
					continue // the first read: nothing before it to judge from
				}
				if e < floor[i] {
					flag(TwoWriters, key, rd.Sent, fmt.Sprintf("a write with epoch %d (record %s) landed between %s and %s, after the fence held epoch %d (read %s)",
						e, short(rec), clock(prev.Sent), clock(rd.Recv), floor[i], clock(floorAt[i])))
				}
				if end, ok := ended[e]; ok && prev.Sent.Sub(end) > leaseGuard {
					paused := false
					for _, w := range stopped[owner[e]] {
						if w.overlaps(end.Add(-in.Params.Lease), rd.Recv) {
							paused = true
						}
					}
					if !paused {
						flag(Lease, key, rd.Sent, fmt.Sprintf("a write with epoch %d (record %s) landed between %s and %s, %s after Redis showed that epoch's lease gone (%s)",
							e, short(rec), clock(prev.Sent), clock(rd.Recv), prev.Sent.Sub(end).Round(time.Millisecond), clock(end)))
					}
				}
			}
		}
		if rd.Lease >= 0 { // -1: the lease's master did not answer
			for e := range held {
				if e != rd.Lease {
					if _, ok := ended[e]; !ok {
						ended[e] = rd.Recv
					}
					delete(held, e)
				}
			}
			if rd.Lease > 0 {
				if _, ok := ended[rd.Lease]; !ok {
					held[rd.Lease] = true
				}
			}
		}
		for i := range floor {
			f := rd.Fence
			if rd.Fences != nil {
				f = rd.Fences[i]
			}
			if !rd.unread(i) && f > floor[i] {
				floor[i], floorAt[i] = f, rd.Sent
			}
		}
		prev = rd
	}
}

// leaseGuard is how long after Redis expired a lease a write of its term may
// still land: the client's read timeout (500 ms) plus the longest delay a
// link fault adds (500 ms of latency; 16 KB/s moves a 6 KB write of both
// families in 0.4 s), rounded up to a lease.
const leaseGuard = 1500 * time.Millisecond

// short cuts a record's hash to its first 8 digits for the report.
func short(rec string) string {
	if i := strings.LastIndexByte(rec, ':'); i >= 0 && len(rec)-i > 9 {
		return rec[:i+9]
	}
	return rec
}

func clock(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// Format renders the verdict, the fault timeline and the violations.
func Format(in Input, r Report, seed uint64) string {
	var b strings.Builder
	off := func(t time.Time) string { return fmt.Sprintf("%7.2fs", t.Sub(in.Start).Seconds()) }
	verdict := "PASS"
	if !r.OK() {
		verdict = fmt.Sprintf("FAIL (%d violations)", len(r.Violations))
	} else if len(r.Tolerated) > 0 {
		verdict = fmt.Sprintf("PASS with %d FAILOVER-SPILL tolerated", len(r.Tolerated))
	}
	fmt.Fprintf(&b, "soak verdict: %s — seed %d, %s judged, %d keys\n", verdict, seed, in.End.Sub(in.Start).Round(time.Second), len(in.Keys))
	fmt.Fprintf(&b, "  reads %d (one read = every key), absences inside windows %d, commits %d, epochs %d, leading processes %d, max value age %s (%s)\n",
		r.Reads, r.Absent, r.Commits, r.Epochs, r.Leaders, r.MaxAge.Round(time.Millisecond), r.MaxAgeKey)
	fmt.Fprintf(&b, "  longest absence %s, scrape intervals with landed writes judged %d, writes seen in version records %d\n", r.MaxAbsent.Round(time.Millisecond), r.WriterChecks, r.RecordWrites)
	fmt.Fprintf(&b, "  faults by kind (runs, longest absence overlapping one; for a Redis restart, every key back after Redis accepted connections again, longest and each run):\n")
	for _, k := range r.Kinds {
		fmt.Fprintf(&b, "    %-30s %3d  %s", k.Kind, k.Count, k.MaxAbsent.Round(time.Millisecond))
		if len(k.FromUp) > 0 {
			each := make([]string, len(k.FromUp))
			for i, d := range k.FromUp {
				each[i] = d.Round(time.Millisecond).String()
			}
			fmt.Fprintf(&b, "  from accepting connections %s (%s)", k.MaxFromUp.Round(time.Millisecond), strings.Join(each, ", "))
		}
		fmt.Fprintf(&b, "\n")
	}
	if len(r.Failovers) > 0 {
		fmt.Fprintf(&b, "  failovers (fault to promotion + takeover %s, lengthened by the faults overlapping it): absent key-reads (distinct keys) on the failed master | on the surviving masters, unreadable key-reads:\n", in.Params.Takeover())
		var fr, fk, sr, sk int
		for _, f := range r.Failovers {
			fmt.Fprintf(&b, "    %s – %s  %-23s %-16s promoted after %-8s failed %4d (%2d) | surviving %4d (%2d), unread %d\n",
				off(f.Start), off(f.Until), f.Kind, f.Target, f.Promotion.Round(time.Millisecond), f.FailedReads, f.FailedKeys, f.SurvivingReads, f.SurvivingKeys, f.Unread)
			fr, fk, sr, sk = fr+f.FailedReads, fk+f.FailedKeys, sr+f.SurvivingReads, sk+f.SurvivingKeys
		}
		fmt.Fprintf(&b, "    total: failed masters %d key-reads (%d keys), surviving masters %d key-reads (%d keys)\n", fr, fk, sr, sk)
	}
	fmt.Fprintf(&b, "  windows: cycle %s, takeover %s, re-warm gap %s, max_stale+ttl+cycle %s\n", in.Params.Cycle(), in.Params.Takeover(), in.Params.RewarmGap, in.Params.HardStale())
	fmt.Fprintf(&b, "fault timeline (t=0 is %s UTC, every key warm):\n", clock(in.Start))
	for _, e := range in.Events {
		fmt.Fprintf(&b, "  %s – %s  %-28s %s %s\n", off(e.Start), off(e.End), e.Kind, e.Target, e.Note)
	}
	if len(r.Violations) > 0 {
		fmt.Fprintf(&b, "violations:\n")
		for _, v := range r.Violations {
			fmt.Fprintf(&b, "  %s – %s  %-11s %s ×%d: %s\n", off(v.First), off(v.Last), v.Rule, v.Key, v.Count, v.Detail)
		}
	}
	if len(r.Tolerated) > 0 {
		fmt.Fprintf(&b, "tolerated (SOAK_CLUSTER_TOLERATE_SPILL=1; the known cost of a failover, issue 26 item 4):\n")
		for _, v := range r.Tolerated {
			fmt.Fprintf(&b, "  %s – %s  %-11s %s ×%d: %s\n", off(v.First), off(v.Last), v.Rule, v.Key, v.Count, v.Detail)
		}
	}
	return b.String()
}
