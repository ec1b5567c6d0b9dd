package fence_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/internal/leadertest"
	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/store"
)

func TestEncodeVersionKeepsOrder(t *testing.T) {
	vs := []int64{math.MinInt64, -1_000_000, -1, 0, 1, 9, 10, 1 << 40, math.MaxInt64 - 1, math.MaxInt64}
	for i := 1; i < len(vs); i++ {
		a, b := store.EncodeVersion(vs[i-1]), store.EncodeVersion(vs[i])
		if len(a) != 20 || len(b) != 20 {
			t.Fatalf("EncodeVersion lengths %d, %d, want 20", len(a), len(b))
		}
		if !(a < b) {
			t.Errorf("EncodeVersion(%d) = %s is not below EncodeVersion(%d) = %s", vs[i-1], a, vs[i], b)
		}
		if got, ok := store.ParseVersionRecord("1:1:" + b + ":" + strings.Repeat("0", 32)); !ok || got != vs[i] {
			t.Errorf("ParseVersionRecord round trip of %d = %d, %v", vs[i], got, ok)
		}
	}
}

func TestVersionKeyInValueSlot(t *testing.T) {
	for _, k := range []string{"product:1", "{user1000}.following", "a{b}c", "x"} {
		vk := store.VersionKey("hearth", k)
		if got, want := slot.Of(vk), slot.Of(k); got != want {
			t.Errorf("VersionKey(%q) = %q in slot %d, want the value's slot %d", k, vk, got, want)
		}
		if !strings.HasPrefix(vk, "hearth:") {
			t.Errorf("VersionKey(%q) = %q outside the namespace", k, vk)
		}
	}
}

// versionEnv is one fenced store holding a lease term, writing stamped entries.
type versionEnv struct {
	t     *testing.T
	env   *leadertest.Env
	in    *leadertest.Instance
	ctx   context.Context
	w     *fence.Writer // the term's writer
	epoch int64
}

// newVersionEnv: perSlot false checks versions many keys per script call
// under the single fence key, true one key per call, as on a Cluster.
func newVersionEnv(t *testing.T, perSlot bool) *versionEnv {
	env := leadertest.New(t)
	in := env.Instance(30*time.Second, 20*time.Millisecond, perSlot)
	term, err := in.Lease.Campaign(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &versionEnv{t: t, env: env, in: in, ctx: context.Background(), w: in.Store.Writer(term), epoch: term.Epoch}
}

func (v *versionEnv) set(key, value string, seq int64, version *int64) {
	v.t.Helper()
	e := store.Entry{Key: key, Value: []byte(value), TTL: time.Minute, Seq: seq, VersionTTL: 2 * time.Minute, Family: "f"}
	if version != nil {
		e.Versioned, e.Version = true, *version
	}
	if err := v.w.Set(v.ctx, []store.Entry{e}); err != nil {
		v.t.Fatalf("Set %s=%s: %v", key, value, err)
	}
}

func (v *versionEnv) get(key string) string {
	v.t.Helper()
	s, err := v.env.Client.Get(context.Background(), key).Result()
	if err != nil {
		v.t.Fatalf("GET %s: %v", key, err)
	}
	return s
}

func counter(t *testing.T, reg *prometheus.Registry, name, labels string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var parts []string
			for _, l := range m.GetLabel() {
				parts = append(parts, l.GetName()+"="+l.GetValue())
			}
			if strings.Join(parts, ",") == labels {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func ptr(v int64) *int64 { return &v }

func TestVersionedWrites(t *testing.T) {
	for _, perSlot := range []bool{false, true} {
		t.Run(fmt.Sprintf("per slot %v", perSlot), func(t *testing.T) { testVersionedWrites(t, perSlot) })
	}
}

func testVersionedWrites(t *testing.T, perSlot bool) {
	v := newVersionEnv(t, perSlot)
	p := v.env.Prefix
	t.Run("an older version is refused", func(t *testing.T) {
		k := p + "v:1"
		v.set(k, "five", 1, ptr(5))
		v.set(k, "three", 2, ptr(3)) // started later, read an older row
		if got := v.get(k); got != "five" {
			t.Errorf("value = %q, want five (version 5 kept)", got)
		}
		v.set(k, "six", 3, ptr(6))
		if got := v.get(k); got != "six" {
			t.Errorf("value = %q, want six", got)
		}
		if got := counter(t, v.in.Reg, "hearth_version_refused_writes_total", "family=f"); got != 1 {
			t.Errorf("refused = %v, want 1", got)
		}
	})
	t.Run("without versions the load that started last wins", func(t *testing.T) {
		k := p + "s:1"
		v.set(k, "late start", 20, nil)
		v.set(k, "early start", 10, nil) // finished after, started before
		if got := v.get(k); got != "late start" {
			t.Errorf("value = %q, want the later-started load's", got)
		}
		v.set(k, "later still", 21, nil)
		if got := v.get(k); got != "later still" {
			t.Errorf("value = %q, want later still", got)
		}
	})
	t.Run("a sentinel and a versioned value order by stamp", func(t *testing.T) {
		k := p + "d:1"
		v.set(k, "v7", 30, ptr(7))
		v.set(k, "", 32, nil)      // the row was deleted: sentinel
		v.set(k, "v7", 31, ptr(7)) // a load that read the row before the delete
		if got := v.get(k); got != "" {
			t.Errorf("value = %q, want the sentinel", got)
		}
		v.set(k, "v8", 33, ptr(8)) // re-inserted
		if got := v.get(k); got != "v8" {
			t.Errorf("value = %q, want v8", got)
		}
	})
	t.Run("same version and bytes extend instead of rewriting", func(t *testing.T) {
		k := p + "c:1"
		v.set(k, "same", 40, ptr(1))
		v.env.Client.PExpire(context.Background(), k, 5*time.Second)
		before := counter(t, v.in.Reg, "hearth_conditional_extends_total", "family=f")
		v.set(k, "same", 41, ptr(1))
		if got := counter(t, v.in.Reg, "hearth_conditional_extends_total", "family=f"); got != before+1 {
			t.Errorf("conditional extends = %v, want %v", got, before+1)
		}
		if ttl := v.env.Client.PTTL(context.Background(), k).Val(); ttl < 30*time.Second {
			t.Errorf("TTL after a conditional extend = %s, want about a minute", ttl)
		}
		// The application overwrote the value with other bytes: rewritten.
		v.env.Client.Set(context.Background(), k, "someone else's", time.Minute)
		v.set(k, "same", 42, ptr(1))
		if got := v.get(k); got != "same" {
			t.Errorf("value = %q, want same (rewritten, not extended)", got)
		}
		// Gone: written again.
		v.env.Client.Del(context.Background(), k)
		v.set(k, "same", 43, ptr(1))
		if got := v.get(k); got != "same" {
			t.Errorf("value = %q after delete, want same", got)
		}
	})
	t.Run("an extend moves a versioned record's TTL, not its content", func(t *testing.T) {
		ctx := context.Background()
		k := p + "r:1"
		rk := store.VersionKey(v.env.NS, k)
		v.set(k, "same", 50, ptr(1))
		rec := v.get(rk)
		v.env.Client.PExpire(ctx, rk, 5*time.Second)
		v.set(k, "same", 51, ptr(1))
		if got := v.get(rk); got != rec {
			t.Errorf("record after an extend = %q, want %q kept (its version orders writes)", got, rec)
		}
		if ttl := v.env.Client.PTTL(ctx, rk).Val(); ttl < 90*time.Second {
			t.Errorf("record TTL after an extend = %s, want the record's TTL again (2m)", ttl)
		}
		// Still ordered by version: an older one is refused, a newer written.
		v.set(k, "zero", 52, ptr(0))
		if got := v.get(k); got != "same" {
			t.Errorf("value = %q, want same (version 1 kept)", got)
		}
		v.set(k, "two", 53, ptr(2))
		if got := v.get(k); got != "two" {
			t.Errorf("value = %q, want two", got)
		}
	})
	t.Run("an extend without a version moves the record's stamp", func(t *testing.T) {
		k := p + "r:2"
		v.set(k, "same", 60, nil)
		v.set(k, "same", 62, nil) // extended: the record now says 62
		v.set(k, "older", 61, nil)
		if got := v.get(k); got != "same" {
			t.Errorf("value = %q, want same (the load that started at 62 wins over 61)", got)
		}
		if rec := v.get(store.VersionKey(v.env.NS, k)); !strings.Contains(rec, ":62:") {
			t.Errorf("record = %q, want the extend's stamp 62", rec)
		}
	})
}

// TestVersionRecordTamper: a version record that is not Hearth's is repaired
// (treated as absent, overwritten), logged and counted; none can switch the
// check off for good, and a far-future one holds writes off at most for the
// record's TTL bound.
func TestVersionRecordTamper(t *testing.T) {
	for _, perSlot := range []bool{false, true} {
		t.Run(fmt.Sprintf("per slot %v", perSlot), func(t *testing.T) { testVersionRecordTamper(t, perSlot) })
	}
}

func testVersionRecordTamper(t *testing.T, perSlot bool) {
	v := newVersionEnv(t, perSlot)
	ctx := context.Background()
	c := v.env.Client
	hash := strings.Repeat("a", 32)
	for _, tc := range []struct {
		name  string
		plant func(vk string)
	}{
		{"garbage", func(vk string) { c.Set(ctx, vk, "garbage", time.Minute) }},
		{"nan version", func(vk string) { c.Set(ctx, vk, "1:1:nan:"+hash, time.Minute) }},
		{"huge epoch", func(vk string) { c.Set(ctx, vk, "9999999999999999:1::"+hash, time.Minute) }},
		{"exponent seq", func(vk string) { c.Set(ctx, vk, "1:1e999::"+hash, time.Minute) }},
		{"no ttl", func(vk string) { c.Set(ctx, vk, "1:999999:"+store.EncodeVersion(math.MaxInt64)+":"+hash, 0) }},
		{"ttl past the bound", func(vk string) {
			c.Set(ctx, vk, "1:999999:"+store.EncodeVersion(math.MaxInt64)+":"+hash, time.Hour)
		}},
		{"wrong type", func(vk string) { c.HSet(ctx, vk, "v", "1") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := v.env.Prefix + "tamper:" + strings.ReplaceAll(tc.name, " ", "_")
			vk := store.VersionKey(v.env.NS, k)
			tc.plant(vk)
			before := counter(t, v.in.Reg, "hearth_state_repairs_total", "key=version")
			v.set(k, "mine", 100, ptr(1))
			if got := v.get(k); got != "mine" {
				t.Errorf("value = %q, want the write through (record repaired)", got)
			}
			if got := counter(t, v.in.Reg, "hearth_state_repairs_total", "key=version"); got != before+1 {
				t.Errorf("version repairs = %v, want %v", got, before+1)
			}
			rec := c.Get(ctx, vk).Val()
			if got, ok := store.ParseVersionRecord(rec); !ok || got != 1 {
				t.Errorf("record after repair = %q, want version 1", rec)
			}
		})
	}
	t.Run("far-future version within the bound expires with its TTL", func(t *testing.T) {
		k := v.env.Prefix + "tamper:future"
		vk := store.VersionKey(v.env.NS, k)
		c.Set(ctx, vk, "1:1:"+store.EncodeVersion(math.MaxInt64)+":"+hash, 300*time.Millisecond)
		v.set(k, "mine", 200, ptr(1))
		if n := c.Exists(ctx, k).Val(); n != 0 {
			t.Fatalf("write landed over a planted newer version")
		}
		if ttl := c.PTTL(ctx, vk).Val(); ttl > 2*time.Minute {
			t.Fatalf("planted record TTL %s above the bound", ttl)
		}
		deadline := time.Now().Add(10 * time.Second)
		for c.Exists(ctx, vk).Val() == 1 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		v.set(k, "mine", 201, ptr(1))
		if got := v.get(k); got != "mine" {
			t.Errorf("value = %q, want mine once the planted record expired", got)
		}
	})
}

// TestVersionedWriteOfManyKeys: one write of more keys than a script call
// carries, with every outcome mixed in every call — older (refused), same
// version and bytes (extended), newer (written), and a key whose record
// another client overwrote (repaired, then written) — decides each key
// alone, on a single node (many keys per call) and per slot.
func TestVersionedWriteOfManyKeys(t *testing.T) {
	for _, perSlot := range []bool{false, true} {
		t.Run(fmt.Sprintf("per slot %v", perSlot), func(t *testing.T) {
			v := newVersionEnv(t, perSlot)
			ctx := context.Background()
			const n = 300
			key := func(i int) string { return fmt.Sprintf("%smany:%d", v.env.Prefix, i) }
			batch := func(seq int64, version func(i int) int64) []store.Entry {
				es := make([]store.Entry, n)
				for i := range es {
					ver := version(i)
					es[i] = store.Entry{Key: key(i), Value: []byte("v" + strconv.FormatInt(ver, 10)), TTL: time.Minute,
						Seq: seq, Versioned: true, Version: ver, VersionTTL: 2 * time.Minute, Family: "f"}
				}
				return es
			}
			if err := v.w.Set(v.ctx, batch(1, func(int) int64 { return 5 })); err != nil {
				t.Fatal(err)
			}
			const tampered = 150 // planned older: its record is foreign, so it is written
			if err := v.env.Client.Set(ctx, store.VersionKey(v.env.NS, key(tampered)), "not a record", 0).Err(); err != nil {
				t.Fatal(err)
			}
			if err := v.w.Set(v.ctx, batch(2, func(i int) int64 { return int64(4 + i%3) })); err != nil {
				t.Fatal(err)
			}
			for i := range n {
				want := []string{"v5", "v5", "v6"}[i%3]
				if i == tampered {
					want = "v4"
				}
				if got := v.get(key(i)); got != want {
					t.Fatalf("%s = %q, want %q", key(i), got, want)
				}
			}
			for _, c := range []struct {
				name, labels string
				want         float64
			}{
				{"hearth_version_refused_writes_total", "family=f", n/3 - 1},
				{"hearth_conditional_extends_total", "family=f", n / 3},
				{"hearth_state_repairs_total", "key=version", 1},
			} {
				if got := counter(t, v.in.Reg, c.name, c.labels); got != c.want {
					t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
				}
			}

			// A new leader takes over: the old one's versioned write is refused
			// whole, however new its versions.
			v.env.Client.Del(ctx, v.env.NS+":{lease}")
			leadertest.Campaign(t, v.env.Instance(30*time.Second, 20*time.Millisecond, perSlot).Lease, 5*time.Second)
			err := v.w.Set(v.ctx, batch(3, func(int) int64 { return 9 }))
			if !errors.Is(err, leader.ErrFenced) {
				t.Fatalf("old leader's versioned write: err = %v, want ErrFenced", err)
			}
			if got := v.get(key(0)); got != "v5" {
				t.Errorf("%s = %q after a fenced write, want v5", key(0), got)
			}
			if got := counter(t, v.in.Reg, "hearth_fenced_writes_total", "op=set"); got != n {
				t.Errorf("hearth_fenced_writes_total{op=set} = %v, want %d", got, n)
			}
		})
	}
}
