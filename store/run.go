package store

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// ScriptReply splits the reply of a fence script: an integer code, or
// {code, found} when the script repaired a foreign fence value.
func ScriptReply(c *redis.Cmd) (code int64, found string, repaired bool, err error) {
	v, err := c.Result()
	if err != nil {
		return 0, "", false, err
	}
	switch v := v.(type) {
	case int64:
		return v, "", false, nil
	case []any:
		if len(v) == 2 {
			n, ok1 := v[0].(int64)
			s, ok2 := v[1].(string)
			if ok1 && ok2 {
				return n, s, true, nil
			}
		}
	}
	return 0, "", false, fmt.Errorf("unexpected script reply %v", v)
}

// PipelineMax is the most script runs RunScript sends in one pipeline. Each
// pipeline's replies are read within the client's read timeout, so a longer
// one (a new leader raising 16,384 per-slot fences on a loaded Cluster) would
// time out as a whole; in pipelines of this size each is read in its own time,
// and the caller's context bounds them all.
const PipelineMax = 1024

// RunScript runs script n times, by its SHA, in pipelines of at most
// PipelineMax runs, with the keys and arguments args(i) gives run i. When
// Redis answers NOSCRIPT (its script cache was flushed, it restarted, or a
// node was added), the script is loaded (on every master of a Cluster) and
// those runs are sent again by SHA; a run still refused is sent in full
// (EVAL). It returns the commands, or the first error other than NOSCRIPT.
func RunScript(ctx context.Context, client redis.UniversalClient, script *redis.Script, n int, args func(i int) ([]string, []any)) ([]*redis.Cmd, error) {
	return runScript(ctx, client, script, n, func(pipe redis.Pipeliner, i int, full bool) *redis.Cmd {
		keys, argv := args(i)
		if full {
			return script.Eval(ctx, pipe, keys, argv...)
		}
		return script.EvalSha(ctx, pipe, keys, argv...)
	})
}

// ScriptHead is how many leading slots RunPacked's runs leave free for the
// command, the script and the key count.
const ScriptHead = 3

// RunPacked is RunScript for runs of many keys each, whose keys and
// arguments args(i) packs into one slice: ScriptHead free slots, then the
// keys (string, *string or *Bytes), then the arguments, nkeys the number of
// keys.
// Pointers (*string, *int64, *Bytes) let a batch pass every key's keys and
// arguments from arrays of its own, without an allocation per argument.
func RunPacked(ctx context.Context, client redis.UniversalClient, script *redis.Script, n int, args func(i int) (cmd []any, nkeys int)) ([]*redis.Cmd, error) {
	return runScript(ctx, client, script, n, func(pipe redis.Pipeliner, i int, full bool) *redis.Cmd {
		cmd, nkeys := args(i)
		if full {
			keys := make([]string, nkeys)
			for j, k := range cmd[ScriptHead : ScriptHead+nkeys] {
				switch k := k.(type) {
				case string:
					keys[j] = k
				case *string:
					keys[j] = *k
				case *Bytes:
					keys[j] = string(*k)
				default:
					panic(fmt.Sprintf("store.RunPacked: key %d is a %T", j, k))
				}
			}
			return script.Eval(ctx, pipe, keys, cmd[ScriptHead+nkeys:]...)
		}
		cmd[0], cmd[1], cmd[2] = "evalsha", script.Hash(), strconv.Itoa(nkeys)
		c := pipe.Do(ctx, cmd...)
		if nkeys > 0 {
			c.SetFirstKeyPos(ScriptHead) // as EvalSha's: a Cluster routes by it
		}
		return c
	})
}

// Bytes is a value argument passed by pointer (RunPacked): go-redis writes a
// BinaryMarshaler's bytes as they are, and a pointer in an interface costs
// no allocation where a slice does.
type Bytes []byte

// MarshalBinary returns the bytes themselves.
func (b *Bytes) MarshalBinary() ([]byte, error) { return *b, nil }

func runScript(ctx context.Context, client redis.UniversalClient, script *redis.Script, n int, queue func(pipe redis.Pipeliner, i int, full bool) *redis.Cmd) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, n)
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	send := func(runs []int, full bool) {
		for len(runs) > 0 {
			chunk := runs[:min(len(runs), PipelineMax)]
			runs = runs[len(chunk):]
			pipe := client.Pipeline()
			for _, i := range chunk {
				cmds[i] = queue(pipe, i, full)
			}
			_, _ = pipe.Exec(ctx)
		}
	}
	// refused returns the runs Redis answered NOSCRIPT, or the first other error.
	refused := func(runs []int) ([]int, error) {
		var out []int
		for _, i := range runs {
			if err := cmds[i].Err(); err != nil {
				if !redis.HasErrorPrefix(err, "NOSCRIPT") {
					return nil, err
				}
				out = append(out, i)
			}
		}
		return out, nil
	}
	send(all, false)
	retry, err := refused(all)
	if err == nil && len(retry) > 0 && script.Load(ctx, client).Err() == nil {
		send(retry, false)
		retry, err = refused(retry)
	}
	if err != nil {
		return nil, err
	}
	send(retry, true)
	for _, i := range retry {
		if err := cmds[i].Err(); err != nil {
			return nil, err
		}
	}
	return cmds, nil
}
