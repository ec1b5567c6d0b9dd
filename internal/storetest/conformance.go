package storetest

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// Reader reads a key back from the store under test, from outside it:
// its value and remaining TTL (0 for no expiry); ok is false when absent.
type Reader func(t *testing.T, key string) (value []byte, ttl time.Duration, ok bool)

// Run is the conformance suite of a warmer.Store: what the warmer relies on
// from every store (the fake here and the real ones alike). prefix names
// keys the suite may write; read looks at them from outside the store.
func Run(t *testing.T, st warmer.Store, prefix string, read Reader) {
	t.Helper()
	ctx := context.Background()
	k := func(s string) string { return prefix + s }

	t.Run("SetWritesValueAndTTL", func(t *testing.T) {
		if err := st.Set(ctx, []store.Entry{
			{Key: k("a"), Value: []byte("1"), TTL: time.Minute},
			{Key: k("b"), Value: []byte("2"), TTL: 2 * time.Minute},
		}); err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string]struct {
			v   string
			ttl time.Duration
		}{k("a"): {"1", time.Minute}, k("b"): {"2", 2 * time.Minute}} {
			v, ttl, ok := read(t, key)
			if !ok || !bytes.Equal(v, []byte(want.v)) {
				t.Errorf("%s = %q (present %v), want %q", key, v, ok, want.v)
			}
			if ttl <= want.ttl-5*time.Second || ttl > want.ttl {
				t.Errorf("%s TTL = %v, want about %v", key, ttl, want.ttl)
			}
		}
	})

	t.Run("SetOverwrites", func(t *testing.T) {
		for _, v := range []string{"old", "new"} {
			if err := st.Set(ctx, []store.Entry{{Key: k("o"), Value: []byte(v), TTL: time.Minute}}); err != nil {
				t.Fatal(err)
			}
		}
		if v, _, _ := read(t, k("o")); string(v) != "new" {
			t.Errorf("after two writes %q, want the last", v)
		}
	})

	t.Run("ExtendLengthensNeverShortens", func(t *testing.T) {
		if err := st.Set(ctx, []store.Entry{
			{Key: k("short"), Value: []byte("s"), TTL: 10 * time.Second},
			{Key: k("long"), Value: []byte("l"), TTL: 10 * time.Minute},
		}); err != nil {
			t.Fatal(err)
		}
		kept, err := st.Extend(ctx, []string{k("short"), k("long"), k("gone")},
			[]time.Duration{time.Minute, time.Minute, time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if len(kept) != 3 || !kept[0] || !kept[1] || kept[2] {
			t.Fatalf("kept = %v, want [true true false]: both keys exist, the third never did", kept)
		}
		if _, ttl, _ := read(t, k("short")); ttl <= 50*time.Second {
			t.Errorf("short TTL after Extend = %v, want about 1m", ttl)
		}
		if _, ttl, _ := read(t, k("long")); ttl <= 9*time.Minute {
			t.Errorf("long TTL after Extend = %v, want still about 10m (never shortened)", ttl)
		}
		if v, _, _ := read(t, k("short")); string(v) != "s" {
			t.Errorf("Extend changed the value to %q", v)
		}
		if _, _, ok := read(t, k("gone")); ok {
			t.Errorf("Extend created a key that did not exist")
		}
	})

	t.Run("Empty", func(t *testing.T) {
		if err := st.Set(ctx, nil); err != nil {
			t.Errorf("Set of nothing: %v", err)
		}
		if kept, err := st.Extend(ctx, nil, nil); err != nil || len(kept) != 0 {
			t.Errorf("Extend of nothing = %v, %v", kept, err)
		}
	})
}
