// Package leader is Hearth's lease mechanism: the Redis lease with fencing
// epochs (Lease; Campaign returns a Term, whose context ends with it, after
// raising the Fence to its epoch). It knows leases only: the fenced writes
// are package fence's (a term writes through its fence.Writer), and what a
// leader does with its term is the daemon's (daemon/term.go); see
// docs/leadership.md.
package leader
