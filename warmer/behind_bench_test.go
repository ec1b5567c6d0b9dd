package warmer

import (
	"strconv"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/memberindex"
	"github.com/hearth-dev/hearth/keytmpl"
)

// BenchmarkOldestFirst is what ordering a run's batches by last write adds to
// a run of 1,000,000 declared members in batches of 500 (the default): one
// state lookup per member and a sort of 2,000 batches, once per run. The
// state is as a previous run with concurrent batches leaves it: batches
// finished slightly out of order, so the sort has work to do.
func BenchmarkOldestFirst(b *testing.B) {
	const n, size = 1_000_000, 500
	tp, err := keytmpl.Parse("m:{id}")
	if err != nil {
		b.Fatal(err)
	}
	spec := &Spec{Name: "m", Template: tp, TTL: time.Minute, BatchSize: size}
	members := make([]string, n)
	st := &declState{okAt: make([]int64, n)}
	t0 := time.Now().UnixNano()
	for i := range members {
		members[i] = strconv.Itoa(i)
		batch := i / size
		// Batches of four loads in flight finish in a shuffled order.
		st.okAt[i] = t0 + int64((batch^3)*int(time.Millisecond))
	}
	st.declared = memberindex.New(members)
	w := &Warmer{}
	b.Run("member order (before)", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if got := spec.Batches(members); len(got) != n/size {
				b.Fatal(len(got))
			}
		}
	})
	b.Run("oldest first", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if o := w.oldestFirst(spec, st, members); len(o.batches) != n/size {
				b.Fatal(len(o.batches))
			}
		}
	})
}
