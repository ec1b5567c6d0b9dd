// Package leader is Hearth's lease mechanism: the Redis lease with fencing
// epochs (Lease; Campaign returns a Term, whose context ends with it), and
// the store whose every write Redis refuses once a newer leader exists
// (FencedStore; a term writes through its Writer, bound to the term's epoch).
// What a leader does with its term is the daemon's (daemon/term.go); see
// docs/leadership.md.
package leader
