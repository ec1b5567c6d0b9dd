package store_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/store"
)

// TestRunScriptChunksAndReloads: more runs than one pipeline holds all come
// back, in order, and so they do after the server's script cache is flushed
// (a restarted Redis, a new Cluster node): the script is loaded again.
func TestRunScriptChunksAndReloads(t *testing.T) {
	srv := testenv.PrivateRedis(t) // SCRIPT FLUSH: never on the shared server
	rdb := srv.Client(t)
	ctx := context.Background()
	echo := redis.NewScript(`return tonumber(ARGV[1]) * 2`)
	n := 2*store.PipelineMax + 7
	for _, flush := range []bool{false, true} {
		if flush {
			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		cmds, err := store.RunScript(ctx, rdb, echo, n, func(i int) ([]string, []any) {
			return []string{"k" + strconv.Itoa(i)}, []any{i}
		})
		if err != nil {
			t.Fatalf("flushed %v: %v", flush, err)
		}
		if len(cmds) != n {
			t.Fatalf("flushed %v: %d replies, want %d", flush, len(cmds), n)
		}
		for i, c := range cmds {
			if v, err := c.Int64(); err != nil || v != int64(2*i) {
				t.Fatalf("flushed %v: run %d answered %d, %v; want %d", flush, i, v, err, 2*i)
			}
		}
	}
}
