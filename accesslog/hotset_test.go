package accesslog_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// TestEachTopMatching: a family's ranking holds its keys only, hottest first;
// the template's literal parts are matched literally (a '_' or '%' in them is
// no LIKE wildcard), the parameter must be at least one character, and fn
// stops it. The stored ranking gives the same list.
func TestEachTopMatching(t *testing.T) {
	pg := testenv.Postgres(t)
	migrate(t, pg.Pool)
	l := accesslog.New(pg.Pool)
	ctx := context.Background()
	if err := l.Record(ctx, time.Now(), time.Minute, map[string]int64{
		"a_b%:1:x": 50, "a_b%:2:x": 40, "aXbY:3:x": 90, "a_b%::x": 80, "a_b%:4:y": 70, "a_b%:5:x": 30, "zzz": 99,
	}); err != nil {
		t.Fatal(err)
	}
	read := func(n int, stop int) ([]string, string) {
		t.Helper()
		var got []string
		src, err := l.EachTopMatching(ctx, time.Hour, n, "a_b%:", ":x", func(k string) bool {
			got = append(got, k)
			return len(got) < stop
		})
		if err != nil {
			t.Fatal(err)
		}
		return got, src
	}
	want := []string{"a_b%:1:x", "a_b%:2:x", "a_b%:5:x"}
	if got, src := read(10, 10); !slices.Equal(got, want) || src != accesslog.RankingLive {
		t.Errorf("live: got %v (%s), want %v (live)", got, src, want)
	}
	if got, _ := read(2, 10); !slices.Equal(got, want[:2]) {
		t.Errorf("n=2: got %v, want %v", got, want[:2])
	}
	if got, _ := read(10, 1); !slices.Equal(got, want[:1]) {
		t.Errorf("stopped after 1: got %v, want %v", got, want[:1])
	}
	l.UseRanking(time.Minute)
	if _, err := l.Rank(ctx, time.Hour, 100); err != nil {
		t.Fatal(err)
	}
	if got, src := read(10, 10); !slices.Equal(got, want) || src != accesslog.RankingStored {
		t.Errorf("stored: got %v (%s), want %v (stored)", got, src, want)
	}
	if got, want := accesslog.LikePattern("a!_%", "%"), "a!!!_!%_%!%"; got != want {
		t.Errorf("LikePattern = %q, want %q", got, want)
	}
}
