package warmer_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/sourcetest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// recheckStore is a CheckedStore over a RedisStore that refuses the write
// of the key refused for a version record its value does not back (Recheck,
// naming record), and lands a write that names that record, unless stubborn
// (the record changed meanwhile: every write of the key is refused). It
// remembers what each write carried.
type recheckStore struct {
	store.RedisStore
	refused, record string
	stubborn        bool
	mu              sync.Mutex
	writes          [][]store.Entry
}

func (s *recheckStore) SetChecked(ctx context.Context, entries []store.Entry) ([]store.VersionCheck, error) {
	s.mu.Lock()
	s.writes = append(s.writes, slices.Clone(entries))
	s.mu.Unlock()
	checks := make([]store.VersionCheck, len(entries))
	var land []store.Entry
	for i, e := range entries {
		switch {
		case e.Key == s.refused && (s.stubborn || e.Unconfirmed != s.record):
			checks[i] = store.VersionCheck{Reason: store.RepairValueAbsent, Found: "absent", Recheck: true, Record: s.record}
		case e.Key == s.refused:
			checks[i] = store.VersionCheck{Reason: store.RepairRecordUnconfirmed, Found: "unconfirmed"}
			land = append(land, e)
		default:
			land = append(land, e)
		}
	}
	return checks, s.Set(ctx, land)
}

// memberOrigin answers every member with a versioned value and records the
// members of each load.
func memberOrigin() *sourcetest.Fake {
	f := sourcetest.New("o")
	f.Answer(func(m string) (warmer.Result, bool) {
		return warmer.Result{Value: []byte("v" + m), HasVersion: true, Version: 1}, true
	})
	return f
}

// TestRefusedUnbackedWriteIsReReadOnce: a write the store refuses for a
// version record its value does not back (Recheck) re-reads that member, and
// only it, once, in the same run, and writes it naming the record
// (Entry.Unconfirmed); the member counts as written once, and a re-read the
// store refuses again counts as failed and is left to the next run, not
// re-read in a loop.
func TestRefusedUnbackedWriteIsReReadOnce(t *testing.T) {
	env := testenv.Redis(t)
	for _, stubborn := range []bool{false, true} {
		t.Run("stubborn "+strconv.FormatBool(stubborn), func(t *testing.T) {
			spec := family(t, env.Prefix+strconv.FormatBool(stubborn)+":", "product", 5)
			spec.VersionColumn = "version"
			rs := &recheckStore{RedisStore: store.RedisStore{Client: env.Client},
				refused: spec.Template.Key("3"), record: "1:1:rec:h", stubborn: stubborn}
			o := memberOrigin()
			reg := prometheus.NewRegistry()
			w, err := warmer.New(warmer.Options{Store: rs, Sources: map[string]warmer.Source{"o": o}, Specs: []*warmer.Spec{spec},
				Registerer: reg, Logger: zerolog.Nop()})
			if err != nil {
				t.Fatal(err)
			}
			out, _ := w.Refresh(context.Background(), "product", warmer.RunOptions{})
			if loads := o.Loads(); len(loads) != 2 || !slices.Equal(loads[1], []string{"3"}) {
				t.Fatalf("loads %v, want the batch, then member 3 alone, once", loads)
			}
			if len(rs.writes) != 2 || len(rs.writes[1]) != 1 || rs.writes[1][0].Unconfirmed != rs.record {
				t.Fatalf("writes %+v, want the re-read's one entry naming the record", rs.writes)
			}
			if rs.writes[1][0].Seq <= rs.writes[0][0].Seq {
				t.Errorf("re-read stamped %d, not after the first load's %d", rs.writes[1][0].Seq, rs.writes[0][0].Seq)
			}
			want, absent, unconfirmed := 5, 1.0, 1.0
			if stubborn {
				want, absent, unconfirmed = 4, 2, 0
			}
			if out.Written != want || out.Failed != 5-want {
				t.Errorf("written %d, failed %d; want %d, %d", out.Written, out.Failed, want, 5-want)
			}
			if got := promtest.Value(t, reg, "hearth_version_repairs_total", "family", "product", "reason", "value_absent"); got != absent {
				t.Errorf("value_absent repairs %v, want %v", got, absent)
			}
			if got := promtest.Sum(t, reg, "hearth_version_repairs_total", "family", "product", "reason", "record_unconfirmed"); got != unconfirmed {
				t.Errorf("record_unconfirmed repairs %v, want %v", got, unconfirmed)
			}
			if v := env.Client.Get(context.Background(), spec.Template.Key("3")).Val(); !stubborn && v != "v3" {
				t.Errorf("member 3 = %q after the re-read, want v3", v)
			}
		})
	}
}
