// Package leader is Hearth's leadership: the Redis lease with fencing epochs
// (Lease, Term), the store whose every write Redis refuses once a newer leader
// exists (FencedStore), and the campaign loop `hearth run` drives (Leadership:
// campaign, start-up load or takeover catch-up, ready, jobs; release at
// shutdown). The warmer only sees a Gate and a Store; see docs/leadership.md.
package leader
