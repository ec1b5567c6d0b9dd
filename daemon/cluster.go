package daemon

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterStateReload is how often a cluster client reloads the slot map even
// when nothing failed (go-redis's default is a minute).
const ClusterStateReload = 5 * time.Second

// newClusterClient builds a Redis Cluster client that follows a failover at
// once. go-redis reloads its slot map on MOVED and on READONLY, but not when
// a master dies: it keeps sending that master's slots to the dead address
// (connection refused) until its periodic reload, a minute by default, and
// keys on those slots would expire meanwhile. The hook reloads the map on
// every network or CLUSTERDOWN error, and the periodic reload is shortened.
func newClusterClient(opts *redis.UniversalOptions) *redis.ClusterClient {
	co := opts.Cluster()
	co.ClusterStateReloadInterval = ClusterStateReload
	cc := redis.NewClusterClient(co)
	cc.AddHook(reloadOnFailure{cc})
	return cc
}

// reloadOnFailure asks the cluster client to reload its slot map (lazily:
// at most one reload in flight, 200 ms apart) after a command or pipeline
// failed in a way a failover or a node restart explains.
type reloadOnFailure struct{ cc *redis.ClusterClient }

func (h reloadOnFailure) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnFailure) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if topologyError(err) {
			h.cc.ReloadState(ctx)
		}
		return err
	}
}

func (h reloadOnFailure) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err != nil {
			for _, c := range cmds {
				if topologyError(c.Err()) {
					h.cc.ReloadState(ctx)
					break
				}
			}
		}
		return err
	}
}

// topologyError reports whether err says the node that was asked is gone or
// no longer serves the slot: a network error, or CLUSTERDOWN/TRYAGAIN/MASTERDOWN.
func topologyError(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	s := err.Error()
	for _, p := range []string{"CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "LOADING"} {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return strings.Contains(s, "connection refused")
}
