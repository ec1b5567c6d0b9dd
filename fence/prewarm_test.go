package fence_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/prewarm"
	"github.com/hearth-dev/hearth/store"
)

// A pre-warm into a Redis where a leader writes version-checked values never
// replaces a newer version, with or without --overwrite, and leaves version
// records the leader's next write compares with. On both fence layouts.
func TestPrewarmNeverReplacesANewerVersion(t *testing.T) {
	for _, perSlot := range []bool{false, true} {
		t.Run(fmt.Sprintf("perSlot=%v", perSlot), func(t *testing.T) {
			v := newVersionEnv(t, perSlot)
			k := func(name string) string { return v.env.Prefix + name }
			// The leader's writes: versioned keys, and one of a family
			// version-checked by its load stamp alone (change notifications,
			// no version column).
			v.set(k("newer"), "v20", 5, ptr(20))
			v.set(k("older"), "v20", 6, ptr(20))
			v.set(k("stamp-only"), "leader", 7, nil)
			v.set(k("evicted"), "v20", 8, ptr(20))
			if err := v.env.Client.Del(context.Background(), k("evicted")).Err(); err != nil {
				t.Fatal(err)
			}

			write := func(overwrite bool, entries ...store.Entry) []store.SetOutcome {
				t.Helper()
				ps := prewarm.NewStore(prewarm.StoreOptions{Client: v.env.Client, Namespace: v.env.NS, PerSlot: &perSlot,
					Overwrite: overwrite, Versioned: fence.NewPrewarmVersioned(v.env.Client, v.env.NS, zerolog.Nop())})
				pf, err := ps.Prepare(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if !pf.Fenced || pf.Epoch != v.epoch {
					t.Fatalf("Prepare = %+v, want fenced by the leader's epoch %d", pf, v.epoch)
				}
				res, err := ps.SetEach(context.Background(), entries)
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			entry := func(key, value string, version *int64) store.Entry {
				// As a pre-warm's warmer stamps them: its own load order, which
				// means nothing to the leader's.
				e := store.Entry{Key: key, Value: []byte(value), TTL: time.Minute, Seq: 1_000_000, VersionTTL: 2 * time.Minute, Family: "f"}
				if version != nil {
					e.Versioned, e.Version = true, *version
				}
				return e
			}

			got := write(true,
				entry(k("newer"), "v30", ptr(30)),       // newer than the leader's: replaced
				entry(k("older"), "v10", ptr(10)),       // older: left alone
				entry(k("stamp-only"), "pre-warm", nil), // the leader's load is the newest known
				entry(k("fresh"), "v5", ptr(5)),         // no record: written, with one
				store.Entry{Key: k("unstamped"), Value: []byte("plain"), TTL: time.Minute},
			)
			want := []store.SetOutcome{store.SetWritten, store.SetPresent, store.SetPresent, store.SetWritten, store.SetWritten}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("--overwrite outcomes = %v, want %v", got, want)
			}
			for key, val := range map[string]string{"newer": "v30", "older": "v20", "stamp-only": "leader", "fresh": "v5", "unstamped": "plain"} {
				if g := v.get(k(key)); g != val {
					t.Errorf("%s = %q after the pre-warm, want %q", key, g, val)
				}
			}
			rec, err := v.env.Client.Get(context.Background(), store.VersionKey(v.env.NS, k("fresh"))).Result()
			if ver, ok := store.ParseVersionRecord(rec); err != nil || !ok || ver != 5 {
				t.Errorf("record of the pre-warmed key = %q (%v), want version 5", rec, err)
			}

			// The leader's next writes compare with the pre-warm's record: the
			// same version and bytes only extend, an older version is refused.
			v.set(k("fresh"), "v5", 9, ptr(5))
			v.set(k("fresh"), "v4", 10, ptr(4))
			if g := v.get(k("fresh")); g != "v5" {
				t.Errorf("fresh = %q after the leader wrote versions 5 then 4, want v5", g)
			}
			if n := counter(t, v.in.Reg, "hearth_conditional_extends_total", "family=f"); n != 1 {
				t.Errorf("hearth_conditional_extends_total = %g, want 1 (the leader's rewrite of the pre-warmed value)", n)
			}

			// Without --overwrite a present key is left alone, and so is an
			// absent one whose record holds a newer version: writing it would
			// bring back an older value than the leader last wrote.
			got = write(false,
				entry(k("older"), "v40", ptr(40)),
				entry(k("evicted"), "v10", ptr(10)),
				entry(k("absent"), "v1", ptr(1)),
			)
			want = []store.SetOutcome{store.SetPresent, store.SetPresent, store.SetWritten}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("fill-absent outcomes = %v, want %v", got, want)
			}
			if g := v.get(k("older")); g != "v20" {
				t.Errorf("older = %q, want the leader's v20 left alone", g)
			}
			if err := v.env.Client.Get(context.Background(), k("evicted")).Err(); !errors.Is(err, redis.Nil) {
				t.Errorf("evicted: GET err = %v, want absent: the pre-warm's version 10 is older than the record's 20", err)
			}

			// A leader that takes over after the pre-warm read the epoch fences it.
			fence := v.in.Store.FenceKey(k("absent2"))
			if err := v.env.Client.Set(context.Background(), fence, strconv.FormatInt(v.epoch+1, 10), 0).Err(); err != nil {
				t.Fatal(err)
			}
			got = write(true, entry(k("absent2"), "v1", ptr(1)))
			if len(got) != 1 || got[0] != store.SetFenced {
				t.Errorf("outcome under a newer fence = %v, want fenced", got)
			}
		})
	}
}
