package changes

import "time"

// Pacing: every change-driven load passes one rule, a token bucket (GCRA)
// per thing it loads. A notification is a hint from anyone who can log in
// to PostgreSQL, never a command to do unbounded work:
//   - a declaration's full refresh (a new session, a reload, "all", an overflow):
//     one per MinFullInterval (10 s), whatever path asked for it;
//   - one member: MemberBurst loads at once, then one per MemberInterval;
//     a member pending or being loaded is loaded again only after that load;
//   - every load goes through the source's protection (its rate and
//     concurrency bounds), as the schedule's do.
//
// The state outlives a listener's restart (a reload, a reconnection), so
// that no path starts with a fresh allowance.
const (
	// MemberInterval and MemberBurst pace the change-driven loads of one
	// member: a member changing over and over is loaded MemberBurst times at
	// once, then once per MemberInterval. A change to a member not loaded in
	// the last seconds waits for nothing but the coalesce wait (none by default).
	MemberInterval = time.Second
	MemberBurst    = 3
)

// pacer is a token bucket per key in its GCRA form: tat is the theoretical
// arrival time of the next load; a key may go when now ≥ tat − (burst−1)·every.
type pacer struct {
	every time.Duration
	burst int
	tat   map[string]time.Time // absent: a full bucket
	swept time.Time
}

func newPacer(every time.Duration, burst int) *pacer {
	return &pacer{every: every, burst: max(1, burst), tat: map[string]time.Time{}}
}

// due is when key may go next; the zero time (or a past one) is now.
func (p *pacer) due(key string) time.Time {
	tat, ok := p.tat[key]
	if !ok {
		return time.Time{}
	}
	return tat.Add(-time.Duration(p.burst-1) * p.every)
}

// take spends key's token for a load starting at now.
func (p *pacer) take(key string, now time.Time) {
	tat := p.tat[key]
	if tat.Before(now) {
		tat = now
	}
	p.tat[key] = tat.Add(p.every)
}

// sweep forgets the keys whose bucket is full again, at most once per
// bucket's length, so that the map holds only what was loaded lately.
func (p *pacer) sweep(now time.Time) {
	if now.Sub(p.swept) < time.Duration(p.burst)*p.every {
		return
	}
	p.swept = now
	for k, tat := range p.tat {
		if !tat.After(now) {
			delete(p.tat, k)
		}
	}
}

// pacing is one declaration's pacing state, kept by Changes across listener
// restarts. Only the declaration's queue uses it, and two queues of one
// declaration never run at once (Apply stops the old listeners first).
type pacing struct {
	full    *pacer // key "": the declaration's change-driven full refreshes
	members *pacer
}

func newPacing(minFull time.Duration) *pacing {
	return &pacing{full: newPacer(minFull, 1), members: newPacer(MemberInterval, MemberBurst)}
}
