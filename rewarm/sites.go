package rewarm

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/hearth-dev/hearth/internal/neterr"
	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/store"
)

// site is one master the Rewarmer watches: its marker key (in one of the
// master's slots), the master itself and its run_id (read with the marker, in setMarker).
type site struct {
	marker string
	node   redis.UniversalClient // the master: the marker script and INFO go to it
	addr   string                // "" on a single node or Sentinel
	runID  string
	ranges [][2]int // the master's slots (Cluster only)
}

// sites lists the masters now: the client itself on a single node or
// Sentinel, every master serving slots on a Cluster.
func (r *Rewarmer) sites(ctx context.Context) ([]site, error) {
	cc, ok := r.opts.Client.(*redis.ClusterClient)
	if !ok {
		return []site{{marker: store.MarkerKey(r.opts.Namespace), node: r.opts.Client}}, nil
	}
	slots, err := cc.ClusterSlots(ctx).Result()
	if neterr.Is(err) {
		return nil, unreachedError{fmt.Errorf("cluster slots: %w", err)}
	}
	if err != nil {
		return nil, fmt.Errorf("cluster slots: %w", err)
	}
	byAddr := map[string]*site{}
	for _, s := range slots {
		if len(s.Nodes) == 0 || s.Start < 0 || s.End >= slot.Count || s.Start > s.End {
			return nil, fmt.Errorf("cluster slots: unexpected range %d-%d with %d nodes", s.Start, s.End, len(s.Nodes))
		}
		addr := s.Nodes[0].Addr
		st := byAddr[addr]
		if st == nil {
			st = &site{addr: addr}
			byAddr[addr] = st
		}
		st.ranges = append(st.ranges, [2]int{int(s.Start), int(s.End)})
	}
	out := make([]site, 0, len(byAddr))
	for _, st := range byAddr {
		sort.Slice(st.ranges, func(i, j int) bool { return st.ranges[i][0] < st.ranges[j][0] })
		st.marker = store.ClusterMarkerKey(r.opts.Namespace, st.ranges[0][0])
		out = append(out, *st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ranges[0][0] < out[j].ranges[0][0] })
	var (
		g  errgroup.Group
		mu sync.Mutex
	)
	for i := range out {
		g.Go(func() error {
			node, err := cc.MasterForKey(ctx, out[i].marker)
			if err != nil {
				return fmt.Errorf("master of %s: %w", out[i].marker, err)
			}
			mu.Lock()
			out[i].node = node
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// slotScope is the set of slots a partial re-warm loads; a nil scope is
// every slot.
type slotScope struct{ ranges [][2]int }

// scopeOf is the slots of the lost masters, or nil (all) when every master
// lost its data or Redis is not a Cluster.
func scopeOf(lost []site, of int) *slotScope {
	if len(lost) == 0 || len(lost) == of {
		return nil
	}
	s := &slotScope{}
	for _, st := range lost {
		if st.ranges == nil {
			return nil
		}
		s.ranges = append(s.ranges, st.ranges...)
	}
	return s
}

// union merges a scope carried over from an earlier loss with a new one;
// when nothing new was detected, the earlier scope stands.
func (s *slotScope) union(o *slotScope, detected bool) *slotScope {
	if !detected {
		return s
	}
	if s == nil || o == nil {
		return nil
	}
	return &slotScope{ranges: append(append([][2]int(nil), s.ranges...), o.ranges...)}
}

func (s *slotScope) has(key string) bool {
	if s == nil {
		return true
	}
	n := slot.Of(key)
	for _, r := range s.ranges {
		if n >= r[0] && n <= r[1] {
			return true
		}
	}
	return false
}

func (s *slotScope) String() string {
	if s == nil {
		return "all"
	}
	parts := make([]string, len(s.ranges))
	for i, r := range s.ranges {
		parts[i] = strconv.Itoa(r[0]) + "-" + strconv.Itoa(r[1])
	}
	return strings.Join(parts, ",")
}
