package warmer

import "context"

// Gate admits the writes of one batch and hands out the store they go
// through. A leader's gate hands out a writer bound to its current term,
// whose epoch that writer attaches to every write (fenced in Redis); a
// standby's gate refuses with leader.ErrNotLeader. The check is in memory.
// fence.FencedStore.Gate is the Gate of a leader-elected Hearth.
type Gate interface {
	Admit(ctx context.Context) (Store, error)
}
