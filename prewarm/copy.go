package prewarm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// CopySource is the Redis a blue-green pre-warm copies from (`hearth prewarm
// --from`): the one serving, which holds the values Hearth wrote, their
// remaining TTLs and their version records. Everything read from it is
// untrusted: a key of another type, one without a TTL or a value larger than
// the declaration allows is skipped and counted (SourceSkipped), and loaded
// from the origin instead unless FromOnly.
type CopySource struct {
	Client redis.UniversalClient
	// Name names the source in the report and the logs; it holds no password.
	Name string
	// Target writes the copies, fill-absent and fenced: the Store of
	// `hearth prewarm`, which the engine's loads write through too.
	Target CopyTarget
	// Namespace is the source's redis.namespace, where its version records
	// are (store.VersionKey).
	Namespace string
	// FromOnly never loads from the origin: keys the source cannot give are
	// not loaded (SourceMissing, counted failed).
	FromOnly bool
}

// Reasons a source key is not copied (PrewarmReport.SourceSkipped); the key
// is then loaded from the origin, unless FromOnly.
const (
	// CopySkipWrongType: the source key is not a string (Hearth writes strings only).
	CopySkipWrongType = "wrong_type"
	// CopySkipNoTTL: the source key has no TTL, which Hearth never writes.
	CopySkipNoTTL = "no_ttl"
	// CopySkipTooLarge: the value is larger than the declaration's max_value_bytes.
	CopySkipTooLarge = "too_large"
)

// copyOutcome is a copied batch's outcome: warmer.Outcome's counts over every
// member, and where the loaded ones came from.
type copyOutcome struct {
	warmer.Outcome
	// Copied were written from the source; FromOrigin loaded from the
	// origin (absent or skipped in the source); SourceMissing the source
	// could not give (absent, expired, skipped); RecordsCopied carried
	// their version record's origin version.
	Copied, FromOrigin, SourceMissing, RecordsCopied int
}

// copyMember is what the source held for one wanted key.
type copyMember struct {
	member string
	get    *redis.StringCmd
	pttl   *redis.DurationCmd
	rec    *redis.StringCmd // nil: no record read
}

// copyBatch copies one batch from the source: pipelined GET + PTTL (and the
// version record's GET for a declaration with a version column), then one
// write through Target (fill-absent and fenced as every pre-warm write).
// Keys the source cannot give fall back to the origin (RefreshMembers) unless
// FromOnly. It returns the batch's outcome, as RefreshMembers does.
func (r *prewarmRun) copyBatch(ctx context.Context, j prewarmJob) (copyOutcome, error) {
	src, spec := r.po.Copy, j.spec
	pipe := src.Client.Pipeline()
	wanted := j.members.strings()
	ms := make([]copyMember, len(wanted))
	withRec := spec.VersionColumn != ""
	for i, m := range wanted {
		key := spec.Template.Key(m)
		ms[i] = copyMember{member: m, get: pipe.Get(ctx, key), pttl: pipe.PTTL(ctx, key)}
		if withRec {
			ms[i].rec = pipe.Get(ctx, store.VersionKey(src.Namespace, key))
		}
	}
	var out copyOutcome
	read := time.Now()
	_, err := pipe.Exec(ctx)
	readRTT := time.Since(read)
	if err != nil && !isKeyLevel(err) {
		// The source is unreachable: nothing of this batch is known. The
		// origin is not asked for a whole source's worth of keys behind the
		// operator's back; the batch fails and the run reports the error.
		out.Failed = len(wanted)
		out.LastError = fmt.Errorf("read %d keys of %s from the source redis: %w", len(wanted), spec.Name, err)
		return out, out.LastError
	}
	var (
		entries  []store.Entry
		members  []string // entries[i] is members[i]'s, for the keys about to expire (below)
		negative []bool
		fallback []string
	)
	skips := map[string]int{}
	vttl := warmer.VersionTTL(spec)
	maxTTL := max(spec.MaxTTL(), spec.NegativeTTL)
	for _, c := range ms {
		v, err := c.get.Bytes()
		switch {
		case errors.Is(err, redis.Nil):
			fallback = append(fallback, c.member)
			continue
		case err != nil && redis.HasErrorPrefix(err, "WRONGTYPE"):
			skips[CopySkipWrongType]++
			fallback = append(fallback, c.member)
			continue
		case err != nil:
			fallback = append(fallback, c.member)
			continue
		}
		ttl, err := c.pttl.Result()
		switch {
		case err != nil || ttl == -2 || (ttl >= 0 && ttl < time.Millisecond):
			fallback = append(fallback, c.member) // expired between GET and PTTL
			continue
		case ttl < 0:
			skips[CopySkipNoTTL]++
			fallback = append(fallback, c.member)
			continue
		}
		neg := spec.NegativeValue != nil && bytes.Equal(v, spec.NegativeValue)
		if !neg && spec.MaxValueBytes > 0 && len(v) > spec.MaxValueBytes {
			skips[CopySkipTooLarge]++
			fallback = append(fallback, c.member)
			continue
		}
		// The remaining TTL, never longer than the declaration sets (a longer
		// one is not Hearth's), re-jittered downward only: copies of keys
		// written together do not all expire together, and none outlives
		// the source's.
		ttl = min(ttl, maxTTL)
		if j := spec.Jitter; j > 0 && j < 1 {
			ttl -= time.Duration(float64(ttl) * j / 2 * rand.Float64())
		}
		e := store.Entry{Key: spec.Template.Key(c.member), Value: v, TTL: ttl} // checked below, once the time spent is known
		if warmer.Stamped(spec) {
			// warmer.Stamped: written through the version check, which orders the
			// copy (epoch, 0) before every load of the target leader's term.
			e.Seq, e.VersionTTL, e.Family = 1, vttl, spec.Name
		}
		if c.rec != nil && !neg {
			if rec, err := c.rec.Result(); err == nil {
				ver, versioned, hash, ok := store.ParseCopiedRecord(rec)
				if ok && versioned && hash == store.ValueHash(v) {
					// The record backs this value: its origin version
					// travels with it, so an older row never replaces it.
					e.Versioned, e.Version = true, ver
					out.RecordsCopied++
				}
			}
		}
		entries = append(entries, e)
		members = append(members, c.member)
		negative = append(negative, neg)
	}
	r.mu.Lock()
	if r.rep.SourceSkipped == nil && len(skips) > 0 {
		r.rep.SourceSkipped = map[string]int{}
	}
	for k, n := range skips {
		r.rep.SourceSkipped[k] += n
	}
	r.mu.Unlock()
	// The source's TTLs count from its answer, and the target's from when it
	// runs the write: the time since the read began, plus the read's own
	// round trip for the write's (a script, not cheaper), plus a millisecond
	// of rounding, is taken off, so that a copy does not outlive its source
	// (CI caught a copy 22 ms past it when only the time since the read was
	// taken off: the write's own latency under load). The slowest write of
	// the run so far is taken off too, so that one as slow needs no repair;
	// one slower is repaired once it returns (below).
	est := time.Duration(r.copyWrite.Load())
	at := time.Now()
	spent := at.Sub(read) + readRTT + time.Millisecond + est
	kept := 0
	for i := range entries {
		ttl, ok := copyTTL(entries[i].TTL, spent)
		if !ok {
			// As good as expired: a copy of it would outlive it.
			fallback = append(fallback, members[i])
			continue
		}
		entries[i].TTL = ttl
		entries[kept], negative[kept] = entries[i], negative[i]
		kept++
	}
	entries, negative = entries[:kept], negative[:kept]
	if len(entries) > 0 {
		res, err := src.Target.SetEach(ctx, entries)
		took := time.Since(at)
		if d := int64(took); d > r.copyWrite.Load() {
			r.copyWrite.Store(d) // a race may keep a smaller one: it only costs a repair
		}
		if err != nil {
			out.Failed += len(entries)
			out.LastError = fmt.Errorf("write %d copied keys of %s: %w", len(entries), spec.Name, err)
		} else {
			// A copy expires at most took - readRTT - 1ms - est after its
			// source (its SET ran before the write returned; the source's
			// PTTL was read after the read was sent): when that is positive,
			// the written copies are shortened by it, each counted from its
			// own expiry, so that no copy outlives its source however long
			// the write or the repair took.
			if late := took - readRTT - time.Millisecond - est; late > 0 {
				var keys []string
				for i, o := range res {
					if o == store.SetWritten {
						keys = append(keys, entries[i].Key)
					}
				}
				if err := src.Target.Shorten(ctx, keys, late); err != nil {
					out.LastError = fmt.Errorf("shorten %d copied keys of %s by %s: %w", len(keys), spec.Name, late, err)
				}
			}
			for i, o := range res {
				switch o {
				case store.SetWritten:
					out.Copied++
					if negative[i] {
						out.Negative++
					} else {
						out.Written++
					}
				case store.SetPresent:
					out.Present++
				case store.SetFenced:
					out.Failed++
					out.Fenced++
					out.LastError = fmt.Errorf("write %s: %w", spec.Name, warmer.ErrPrewarmFenced)
				}
			}
		}
	}
	out.SourceMissing = len(fallback)
	if len(fallback) == 0 {
		return out, out.LastError
	}
	if src.FromOnly {
		out.Failed += len(fallback)
		return out, out.LastError
	}
	o, err := r.p.e.RefreshMembers(ctx, spec.Name, fallback)
	out.Written += o.Written
	out.Negative += o.Negative
	out.Present += o.Present
	out.Fenced += o.Fenced
	out.FromOrigin += o.Written + o.Negative + o.Present
	if err != nil && out.LastError == nil {
		out.LastError = err
	}
	return out, out.LastError
}

// copyTTL is a copy's TTL: what the source had left when read, less spent
// since; false when under a millisecond would be left. PX counts whole
// milliseconds and the copy must not outlive its source, so such a key is as
// good as expired, and is loaded as one.
func copyTTL(remaining, spent time.Duration) (time.Duration, bool) {
	ttl := remaining - spent
	return ttl, ttl >= time.Millisecond
}

// CopyTarget is where a copy writes (Store). Shorten repairs the copies of a
// write that took longer than their TTLs allowed for: it takes by off each
// key's TTL, counted from the key's own expiry.
type CopyTarget interface {
	warmer.EachStore
	Shorten(ctx context.Context, keys []string, by time.Duration) error
}

// isKeyLevel reports whether a pipeline's error is one key's (absent, wrong
// type), not the connection's.
func isKeyLevel(err error) bool {
	return errors.Is(err, redis.Nil) || redis.HasErrorPrefix(err, "WRONGTYPE")
}

// scanCount is the COUNT hint of the source SCAN.
const scanCount = 1000

// scanSource is the selection of a copy whose access log could not be read:
// each family's declared members, then the keys the source holds under the
// family's template (one SCAN per declaration, its MATCH pattern built from
// the template's literal parts, escaped), each matched and validated like an
// access-log key, at most n keys in all. On a Cluster every master is scanned.
func (r *prewarmRun) scanSource(ctx context.Context, n int) error {
	src := r.po.Copy
	r.reader.checkAll() // the ranking's keys, counted as the ranking's
	r.reader.scanning = true
	defer func() {
		r.reader.checkAll()
		r.reader.scanning = false
	}()
	added := 0
	add := func(key string) bool {
		if added >= n {
			return false
		}
		added++
		r.add(key)
		return true
	}
	for _, s := range r.specs {
		if s.Template.IsFamily() {
			for _, m := range s.Members {
				if !add(s.Template.Key(m)) {
					return nil
				}
			}
		}
	}
	for _, s := range r.specs {
		if !s.Template.IsFamily() {
			continue
		}
		prefix, suffix := s.Template.Literals()
		match := globEscape(prefix) + "*" + globEscape(suffix)
		scan := func(ctx context.Context, c redis.UniversalClient) error {
			it := c.ScanType(ctx, 0, match, scanCount, "string").Iterator()
			for it.Next(ctx) {
				if !add(it.Val()) {
					return nil
				}
			}
			return it.Err()
		}
		var err error
		if cc, ok := src.Client.(*redis.ClusterClient); ok {
			// The reader's state is not shared: the masters are scanned one by one.
			var masters []*redis.Client
			err = cc.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
				r.mu.Lock()
				masters = append(masters, m)
				r.mu.Unlock()
				return nil
			})
			for _, m := range masters {
				if err == nil {
					err = scan(ctx, m)
				}
			}
		} else {
			err = scan(ctx, src.Client)
		}
		if err != nil {
			return fmt.Errorf("scan the source redis for %s: %w", s.Name, err)
		}
		if added >= n {
			return nil
		}
	}
	return nil
}

// globEscape escapes the characters a Redis MATCH pattern gives a meaning to.
func globEscape(s string) string {
	var b bytes.Buffer
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '*', '?', '[', ']', '\\', '^', '-':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
