package warmer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/hearth-dev/hearth/internal/sourcetest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// recovering is a fake origin that announces its recovery when the test
// says, on the test's goroutine, as a guarded source's prober does on its own.
type recovering struct {
	*sourcetest.Fake
	mu  sync.Mutex
	fns []func(context.Context)
}

func (r *recovering) OnRecover(fn func(context.Context)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fns = append(r.fns, fn)
}

func (r *recovering) recovered(ctx context.Context) {
	r.mu.Lock()
	fns := r.fns
	r.mu.Unlock()
	for _, fn := range fns {
		fn(ctx)
	}
}

// TestCloseEndsOwnWork: the refresh a recovery starts is the warmer's own
// work. Close abandons it mid-load and returns only once it has returned;
// after Close a recovery loads nothing, and no goroutine outlives the warmer.
func TestCloseEndsOwnWork(t *testing.T) {
	rd := testenv.Redis(t)
	opt := goleak.IgnoreCurrent()
	ctx := context.Background()
	src := &recovering{Fake: sourcetest.New("origin")}
	src.Answer(func(m string) (warmer.Result, bool) { return warmer.Result{Value: []byte("v-" + m)}, true })
	w, err := warmer.New(warmer.Options{Store: &store.RedisStore{Client: rd.Client}, Sources: map[string]warmer.Source{"o": src},
		Specs: []*warmer.Spec{family(t, rd.Prefix, "product", 2)}, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	src.Fail(errors.New("origin down"))
	if _, err := w.Refresh(ctx, "product", warmer.RunOptions{}); err == nil {
		t.Fatal("refresh over a failing origin succeeded")
	}
	src.Fail(nil)
	release := src.Block() // a recovery refresh stays in its load until it is ended
	defer release()
	var once sync.Once
	loading := make(chan struct{})
	src.OnLoad(func(context.Context, []string) { once.Do(func() { close(loading) }) })
	returned := make(chan struct{})
	go func() { defer close(returned); src.recovered(ctx) }() // the prober's goroutine
	select {
	case <-loading:
	case <-time.After(10 * time.Second):
		t.Fatal("the recovery started no refresh")
	}
	closed := make(chan struct{})
	go func() { defer close(closed); w.Close() }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the recovery refresh it owns")
	}
	select {
	case <-returned:
	default:
		t.Fatal("Close returned while the recovery refresh it owns still ran")
	}
	calls := src.Calls()
	src.recovered(ctx)
	if got := src.Calls(); got != calls {
		t.Errorf("a recovery after Close loaded %d batches, want none", got-calls)
	}
	goleak.VerifyNone(t, opt)
}
