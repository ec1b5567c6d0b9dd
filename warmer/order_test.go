package warmer_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/storetest"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// heldStore holds the first Set until release is closed: a write whose
// reply is slow (Redis paused, a slow link) while another run goes on.
type heldStore struct {
	*storetest.Store
	first   atomic.Bool
	held    chan struct{} // closed once the first Set is held
	release chan struct{}
}

func (h *heldStore) Set(ctx context.Context, entries []store.Entry) error {
	if h.first.CompareAndSwap(false, true) {
		close(h.held)
		<-h.release
	}
	return h.Store.Set(ctx, entries)
}

// Two runs of a plain (not version-checked) declaration at once — the
// schedule's and the origin's recovery, a re-warm or an admin refresh — never
// leave a member at the older of the two loads: the second run's load of a
// member begins only after the first run's write of it returned. Before, the
// second run read the newer rows and wrote them while the first run's write
// of the older ones was slow, and that write then landed over them.
func TestPlainRunsNeverWriteOlderOverNewer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec, src := fakeFamily(t, "plain", 6)
		spec.BatchSize = 3 // two batches a run
		if warmer.Stamped(spec) {
			t.Fatal("the declaration is version-checked; this test is about plain writes")
		}
		mem := &heldStore{Store: storetest.New(), held: make(chan struct{}), release: make(chan struct{})}
		w, err := warmer.New(warmer.Options{
			Store: mem, Sources: map[string]warmer.Source{"o": src}, Specs: []*warmer.Spec{spec},
			MaxConcurrentLoads: 8, Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop(),
		})
		if err != nil {
			t.Fatal(err)
		}
		var loads atomic.Int64
		src.OnLoad(func(context.Context, []string) { loads.Add(1) })

		var runs sync.WaitGroup
		run := func() {
			runs.Add(1)
			go func() {
				defer runs.Done()
				_, _ = w.Refresh(context.Background(), "plain", warmer.RunOptions{})
			}()
		}
		run() // loads the old values; one batch's write is held
		<-mem.held
		synctest.Wait() // the first run's other batch has written
		for _, m := range spec.Members {
			src.Set(m, []byte("new"+m))
		}
		before := loads.Load()
		run()
		synctest.Wait()
		// The second run loaded the batch whose members are free, not the
		// one whose write is held.
		if got := loads.Load() - before; got != 1 {
			t.Errorf("the second run made %d loads while the first run's write was held, want 1 (the free batch)", got)
		}
		close(mem.release)
		runs.Wait()
		for _, m := range spec.Members {
			k := spec.Template.Key(m)
			if v, _ := mem.Get(k); string(v) != "new"+m {
				t.Errorf("%s = %q after both runs, want the newer load's %q", k, v, "new"+m)
			}
		}
	})
}
