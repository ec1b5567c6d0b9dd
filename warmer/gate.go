package warmer

import "context"

// Gate admits the writes of one batch. A leader's gate returns a context that
// carries its term, whose epoch a fenced store attaches to every write; a
// standby's gate refuses with leader.ErrNotLeader. The check is in memory.
// The leader package's Lease is the Gate of a leader-elected Hearth.
type Gate interface {
	Admit(ctx context.Context) (context.Context, error)
}
