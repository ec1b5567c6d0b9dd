package testenv

import (
	"context"
	"testing"
	"time"
)

// TestDeleteKeysEscapesGlob checks that cleanup treats the prefix literally:
// a prefix full of glob characters deletes its own keys and nothing else.
func TestDeleteKeysEscapesGlob(t *testing.T) {
	t.Parallel()
	addr, _, err := sharedRedisAddr()
	if err != nil {
		RequireServer(t, "%v", err)
		return
	}
	c := newRedisClient(addr)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	r := randomHex(4)
	prefix := "t:glob*[ab]?-^\\" + r + ":"
	mine := []string{prefix + "1", prefix + "*", prefix + "[x]"}
	// Keys that the unescaped pattern would match, and must survive.
	others := []string{"t:globX[ab]?-^\\" + r + ":1", "t:glob*a?-^\\" + r + ":1", "t:glob*[ab]Z-^\\" + r + ":1"}
	for _, k := range append(append([]string{}, mine...), others...) {
		if err := c.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	defer c.Del(context.Background(), others...) // runs before c.Close

	if err := deleteKeys(addr, prefix); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, mine...).Result(); err != nil || n != 0 {
		t.Fatalf("%d of the prefix's keys left (err %v), want 0", n, err)
	}
	if n, err := c.Exists(ctx, others...).Result(); err != nil || n != int64(len(others)) {
		t.Fatalf("%d of %d other keys left (err %v): cleanup deleted keys outside the prefix", n, len(others), err)
	}
}

func TestSanitize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"TestA/sub_case#01": "TestA_sub_case_01",
		"Test/*[x]?":        "Test_x",
		"///":               "x",
		"a__b":              "a__b",
	} {
		if got := sanitize(in, 80); got != want {
			t.Errorf("sanitize(%q) = %q, want %q", in, got, want)
		}
	}
	if got := sanitize("abcdefgh_ijk", 9); got != "abcdefgh" {
		t.Errorf("cut: got %q, want %q", got, "abcdefgh")
	}
}
