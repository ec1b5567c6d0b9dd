package fence_test

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/store"
)

// checked writes one stamped entry through SetChecked and returns what the
// version check found at its key.
func (v *versionEnv) checked(key, value string, seq int64, version int64, unconfirmed string) store.VersionCheck {
	v.t.Helper()
	e := store.Entry{Key: key, Value: []byte(value), TTL: time.Minute, Seq: seq, Versioned: true, Version: version,
		VersionTTL: 2 * time.Minute, Family: "f", Unconfirmed: unconfirmed}
	checks, err := v.w.SetChecked(v.ctx, []store.Entry{e})
	if err != nil {
		v.t.Fatalf("SetChecked %s=%s: %v", key, value, err)
	}
	if len(checks) != 1 {
		v.t.Fatalf("SetChecked: %d checks for 1 entry", len(checks))
	}
	return checks[0]
}

func sha1Hex(s string) string {
	h := sha1.Sum([]byte(s))
	return hex.EncodeToString(h[:])
}

// TestVersionedExtendComparesBytes: a value of the right length that is not
// the one Hearth wrote (another client's SET … KEEPTTL, an application's
// older value of the same length under an untouched record) is rewritten
// with the origin's value at the next write, not extended, and reported as
// value_mismatch; the same bytes are still only extended. Before, "same
// version and same STRLEN" extended the foreign value for good.
func TestVersionedExtendComparesBytes(t *testing.T) {
	for _, perSlot := range []bool{false, true} {
		t.Run(fmt.Sprintf("per slot %v", perSlot), func(t *testing.T) {
			v := newVersionEnv(t, perSlot)
			ctx := context.Background()
			c := v.env.Client
			k := v.env.Prefix + "product:1"
			if got := v.checked(k, `{"price":100}`, 1, 7, ""); got.Reason != "" {
				t.Fatalf("first write found %+v", got)
			}
			extends := counter(t, v.in.Reg, "hearth_conditional_extends_total", "family=f")
			if got := v.checked(k, `{"price":100}`, 2, 7, ""); got.Reason != "" {
				t.Fatalf("same bytes found %+v", got)
			}
			if got := counter(t, v.in.Reg, "hearth_conditional_extends_total", "family=f"); got != extends+1 {
				t.Fatalf("conditional extends = %v, want %v (same bytes are extended)", got, extends+1)
			}
			for _, foreign := range []string{`{"price":999}`, `{"price":090}`} {
				if err := c.Do(ctx, "SET", k, foreign, "KEEPTTL").Err(); err != nil {
					t.Fatal(err)
				}
				got := v.checked(k, `{"price":100}`, 3, 7, "")
				if got.Reason != store.RepairValueMismatch || got.Recheck {
					t.Errorf("after SET %s KEEPTTL: check %+v, want value_mismatch without recheck", foreign, got)
				}
				if !strings.Contains(got.Found, "13 bytes") || strings.Contains(got.Found, "price") {
					t.Errorf("found %q: want the foreign value's length and hash, never its bytes", got.Found)
				}
				if val := v.get(k); val != `{"price":100}` {
					t.Fatalf("after SET %s KEEPTTL and a write: value %q, want the origin's", foreign, val)
				}
			}
			// Another type under the untouched record: described by its type,
			// replaced, and given the write's TTL.
			c.Del(ctx, k)
			c.HSet(ctx, k, "price", "100")
			got := v.checked(k, `{"price":100}`, 4, 7, "")
			if got.Reason != store.RepairValueMismatch || !strings.Contains(got.Found, "wrong type: hash") {
				t.Errorf("after HSET: check %+v, want value_mismatch naming the hash", got)
			}
			if val := v.get(k); val != `{"price":100}` {
				t.Fatalf("after HSET and a write: value %q, want the origin's", val)
			}
			if pt := c.PTTL(ctx, k).Val(); pt <= 0 || pt > time.Minute {
				t.Errorf("after HSET and a write: TTL %v, want the write's minute", pt)
			}
		})
	}
}

// TestVersionRecordMustBeBacked: a record that would refuse a write as
// older, while the value it guards is absent or other bytes, refuses it but
// asks for a re-read (Recheck, with the record); the re-read's write naming
// that record replaces it when the origin's version is still lower
// (record_unconfirmed). A record whose value backs it still refuses an
// older write, even one that names it (the legitimate race: a newer value a
// reader could have seen). Before, a planted far-future record left the key
// absent until the record's TTL ran out.
func TestVersionRecordMustBeBacked(t *testing.T) {
	for _, perSlot := range []bool{false, true} {
		t.Run(fmt.Sprintf("per slot %v", perSlot), func(t *testing.T) {
			v := newVersionEnv(t, perSlot)
			ctx := context.Background()
			c := v.env.Client
			huge := store.EncodeVersion(math.MaxInt64)

			t.Run("planted record, value absent", func(t *testing.T) {
				k := v.env.Prefix + "product:5"
				vk := store.VersionKey(v.env.NS, k)
				planted := "1:1:" + huge + ":" + sha1Hex("whatever")
				c.Set(ctx, vk, planted, time.Minute)
				got := v.checked(k, "v5", 10, 5, "")
				if !got.Recheck || got.Reason != store.RepairValueAbsent || got.Record != planted {
					t.Fatalf("check %+v, want a recheck (value_absent) naming the planted record", got)
				}
				if n := c.Exists(ctx, k).Val(); n != 0 {
					t.Fatalf("the refused write landed")
				}
				// A re-read that names another record does not replace this one.
				if got := v.checked(k, "v5", 11, 5, planted+"x"); !got.Recheck {
					t.Fatalf("a re-read naming another record: %+v, want refused again", got)
				}
				got = v.checked(k, "v5", 12, 5, planted)
				if got.Reason != store.RepairRecordUnconfirmed || got.Recheck {
					t.Fatalf("re-read: check %+v, want record_unconfirmed", got)
				}
				if val := v.get(k); val != "v5" {
					t.Fatalf("value %q after the re-read, want v5", val)
				}
				if ver, ok := store.ParseVersionRecord(c.Get(ctx, vk).Val()); !ok || ver != 5 {
					t.Errorf("record after the repair holds %d, %v; want version 5", ver, ok)
				}
			})
			t.Run("planted record, other bytes present", func(t *testing.T) {
				k := v.env.Prefix + "product:6"
				vk := store.VersionKey(v.env.NS, k)
				c.Set(ctx, k, "an application's value", time.Minute)
				planted := "1:1:" + huge + ":" + sha1Hex("not that value")
				c.Set(ctx, vk, planted, time.Minute)
				got := v.checked(k, "v6", 20, 6, "")
				if !got.Recheck || got.Reason != store.RepairValueMismatch {
					t.Fatalf("check %+v, want a recheck (value_mismatch)", got)
				}
				if got := v.checked(k, "v6", 21, 6, planted); got.Reason != store.RepairRecordUnconfirmed {
					t.Fatalf("re-read: check %+v, want record_unconfirmed", got)
				}
				if val := v.get(k); val != "v6" {
					t.Fatalf("value %q, want v6", val)
				}
			})
			t.Run("a newer value the leader wrote is kept", func(t *testing.T) {
				k := v.env.Prefix + "product:7"
				vk := store.VersionKey(v.env.NS, k)
				if got := v.checked(k, "seven v9", 30, 9, ""); got.Reason != "" {
					t.Fatalf("first write found %+v", got)
				}
				rec := c.Get(ctx, vk).Val()
				// An older origin read lands after it: refused, nothing to re-read.
				if got := v.checked(k, "seven v8", 31, 8, ""); got.Recheck || got.Reason != "" {
					t.Fatalf("older write: check %+v, want a plain refusal", got)
				}
				// Even naming the record, an older write never replaces a value
				// that backs its record.
				if got := v.checked(k, "seven v8", 32, 8, rec); got.Recheck || got.Reason != "" {
					t.Fatalf("older write naming the record: check %+v, want a plain refusal", got)
				}
				if val := v.get(k); val != "seven v9" {
					t.Fatalf("value %q, want the newer seven v9", val)
				}
				// The value deleted (an application's invalidation): the older
				// write asks for a re-read, which finds version 9 or newer.
				c.Del(ctx, k)
				if got := v.checked(k, "seven v8", 33, 8, ""); !got.Recheck || got.Reason != store.RepairValueAbsent {
					t.Fatalf("older write over an absent value: check %+v, want a recheck", got)
				}
				if got := v.checked(k, "seven v10", 34, 10, rec); got.Reason != "" {
					t.Fatalf("re-read that confirms the record: check %+v, want nothing wrong", got)
				}
				if val := v.get(k); val != "seven v10" {
					t.Fatalf("value %q, want seven v10", val)
				}
			})
		})
	}
}

// TestVersionRecordOutOfRange: records that are malformed as numbers (a
// version above the 20-digit encoding's range, nan, inf, 1e999, text) with
// the value absent are repaired at the first write, which lands; counted as
// record_malformed. Before, a 20-digit version above 2^64 parsed and refused
// every write until the record's TTL ran out.
func TestVersionRecordOutOfRange(t *testing.T) {
	v := newVersionEnv(t, false)
	ctx := context.Background()
	c := v.env.Client
	h := sha1Hex("x")[:32] // the earlier format's length: well-formed before this check too
	for _, tc := range []struct{ name, record string }{
		{"above the range", "1:1:99999999999999999999:" + h},
		{"nan", "1:1:nan:" + h},
		{"inf", "1:inf::" + h},
		{"1e999", "1e999:1::" + h},
		{"text", "not a record"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := v.env.Prefix + "oor:" + strings.ReplaceAll(tc.name, " ", "_")
			c.Set(ctx, store.VersionKey(v.env.NS, k), tc.record, time.Minute)
			got := v.checked(k, "mine", 100, 1, "")
			if got.Reason != store.RepairRecordMalformed || got.Recheck {
				t.Errorf("check %+v, want record_malformed", got)
			}
			if val := v.get(k); val != "mine" {
				t.Errorf("value %q, want mine", val)
			}
		})
	}
}

// TestVersionRecordOfEarlierFormat: a record an earlier release wrote (a
// 128-bit SHA-256 prefix as its hash) is never taken as proof of a value: the
// first write with the same version rewrites the value and the record once,
// the next one extends.
func TestVersionRecordOfEarlierFormat(t *testing.T) {
	v := newVersionEnv(t, false)
	ctx := context.Background()
	c := v.env.Client
	k := v.env.Prefix + "old"
	sum := sha256.Sum256([]byte("same"))
	c.Set(ctx, k, "SAME", time.Minute) // not the bytes the old record names
	c.Set(ctx, store.VersionKey(v.env.NS, k), fmt.Sprintf("%d:1:%s:%s", v.epoch, store.EncodeVersion(1), hex.EncodeToString(sum[:16])), time.Minute)
	extends := counter(t, v.in.Reg, "hearth_conditional_extends_total", "family=f")
	if got := v.checked(k, "same", 2, 1, ""); got.Reason != "" {
		t.Errorf("check %+v, want nothing wrong (an unverifiable record is rewritten)", got)
	}
	if val := v.get(k); val != "same" {
		t.Fatalf("value %q, want same", val)
	}
	v.checked(k, "same", 3, 1, "")
	if got := counter(t, v.in.Reg, "hearth_conditional_extends_total", "family=f"); got != extends+1 {
		t.Errorf("conditional extends = %v, want %v (rewritten once, then extended)", got, extends+1)
	}
}

// TestVersionedBatchOfManyStamps: one write of many entries, as a catch-up or
// a re-read hands over (more than one script call's worth, two load stamps,
// two record TTLs, suspect records named at a few keys), lands each entry
// with its own stamp, record TTL and suspect: the many-key script takes the
// stamp and the record TTL once per call and the suspects by position, so a
// call that mixed them, or a suspect moved to its neighbour, would show here.
func TestVersionedBatchOfManyStamps(t *testing.T) {
	for _, perSlot := range []bool{false, true} {
		t.Run(fmt.Sprintf("per slot %v", perSlot), func(t *testing.T) {
			v := newVersionEnv(t, perSlot)
			ctx := context.Background()
			c := v.env.Client
			huge := store.EncodeVersion(math.MaxInt64)
			const n = 300
			entries := make([]store.Entry, n)
			planted := map[int]string{}
			for i := range entries {
				k := fmt.Sprintf("%sbatch:%d", v.env.Prefix, i)
				e := store.Entry{Key: k, Value: []byte(fmt.Sprintf("value %d", i)), TTL: time.Minute, Seq: 40,
					Versioned: true, Version: int64(i + 1), VersionTTL: 2 * time.Minute, Family: "f"}
				if i >= 150 {
					e.Seq = 41
				}
				if i >= 200 && i < 210 {
					e.VersionTTL = 3 * time.Minute
				}
				if i == 5 || i == 140 || i == 290 {
					planted[i] = "1:1:" + huge + ":" + sha1Hex("whatever")
					c.Set(ctx, store.VersionKey(v.env.NS, k), planted[i], time.Minute)
					e.Unconfirmed = planted[i]
				}
				entries[i] = e
			}
			entries[5].Unconfirmed = planted[5] + "x" // names another record: refused again
			checks, err := v.w.SetChecked(ctx, entries)
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range entries {
				got, rec := checks[i], c.Get(ctx, store.VersionKey(v.env.NS, e.Key)).Val()
				switch i {
				case 5:
					if !got.Recheck || rec != planted[i] || c.Exists(ctx, e.Key).Val() != 0 {
						t.Errorf("entry %d: check %+v, record %q: want refused again, the planted record kept", i, got, rec)
					}
					continue
				case 140, 290:
					if got.Reason != store.RepairRecordUnconfirmed || got.Recheck {
						t.Errorf("entry %d: check %+v, want record_unconfirmed", i, got)
					}
				default:
					if got.Reason != "" || got.Recheck {
						t.Errorf("entry %d: check %+v, want nothing wrong", i, got)
					}
				}
				want := fmt.Sprintf("%d:%d:%s:%s", v.epoch, e.Seq, store.EncodeVersion(e.Version), sha1Hex(string(e.Value)))
				if rec != want {
					t.Errorf("entry %d: record %q, want %q", i, rec, want)
				}
				if val := v.get(e.Key); val != string(e.Value) {
					t.Errorf("entry %d: value %q, want %q", i, val, e.Value)
				}
				pt := c.PTTL(ctx, store.VersionKey(v.env.NS, e.Key)).Val()
				if pt > e.VersionTTL || pt < e.VersionTTL-10*time.Second {
					t.Errorf("entry %d: record TTL %v, want its own %v", i, pt, e.VersionTTL)
				}
			}
		})
	}
}
