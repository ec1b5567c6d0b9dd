package config_test

import (
	"strings"
	"testing"

	"github.com/hearth-dev/hearth/config"
)

// A declaration whose members / interval need more than half the write
// capacity is warned of, naming it and the rate; so is the sum of several
// that each fit; a members_query family counts at its own max_members.
func TestWriteRateWarnings(t *testing.T) {
	parse := func(t *testing.T, keys string) *config.Config {
		t.Helper()
		cfg, err := config.Parse("w.yaml", []byte("sources:\n  - {name: db, type: postgres, dsn: \"postgres://u@127.0.0.1/test\"}\nkeys:\n"+keys))
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return cfg
	}
	big := parse(t, `  - {name: big, key: "b:{id}", source: db, ttl: 60s, members_query: "SELECT id::text FROM t", max_members: 1000000, query: "SELECT id::text, v FROM t WHERE id = ANY($1::bigint[])"}
  - {name: listed, key: "l:{id}", source: db, ttl: 60s, members_query: "SELECT id::text FROM t", query: "SELECT id::text, v FROM t WHERE id = ANY($1::bigint[])"}
`)
	got := big.WriteRateWarnings(config.DefaultWriteCapacity)
	if want := "keys[big]: 1000000 members every 30s need 33333 key writes/s, over 50% of the write capacity 40000 keys/s"; len(got) != 1 || !strings.HasPrefix(got[0], want) {
		t.Errorf("warnings %q, want one starting %q", got, want)
	}
	if got := big.WriteRateWarnings(100_000); len(got) != 0 {
		t.Errorf("at 100,000 keys/s: warnings %q, want none", got)
	}
	var keys strings.Builder
	for _, n := range []string{"a", "b", "c"} {
		keys.WriteString(`  - {name: ` + n + `, key: "` + n + `:{id}", source: db, ttl: 40s, members: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], query: "SELECT id::text, v FROM t WHERE id = ANY($1::bigint[])"}` + "\n")
	}
	// 20 members every 20s each: 1 key/s apiece, 3 together.
	several := parse(t, keys.String())
	got = several.WriteRateWarnings(4)
	if want := "keys: the declarations together need 3 key writes/s, over 50% of the write capacity 4 keys/s"; len(got) != 1 || !strings.HasPrefix(got[0], want) {
		t.Errorf("warnings %q, want one starting %q", got, want)
	}
}
