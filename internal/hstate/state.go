// Package hstate holds what the leader package and the warmer share about
// Hearth's own keys in Redis (fence, lease, epoch counter, re-warm marker): the
// Lua prelude that validates the epochs they hold, and the counter and log of
// the foreign values found there and repaired.
package hstate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// MaxEpochAhead bounds how far past Redis TIME an epoch read from Hearth's own
// keys (fence, lease, epoch counter) may lie and still count as one Hearth
// issued. Epochs are Redis TIME in ms at acquisition, or the last epoch + 1 when
// the clock went back, so a legitimate epoch is never far ahead of TIME; one
// minute tolerates clock steps and skew between Cluster masters. A value
// further ahead is foreign and repaired. A fence within the bound but above
// the epoch counter is foreign too; the leader package repairs it when it
// refuses a new leader's raise (leader/fence.go), so it holds writes off for
// one term, not for the minute.
const MaxEpochAhead = time.Minute

// FoundMax truncates what a foreign value is logged as.
const FoundMax = 64

// Kinds of Hearth state, the values of hearth_state_repairs_total's key label.
const (
	KindFence  = "fence"
	KindLease  = "lease"
	KindEpoch  = "epoch"
	KindMarker = "marker"
	// KindVersion: a version record beside a value (leader/version.go).
	KindVersion = "version"
)

// luaState is prepended to every script that reads Hearth's own keys. An epoch
// is valid when it is written as Hearth writes it, a decimal integer in its
// one canonical form (digits only, no leading zero: no sign, exponent, nan,
// inf, padding), of at most 16 digits, no later than Redis TIME +
// MaxEpochAhead. Another form of the same number is foreign too: the
// repairs compare-and-set against the canonical form, so a fence planted as
// 0<epoch> was never matched and held writes off until TIME passed it.
//
// hearth_epoch(key, e, now) returns the epoch a key holds (0 when absent) and,
// when the key holds anything else (a foreign value or another Redis type), a
// description of it, with 0: the caller treats it as absent and overwrites it.
// A valid epoch with a TTL (no Hearth sets one; its expiry would silently lift
// the fence) is kept, the TTL removed, and described too. e is the writer's
// epoch: a value at or below it is overwritten anyway, so TIME (the bound) and
// the TTL are only looked at when it is not below e, which keeps the common
// write (fence == writer's epoch) at one GET and one PTTL. now is Redis TIME
// in ms if the caller has it, else nil.
var luaState = `
local HEARTH_AHEAD_MS = ` + strconv.FormatInt(MaxEpochAhead.Milliseconds(), 10) + `
local function hearth_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function hearth_type(key)
  local t = redis.call('TYPE', key)
  return 'wrong type: ' .. tostring(t.ok or t)
end
local function hearth_canonical(s)
  return string.len(s) <= 16 and (s == '0' or string.match(s, '^[1-9]%d*$') ~= nil)
end
local function hearth_epoch_ok(s, now)
  if type(s) ~= 'string' or not hearth_canonical(s) then return false end
  return tonumber(s) <= now + HEARTH_AHEAD_MS
end
local function hearth_epoch(key, e, now)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then return 0, hearth_type(key) end
  if not v then return 0, nil end
  if not hearth_canonical(v) then return 0, string.sub(v, 1, ` + strconv.Itoa(FoundMax) + `) end
  local n = tonumber(v)
  if e and n < e then return n, nil end
  if n ~= e and n > (now or hearth_now_ms()) + HEARTH_AHEAD_MS then return 0, v end
  if redis.call('PTTL', key) >= 0 then
    redis.call('PERSIST', key)
    return n, 'ttl set: ' .. v
  end
  return n, nil
end
`

// NewScript builds a script that may use the luaState helpers.
func NewScript(body string) *redis.Script { return redis.NewScript(luaState + body) }

// Repairs counts and logs the foreign values Hearth found in its own keys
// and repaired. The fence store, the lease and the re-warm watch share one
// counter per registry.
type Repairs struct {
	count *prometheus.CounterVec
	log   zerolog.Logger
}

// NewRepairs registers hearth_state_repairs_total on reg, or shares the one
// already registered there.
func NewRepairs(reg prometheus.Registerer, log zerolog.Logger) *Repairs {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hearth_state_repairs_total",
		Help: "Foreign values (not an integer epoch in range, wrong format or Redis type, no TTL, a lease no Hearth instance holds, a fence above the epoch counter) found in Hearth's own keys and repaired, by kind of key (fence, lease, epoch, marker, version).",
	}, []string{"key"})
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(err)
		}
		c = are.ExistingCollector.(*prometheus.CounterVec)
	}
	for _, k := range []string{KindFence, KindLease, KindEpoch, KindMarker, KindVersion} {
		c.WithLabelValues(k)
	}
	return &Repairs{count: c, log: log}
}

// Repaired records one repair: kind is the label, key the Redis key, found
// what it held (already truncated by the script).
func (r *Repairs) Repaired(kind, key, found string) { r.RepairedWhy(kind, key, found, "") }

// RepairedWhy records one repair of a value that is well-formed but that no
// Hearth instance would have left there; why says what gave it away (its TTL,
// an epoch never issued), and is logged when not empty.
func (r *Repairs) RepairedWhy(kind, key, found, why string) {
	r.count.WithLabelValues(kind).Inc()
	if len(found) > FoundMax {
		found = found[:FoundMax]
	}
	ev := r.log.Warn().Str("state", kind).Str("key", key).Str("found", found)
	if why != "" {
		ev = ev.Str("why", why)
	}
	ev.Msg("foreign value in hearth's own key: treated as absent and repaired")
}

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
