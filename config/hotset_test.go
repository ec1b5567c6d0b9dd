package config_test

import (
	"testing"
	"time"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/warmer"
)

func TestHotSetDefaultsAndOverrides(t *testing.T) {
	const head = `
sources:
  - {name: db, type: postgres, dsn: "postgres://postgres@127.0.0.1:5432/test"}
access_log:
  source: db
  rank_interval: 30s
prewarm:
  window: 2h
keys:
  - name: p
    key: "p:{id}"
    source: db
    ttl: 60s
    query: "SELECT id::text, v FROM t WHERE id = ANY($1::bigint[])"
`
	for _, tc := range []struct {
		name, members string
		want          warmer.HotSet
		static        []string
	}{
		{"inherited", `    members_from: {access_log: {top_n: 100}}`,
			warmer.HotSet{TopN: 100, Window: 2 * time.Hour, RankInterval: 30 * time.Second, Hysteresis: config.DefaultHysteresis, DemoteAfter: config.DefaultDemoteAfter}, nil},
		{"own", `    members: ["1", "2"]
    members_from: {access_log: {top_n: 7, window: 10m, rank_interval: 5s, hysteresis: 0, demote_after: 1}}`,
			warmer.HotSet{TopN: 7, Window: 10 * time.Minute, RankInterval: 5 * time.Second, Hysteresis: 0, DemoteAfter: 1}, []string{"1", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse(tc.name+".yaml", []byte(head+tc.members+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			s := cfg.Specs()[0]
			if s.HotSet == nil {
				t.Fatal("no hot set")
			}
			if got := *s.HotSet; got != tc.want {
				t.Errorf("hot set = %+v, want %+v", got, tc.want)
			}
			if got, want := len(s.Members), len(tc.static); got != want {
				t.Errorf("static members = %v, want %v", s.Members, tc.static)
			}
		})
	}
	t.Run("limit", func(t *testing.T) {
		for _, tc := range []struct {
			n    int
			h    float64
			want int
		}{{10, 0, 10}, {10, 0.2, 12}, {10, 0.25, 13}, {1, 1, 2}, {3, -1, 3}} {
			h := warmer.HotSet{TopN: tc.n, Hysteresis: tc.h}
			if got := h.Limit(); got != tc.want {
				t.Errorf("Limit(top_n %d, hysteresis %g) = %d, want %d", tc.n, tc.h, got, tc.want)
			}
		}
	})
}
