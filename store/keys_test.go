package store_test

import (
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/readside"
	"github.com/hearth-dev/hearth/store"
)

// The names are a contract: operators' ACLs and dashboards, the soak's
// outside checker and older instances of a rolling upgrade spell them too.
func TestKeyNames(t *testing.T) {
	start := time.Unix(1700000000, 0)
	for _, tc := range []struct{ got, want string }{
		{store.LeaseKey("h"), "h:{lease}"},
		{store.EpochKey("h"), "h:{lease}:epoch"},
		{store.ReleaseChannel("h"), "h:lease:released"},
		{store.FenceKey("h"), "h:fence"},
		{store.SlotFenceKey("h", 0), "h:fence:{" + slot.Tag(0) + "}"},
		{store.VersionKey("h", "user:1"), "h:ver:{" + slot.Tag(slot.Of("user:1")) + "}:user:1"},
		{store.MarkerKey("h"), "h:warm"},
		{store.ClusterMarkerKey("h", 5), "h:warm:{" + slot.Tag(5) + "}"},
		{store.AccessBucketKey("h", start), "h:access:1700000000"},
		{store.RollupKey("h", "h:access:1700000000"), "h:rollup:{h:access:1700000000}"},
		{store.RollupTokenKey("h", "h:access:1700000000"), "h:rollup:{h:access:1700000000}:token"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// The lease and its counter share a slot (Acquire sets both); each key's
// own keys live in its slot (one script touches both).
func TestKeySlots(t *testing.T) {
	if slot.Of(store.LeaseKey("h")) != slot.Of(store.EpochKey("h")) {
		t.Error("lease and epoch counter in different slots")
	}
	for _, k := range []string{"a", "user:{42}:profile", "{}x", "ü"} {
		if slot.Of(store.VersionKey("h", k)) != slot.Of(k) {
			t.Errorf("version record of %q not in its slot", k)
		}
	}
	for _, n := range []int{0, 1, 8191, slot.Count - 1} {
		if got := slot.Of(store.SlotFenceKey("h", n)); got != n {
			t.Errorf("fence of slot %d is in slot %d", n, got)
		}
		if got := slot.Of(store.ClusterMarkerKey("h", n)); got != n {
			t.Errorf("marker of slot %d is in slot %d", n, got)
		}
	}
	bucket := store.AccessBucketKey("h", time.Unix(60, 0))
	if slot.Of(store.RollupKey("h", bucket)) != slot.Of(bucket) || slot.Of(store.RollupTokenKey("h", bucket)) != slot.Of(bucket) {
		t.Error("roll-up keys not in their bucket's slot")
	}
}

// The read side (its own module) names the access buckets applications
// count reads in; the daemon rolls up the same names, whatever the bucket
// width.
func TestAccessBucketMatchesReadside(t *testing.T) {
	for _, width := range []time.Duration{time.Second, time.Minute, 5 * time.Minute, time.Hour} {
		for _, at := range []time.Time{time.Unix(0, 0), time.Unix(1700000123, 5e8), time.Unix(-61, 0)} {
			start := time.Unix(readside.BucketStart(at, width), 0)
			if got, want := store.AccessBucketKey("h", start), readside.AccessKey("h", at, width); got != want {
				t.Errorf("width %s at %v: store %q, readside %q", width, at, got, want)
			}
		}
	}
}

func TestFences(t *testing.T) {
	one := store.NewFences("h", false)
	if one.PerSlot() || one.Count() != 1 || one.For("x") != "h:fence" || one.At(0) != "h:fence" {
		t.Errorf("single fence: perSlot %v, count %d, For %q, At %q", one.PerSlot(), one.Count(), one.For("x"), one.At(0))
	}
	per := store.NewFences("h", true)
	if !per.PerSlot() || per.Count() != slot.Count {
		t.Fatalf("per-slot fences: perSlot %v, count %d", per.PerSlot(), per.Count())
	}
	for _, k := range []string{"x", "user:{7}", "a:b:c"} {
		if got, want := per.For(k), store.SlotFenceKey("h", slot.Of(k)); got != want {
			t.Errorf("For(%q) = %q, want %q", k, got, want)
		}
	}
	for _, n := range []int{0, 12182, slot.Count - 1} {
		if got, want := per.At(n), store.SlotFenceKey("h", n); got != want {
			t.Errorf("At(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestParseEpoch(t *testing.T) {
	for s, want := range map[string]bool{
		"0": true, "1": true, "1700000000000": true, "9999999999999999": true,
		"": false, "00": false, "01": false, "-1": false, "+1": false, "1e3": false, "nan": false,
		"inf": false, " 1": false, "1 ": false, "10000000000000000": false, "0x10": false,
	} {
		if _, ok := store.ParseEpoch(s); ok != want {
			t.Errorf("ParseEpoch(%q) ok = %v, want %v", s, ok, want)
		}
	}
}

func TestParseLease(t *testing.T) {
	if e, id, ok := store.ParseLease("1700000000000:host-1-abc/3"); !ok || e != 1700000000000 || id != "host-1-abc" {
		t.Errorf("ParseLease = %d, %q, %v", e, id, ok)
	}
	for _, s := range []string{"", "1:", "1:id", "01:id/1", "1:id/x", "1:i:d/1", "1:i/d/1", "nan:id/1", "17000000000000000:id/1"} {
		if _, _, ok := store.ParseLease(s); ok {
			t.Errorf("ParseLease(%q) accepted", s)
		}
	}
}

func TestVersionRecords(t *testing.T) {
	for _, v := range []int64{-1 << 63, -1, 0, 1, 1<<63 - 1} {
		rec := "1:2:" + store.EncodeVersion(v) + ":" + store.ValueHash([]byte("x"))
		if got, ok := store.ParseVersionRecord(rec); !ok || got != v {
			t.Errorf("ParseVersionRecord(%q) = %d, %v, want %d", rec, got, ok, v)
		}
		if got, versioned, hash, ok := store.ParseCopiedRecord(rec); !ok || !versioned || got != v || hash != store.ValueHash([]byte("x")) {
			t.Errorf("ParseCopiedRecord(%q) = %d, %v, %q, %v", rec, got, versioned, hash, ok)
		}
	}
	if _, versioned, _, ok := store.ParseCopiedRecord("1:2::" + store.ValueHash(nil)); !ok || versioned {
		t.Errorf("a record without a version: versioned %v, ok %v", versioned, ok)
	}
	for _, rec := range []string{"", "1:2:3:4", "1:2::" + "0123456789abcdef0123456789abcdef", "1:2:99999999999999999999:" + store.ValueHash(nil)} {
		if _, _, _, ok := store.ParseCopiedRecord(rec); ok {
			t.Errorf("ParseCopiedRecord(%q) accepted", rec)
		}
	}
}
