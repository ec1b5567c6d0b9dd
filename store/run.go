package store

import (
	"context"
	"fmt"

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

// RunScript runs script n times in one pipeline, with the keys and arguments
// args(i) gives run i, by its SHA; the runs Redis answers NOSCRIPT (its script
// cache was flushed, or it restarted) are sent again in full in a second
// pipeline, which also caches the script for the next call. It returns the
// commands, or the first error other than NOSCRIPT.
func RunScript(ctx context.Context, client redis.UniversalClient, script *redis.Script, n int, args func(i int) ([]string, []any)) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, n)
	pipe := client.Pipeline()
	for i := range n {
		keys, argv := args(i)
		cmds[i] = script.EvalSha(ctx, pipe, keys, argv...)
	}
	_, _ = pipe.Exec(ctx)
	var retry []int
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			if !redis.HasErrorPrefix(err, "NOSCRIPT") {
				return nil, err
			}
			retry = append(retry, i)
		}
	}
	if len(retry) == 0 {
		return cmds, nil
	}
	pipe = client.Pipeline()
	for _, i := range retry {
		keys, argv := args(i)
		cmds[i] = script.Eval(ctx, pipe, keys, argv...)
	}
	_, _ = pipe.Exec(ctx)
	for _, i := range retry {
		if err := cmds[i].Err(); err != nil {
			return nil, err
		}
	}
	return cmds, nil
}
