// Package fence is the leader's fenced writes: the store whose every write
// Redis refuses once a newer leader exists (FencedStore), the writer bound to
// one term's epoch that every batch of the term writes through (Writer, handed
// out by Gate), the version-checked writes, and the fence-aware writes of a
// one-shot pre-warm. The lease and its terms are package leader's; see
// docs/leadership.md.
package fence
