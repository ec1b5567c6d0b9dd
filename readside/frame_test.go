package readside

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

// FuzzOpenStale: whatever bytes a stale key holds, openStale either rejects
// them or they are exactly readside's frame of the value it returns, written
// within the bound.
func FuzzOpenStale(f *testing.F) {
	now := time.UnixMilli(1_800_000_000_000)
	for _, v := range []string{"", "v", "{\"id\":7}"} {
		f.Add(append(staleHeader([]byte(v), now.Add(-time.Minute)), v...))
	}
	f.Add([]byte("garbage"))
	f.Add([]byte(staleMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, reason := openStale(b, now, time.Hour)
		if reason != "" {
			if v != nil {
				t.Fatalf("rejected (%s) but returned %q", reason, v)
			}
			return
		}
		written := time.UnixMilli(int64(binary.BigEndian.Uint64(b[4:12])))
		if want := append(staleHeader(v, written), v...); !bytes.Equal(b, want) {
			t.Fatalf("accepted %q, which is not the frame of %q", b, v)
		}
		if age := now.Sub(written); age > time.Hour || age < -staleSkew {
			t.Fatalf("accepted a copy of age %s", age)
		}
	})
}

// TestStaleFrameBitFlips: every single-bit change of a frame is rejected
// (CRC-32 detects all of them), with the reason the changed field gives.
func TestStaleFrameBitFlips(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	v := []byte("a value of some length, 42 bytes or so...")
	good := append(staleHeader(v, now), v...)
	if got, reason := openStale(good, now, time.Hour); reason != "" || !bytes.Equal(got, v) {
		t.Fatalf("the frame itself: %q, %q", got, reason)
	}
	for i := range len(good) * 8 {
		b := bytes.Clone(good)
		b[i/8] ^= 1 << (i % 8)
		want := staleBadChecksum
		switch {
		case i/8 < 3:
			want = staleUnframed
		case i/8 == 3:
			want = staleUnknownVersion
		}
		if _, reason := openStale(b, now, time.Hour); reason != want {
			t.Errorf("bit %d flipped: reason %q, want %q", i, reason, want)
		}
	}
	if _, reason := openStale(good[:len(good)-1], now, time.Hour); reason != staleBadChecksum {
		t.Errorf("one byte short: %q, want %s", reason, staleBadChecksum)
	}
	if _, reason := openStale(good, now.Add(time.Hour+time.Millisecond), time.Hour); reason != staleTooOld {
		t.Errorf("an hour and a millisecond later: %q, want %s", reason, staleTooOld)
	}
}
