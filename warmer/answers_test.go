package warmer_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"

	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/storetest"
	"github.com/hearth-dev/hearth/warmer"
)

// reversed answers a load in the reverse of the order asked.
type reversed struct{ warmer.Source }

func (r reversed) Load(ctx context.Context, spec *warmer.Spec, members []string) ([]warmer.Result, error) {
	rs, err := r.Source.Load(ctx, spec, members)
	slices.Reverse(rs)
	return rs, err
}

// writtenOnce fails unless each member's key was written exactly once, with
// the value "v"+member.
func writtenOnce(t *testing.T, st *storetest.Store, spec *warmer.Spec, members ...string) {
	t.Helper()
	writes := map[string]int{}
	for _, wr := range st.Writes() {
		writes[wr.Key]++
	}
	for _, m := range members {
		k := spec.Template.Key(m)
		if v, _ := st.Get(k); string(v) != "v"+m || writes[k] != 1 {
			t.Errorf("%s = %q written %d times, want %q once", k, v, writes[k], "v"+m)
		}
	}
}

// Answers are matched to the members asked whatever their order: in a
// scheduled run each member gets its own value, and a member left without
// an answer is written as not found.
func TestAnswersOutOfOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec, src := fakeFamily(t, "p", 10)
		spec.BatchSize = 10
		src.Set("3", nil) // no answer for 3
		w, st, _ := memWarmer(t, reversed{src}, 1, nil, spec)
		out, err := w.Refresh(context.Background(), "p", warmer.RunOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if out.Written != 9 || out.Negative != 1 {
			t.Errorf("outcome %+v, want 9 written and 1 not found", out)
		}
		for _, m := range spec.Members {
			v, ok := st.Get(spec.Template.Key(m))
			want := "v" + m
			if m == "3" {
				want = "" // the not-found sentinel
			}
			if !ok || string(v) != want {
				t.Errorf("%s = %q (present %v), want %q", m, v, ok, want)
			}
		}
	})
}

// A batch another caller hands in may name a member twice: it is loaded and
// written once, and its second answer is counted, not written.
func TestRepeatedMemberWrittenOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec, src := fakeFamily(t, "p", 6)
		w, st, reg := memWarmer(t, reversed{src}, 1, nil, spec)
		out, err := w.RefreshMembers(context.Background(), "p", []string{"1", "2", "1", "5"})
		if err != nil {
			t.Fatal(err)
		}
		if out.Written != 3 || out.Negative != 0 || out.Failed != 0 {
			t.Errorf("outcome %+v, want 3 written, none not found or failed", out)
		}
		writtenOnce(t, st, spec, "1", "2", "5")
		if got := promtest.Value(t, reg, "hearth_load_failures_total", "family", "p", "reason", "unexpected_member"); got != 1 {
			t.Errorf("unexpected_member = %g, want 1 (the repeated member's second answer)", got)
		}
	})
}

// A hot set handed in with a member twice, or with one the family declares,
// still gives a run distinct members: each key is written once, with its
// value, never also as not found.
func TestHotSetRepeatsWrittenOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec, src := fakeFamily(t, "p", 3)
		spec.BatchSize = 10
		spec.HotSet = &warmer.HotSet{TopN: 10}
		src.Set("h", []byte("vh"))
		w, st, _ := memWarmer(t, reversed{src}, 1, nil, spec)
		w.SetHotMembers("p", []string{"1", "h", "h"})
		out, err := w.Refresh(context.Background(), "p", warmer.RunOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if out.Members != 4 || out.Written != 4 || out.Negative != 0 {
			t.Errorf("outcome %+v, want 4 members written, none not found", out)
		}
		writtenOnce(t, st, spec, "0", "1", "2", "h")
	})
}

// inOrder answers a load in the order asked, each member once (an index
// scan: a repeated member is one row), as PostgreSQL answers a batch of ids.
type inOrder struct{ warmer.Source }

func (o inOrder) Load(ctx context.Context, spec *warmer.Spec, members []string) ([]warmer.Result, error) {
	rs, err := o.Source.Load(ctx, spec, members)
	seen := map[string]bool{}
	return slices.DeleteFunc(rs, func(r warmer.Result) bool {
		dup := seen[r.Member]
		seen[r.Member] = true
		return dup
	}), err
}

// A property of batches handed in by another caller (no known place), rising
// or not, with repeats anywhere and members the origin lacks, answered in
// order, reversed or repeated: each member is written exactly once, with its
// value, or as not found when the origin has no row for it; never both.
func TestUnplacedBatchesWriteEachMemberOnce(t *testing.T) {
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 11))
		n := 1 + r.IntN(12)
		batch := make([]string, n)
		for i := range batch {
			batch[i] = strconv.Itoa(r.IntN(15))
		}
		if r.IntN(2) == 0 { // rising, as ids in index order, with repeats kept
			slices.SortFunc(batch, func(a, b string) int {
				if warmer.MemberRises(a, b) {
					return -1
				}
				if a == b {
					return 0
				}
				return 1
			})
		}
		shape := r.IntN(3)
		synctest.Test(t, func(t *testing.T) {
			spec, src := fakeFamily(t, "p", 15)
			missing := map[string]bool{}
			for _, m := range spec.Members {
				if r.IntN(4) == 0 {
					missing[m] = true
					src.Set(m, nil)
				}
			}
			var o warmer.Source = inOrder{src}
			switch shape {
			case 1:
				o = reversed{src}
			case 2:
				o = src // a repeated member answered as often as asked
			}
			w, st, _ := memWarmer(t, o, 1, nil, spec)
			out, _ := w.RefreshMembers(context.Background(), "p", batch)
			distinct := map[string]bool{}
			wantWritten, wantNegative := 0, 0
			for _, m := range batch {
				if distinct[m] {
					continue
				}
				distinct[m] = true
				if missing[m] {
					wantNegative++
				} else {
					wantWritten++
				}
			}
			if out.Written != wantWritten || out.Negative != wantNegative || out.Failed != 0 {
				t.Errorf("seed %d, batch %q (shape %d): outcome %+v, want %d written and %d not found", seed, batch, shape, out, wantWritten, wantNegative)
			}
			writes := map[string]int{}
			for _, wr := range st.Writes() {
				writes[wr.Key]++
			}
			for m := range distinct {
				k := spec.Template.Key(m)
				v, ok := st.Get(k)
				want := "v" + m
				if missing[m] {
					want = "" // the not-found sentinel
				}
				if !ok || string(v) != want || writes[k] != 1 {
					t.Errorf("seed %d, batch %q (shape %d): %s = %q (present %v) written %d times, want %q once", seed, batch, shape, k, v, ok, writes[k], want)
				}
			}
		})
	}
}
