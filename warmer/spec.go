package warmer

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"time"

	"github.com/hearth-dev/hearth/keytmpl"
)

// Spec is one validated key declaration: a single key or a family of keys, where
// its values come from and how long they live.
type Spec struct {
	// Name identifies the declaration in logs, metrics and the admin API.
	Name string
	// Template is the key (single) or key template (family).
	Template keytmpl.Template
	// Source names the origin the values are loaded from.
	Source string

	// TTL is the nominal time to live of a written value.
	TTL time.Duration
	// Jitter spreads TTLs: a value lives TTL * (1 + Jitter*(rand-0.5)).
	Jitter float64
	// Interval is how often the declaration is refreshed (at most TTL/2).
	Interval time.Duration
	// LoadTimeout bounds one load from the origin.
	LoadTimeout time.Duration

	// Members lists a family's members when they are declared statically.
	Members []string
	// MembersQuery lists a family's members from the source when set.
	MembersQuery string
	// MaxMembers bounds how many members a members query may return.
	MaxMembers int
	// BatchSize is how many members one load asks the origin for.
	BatchSize int
	// HotSet, when set, adds the family's hottest keys in the access log to
	// its members (package hotset ranks it).
	HotSet *HotSet

	// Query is the SQL a postgres source runs: no parameter for a single key,
	// $1 = text[] of members for a family, returning (member, value) rows.
	Query string
	// Path is the URL path (and query) template an HTTP source requests.
	Path string
	// JSONPointer selects the value inside a JSON response (RFC 6901); empty
	// means the whole body.
	JSONPointer string

	// NegativeTTL is how long the not-found sentinel lives.
	NegativeTTL time.Duration
	// NegativeValue is the sentinel written for a member the origin does not have.
	NegativeValue []byte
	// MaxStale bounds how long a value is kept alive past its last successful load
	// while the origin fails; zero disables stale extension.
	MaxStale time.Duration
	// MaxValueBytes rejects larger values (the old value is kept).
	MaxValueBytes int

	// VersionColumn names the column of Query that holds each row's version
	// (bigint, timestamptz or xmin::text::bigint); empty for none. With one,
	// a write never replaces a value of a newer version (see version.go).
	VersionColumn string
	// Notify is the PostgreSQL channel whose notifications name changed
	// members (see package changes); empty for none.
	Notify string
	// Coalesce is an extra wait before a change-driven refresh, to gather
	// more changes into it; zero refreshes at once when idle and gathers only
	// while a refresh is in flight.
	Coalesce time.Duration
	// Gather is how long, under sustained change, a members refresh waits
	// from its first member's arrival to gather more (see package changes);
	// zero gathers nothing beyond what arrives during a refresh.
	Gather time.Duration
}

// JitteredTTL returns TTL * (1 + Jitter*(r-0.5)) for r in [0,1). A jitter
// outside [0,1) (NaN, Inf: config rejects them) is taken as none, and a
// product that would overflow a Duration gives TTL: neither may turn into the
// PX 1 an undefined float conversion would produce.
func (s *Spec) JitteredTTL(r float64) time.Duration {
	j := s.Jitter
	if !(j >= 0 && j < 1) || !(r >= 0 && r <= 1) {
		j = 0
	}
	f := float64(s.TTL) * (1 + j*(r-0.5))
	if !(f > 0 && f < math.MaxInt64) {
		return s.TTL
	}
	return time.Duration(f)
}

// MinTTL is the shortest TTL jitter can produce.
func (s *Spec) MinTTL() time.Duration { return s.JitteredTTL(0) }

// MaxTTL is the longest TTL jitter can produce.
func (s *Spec) MaxTTL() time.Duration { return s.JitteredTTL(1) }

func defaultRand() float64 { return rand.Float64() }

// MemberRises reports whether member b comes strictly after a, shorter first
// and equal lengths bytewise: the order of numbers written without leading
// zeros (the order an index gives a batch of ids), and a total order on all
// strings. A batch's answers matched to its members in order, one after the
// other, while the members rise, cannot be matched to a repeated member: no
// index of the members is needed.
func MemberRises(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// Result is what an origin returned for one member (Member is "" for a single key).
type Result struct {
	Member string
	// Value is written byte for byte.
	Value []byte
	// Missing means the origin says the member does not exist (no row, HTTP 404).
	Missing bool
	// Err means this member could not be loaded; its old value is kept.
	Err error
	// Version is the row's version, when HasVersion (a declaration with a
	// version column).
	Version    int64
	HasVersion bool
}

// Source is an origin Hearth loads values from.
type Source interface {
	// Load returns one result per member it could account for. Members absent
	// from the results are treated as missing. An error fails the whole batch.
	// For a single key, members is nil and the result's Member is "".
	Load(ctx context.Context, spec *Spec, members []string) ([]Result, error)
	// Ping checks that the origin is reachable.
	Ping(ctx context.Context) error
}

// Preparer is a Source that can get ready for n loads at once before they
// come: open that many connections and prepare the declarations' queries, so
// that the first loads of a pre-warm do not each wait for a connection of
// their own. A failure is left to the loads that follow, which report it.
type Preparer interface {
	Prepare(ctx context.Context, specs []*Spec, n int)
}

// MemberLister is a Source that can list a family's members (members_query).
type MemberLister interface {
	// ListMembers lists the members in the query's order. prev is what the
	// last successful call listed for spec (nil at first): a lister may hand
	// back prev's own strings where they are equal, so that an unchanged
	// list of a million members is read without a million new strings.
	ListMembers(ctx context.Context, spec *Spec, prev []string) ([]string, error)
}

// Reasons a member or a batch was not refreshed, as counted in metrics.
var (
	ErrTooLarge     = errors.New("value too large")
	ErrBadPayload   = errors.New("bad payload")
	ErrNullValue    = errors.New("null value")
	ErrDuplicate    = errors.New("duplicate member")
	ErrBadMember    = errors.New("invalid member")
	ErrTooMany      = errors.New("too many members")
	ErrOrigin       = errors.New("origin error")
	ErrUnknownSpec  = errors.New("unknown declaration")
	ErrSourceAbsent = errors.New("source not configured")
)

// reason maps an error to a bounded metric label.
func reason(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrBreakerOpen):
		return "breaker_open"
	case errors.Is(err, ErrOverloaded):
		return "overloaded"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, ErrTooLarge):
		return "too_large"
	case errors.Is(err, ErrBadPayload):
		return "bad_payload"
	case errors.Is(err, ErrNullValue):
		return "null_value"
	case errors.Is(err, ErrDuplicate):
		return "duplicate"
	case errors.Is(err, ErrBadMember):
		return "bad_member"
	case errors.Is(err, ErrTooMany):
		return "too_many_members"
	default:
		return "origin"
	}
}
