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

// TestRunPackedResendsAfterAFlush: runs packed into one slice sized for one
// pass (as fence's batched writes pack them), their keys and arguments
// pointers (a key as *Bytes), all come back right after the script cache was
// flushed: the re-send packs every refused run again past that capacity, and
// neither pass overwrites the other's commands.
func TestRunPackedResendsAfterAFlush(t *testing.T) {
	srv := testenv.PrivateRedis(t) // SCRIPT FLUSH: never on the shared server
	rdb := srv.Client(t)
	ctx := context.Background()
	script := redis.NewScript(`return KEYS[1] .. '|' .. KEYS[2] .. '|' .. ARGV[1] .. '|' .. ARGV[2]`)
	n := store.PipelineMax + 7
	keys, nums, vals := make([][]byte, n), make([]int64, n), make([][]byte, n)
	for i := range n {
		keys[i], nums[i], vals[i] = []byte("k"+strconv.Itoa(i)), int64(i), []byte("v"+strconv.Itoa(i))
	}
	for _, flush := range []bool{false, true} {
		if flush {
			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		cmd := make([]any, 0, n*(store.ScriptHead+4))
		cmds, err := store.RunPacked(ctx, rdb, script, n, func(i int) ([]any, int) {
			c0 := len(cmd)
			cmd = append(cmd, nil, nil, nil, "f", (*store.Bytes)(&keys[i]), &nums[i], (*store.Bytes)(&vals[i]))
			return cmd[c0:len(cmd):len(cmd)], 2
		})
		if err != nil {
			t.Fatalf("flushed %v: %v", flush, err)
		}
		for i, c := range cmds {
			want := "f|k" + strconv.Itoa(i) + "|" + strconv.Itoa(i) + "|v" + strconv.Itoa(i)
			if v, err := c.Text(); err != nil || v != want {
				t.Fatalf("flushed %v: run %d answered %q, %v; want %q", flush, i, v, err, want)
			}
		}
	}
}
