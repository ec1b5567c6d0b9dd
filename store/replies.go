package store

import (
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Outcomes of VersionedSet, VersionedSetMany and PrewarmVersioned for one key.
const (
	CodeFenced   = 0
	CodeWritten  = 1
	CodeExtended = 2
	CodeOlder    = 3
	// CodeUnbacked: refused as older by a record whose value is absent or
	// not the bytes it was written with; the caller re-reads the origin.
	CodeUnbacked = 4
	// CodePresent (PrewarmVersioned only): the key held a value and the
	// pre-warm fills absent keys only.
	CodePresent = 5
)

// KeyReply is what the version check replied for one key.
type KeyReply struct {
	// Code is the outcome (CodeFenced … CodeUnbacked).
	Code int64
	// Record describes a foreign version record repaired ("" when none).
	Record string
	// Why is the reason of what the check found wrong ("" when nothing):
	// one of the Repair… reasons.
	Why string
	// Detail is, with CodeUnbacked, the record that refused the write, else
	// a description of a foreign value found at the key.
	Detail string
}

// VersionedManyReply splits {0, fence found} (fenced: replies nil) or {1,
// fence found, codes, then i, record found, reason, info for each key i
// (from 1) with any of those} for n keys, codes one digit per key.
func VersionedManyReply(c *redis.Cmd, n int) (replies []KeyReply, fence string, err error) {
	v, err := c.Result()
	if err != nil {
		return nil, "", err
	}
	a, ok := v.([]any)
	if !ok || len(a) < 2 {
		return nil, "", fmt.Errorf("unexpected script reply %v", v)
	}
	head, ok1 := a[0].(int64)
	fence, ok2 := a[1].(string)
	switch {
	case !ok1 || !ok2:
		return nil, "", fmt.Errorf("unexpected script reply %v", v)
	case head == 0 && len(a) == 2:
		return nil, fence, nil
	case head != 1 || len(a) < 3 || (len(a)-3)%4 != 0:
		return nil, "", fmt.Errorf("unexpected script reply for %d keys: %d elements", n, len(a))
	}
	codes, ok := a[2].(string)
	if !ok || len(codes) != n {
		return nil, "", fmt.Errorf("unexpected script reply for %d keys: codes %v", n, a[2])
	}
	replies = make([]KeyReply, n)
	for i := range n {
		code := int64(codes[i]) - '0'
		if code < CodeWritten || code > CodeUnbacked {
			return nil, "", fmt.Errorf("unexpected script reply for key %d: code %q", i, codes[i])
		}
		replies[i].Code = code
	}
	last := int64(0)
	for d := a[3:]; len(d) > 0; d = d[4:] {
		i, ok := d[0].(int64)
		if !ok || i <= last || i > int64(n) {
			return nil, "", fmt.Errorf("unexpected script reply for %d keys: key %v", n, d[0])
		}
		last = i
		r, ok := keyReplyOf(append([]any{replies[i-1].Code}, d[1:4]...))
		if !ok {
			return nil, "", fmt.Errorf("unexpected script reply for key %d: %v", i-1, d[1:4])
		}
		replies[i-1] = r
	}
	return replies, fence, nil
}

// keyReplyOf reads {code, record found, reason, info}.
func keyReplyOf(a []any) (KeyReply, bool) {
	code, ok1 := a[0].(int64)
	rec, ok2 := a[1].(string)
	why, ok3 := a[2].(string)
	info, ok4 := a[3].(string)
	if !ok1 || !ok2 || !ok3 || !ok4 || code < CodeFenced || code > CodeUnbacked {
		return KeyReply{}, false
	}
	return KeyReply{Code: code, Record: rec, Why: why, Detail: info}, true
}

// VersionedReply splits {code, fence found, record found, reason, info}.
func VersionedReply(c *redis.Cmd) (r KeyReply, fence string, err error) {
	v, err := c.Result()
	if err != nil {
		return KeyReply{}, "", err
	}
	if a, ok := v.([]any); ok && len(a) == 5 {
		f, ok1 := a[1].(string)
		r, ok2 := keyReplyOf(append([]any{a[0]}, a[2:]...))
		if ok1 && ok2 {
			return r, f, nil
		}
	}
	return KeyReply{}, "", fmt.Errorf("unexpected script reply %v", v)
}

// PrewarmVersionedReply splits the {code, fence found, record found} of
// PrewarmVersioned (codes up to CodePresent).
func PrewarmVersionedReply(c *redis.Cmd) (code int64, fence, record string, err error) {
	v, err := c.Result()
	if err != nil {
		return 0, "", "", err
	}
	if a, ok := v.([]any); ok && len(a) == 3 {
		n, ok1 := a[0].(int64)
		f, ok2 := a[1].(string)
		r, ok3 := a[2].(string)
		if ok1 && ok2 && ok3 && n >= CodeFenced && n <= CodePresent {
			return n, f, r, nil
		}
	}
	return 0, "", "", fmt.Errorf("unexpected script reply %v", v)
}

// RaiseReply is one reply of Raise or RepairRaise.
type RaiseReply struct {
	// Code is 1 raised (or equal), 0 a newer epoch holds the fence.
	Code int64
	// Found describes a foreign value repaired ("" when none).
	Found string
	// Fence is the epoch that refused the raise ("" when raised).
	Fence string
	// Fixed: RepairRaise lowered a fence above the epoch counter.
	Fixed bool
}

// ParseRaiseReply reads one {code, found, fence[, fixed]} reply of Raise or
// RepairRaise.
func ParseRaiseReply(c *redis.Cmd) (RaiseReply, error) {
	v, err := c.Slice()
	if err != nil {
		return RaiseReply{}, err
	}
	if len(v) < 3 {
		return RaiseReply{}, fmt.Errorf("unexpected script reply %v", v)
	}
	code, ok1 := v[0].(int64)
	found, ok2 := v[1].(string)
	fence, ok3 := v[2].(string)
	if !ok1 || !ok2 || !ok3 {
		return RaiseReply{}, fmt.Errorf("unexpected script reply %v", v)
	}
	r := RaiseReply{Code: code, Found: found, Fence: fence}
	if len(v) > 3 {
		n, _ := v[3].(int64)
		r.Fixed = n == 1
	}
	return r, nil
}
