// Package http is the HTTP upstream origin: one GET per member, the path template's
// parameter URL-escaped, the value the response body or a JSON pointer into it.
// Configured headers never leave the configured host: redirects to another host
// are refused by default and stripped of those headers when allowed.
package http

import (
	"context"
	"errors"
	"fmt"
	"io"
	nethttp "net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	"golang.org/x/text/unicode/norm"

	"github.com/hearth-dev/hearth/internal/redact"
	"github.com/hearth-dev/hearth/sources/budget"
	"github.com/hearth-dev/hearth/warmer"
)

// DefaultMaxBodyBytes bounds a response body when the source sets no bound.
const DefaultMaxBodyBytes = 8 << 20

// maxRedirects bounds a chain of followed redirects, as net/http's default does.
const maxRedirects = 10

// Redirect policies: which redirects a load follows.
const (
	// RedirectSameHost follows redirects to the same scheme, host and port only
	// (the default).
	RedirectSameHost = "same-host"
	// RedirectNone follows no redirect: any 3xx fails the load.
	RedirectNone = "none"
	// RedirectAny follows redirects anywhere, but never sends the configured
	// headers (nor a Referer) to another host.
	RedirectAny = "any"
)

// ErrRedirect is a redirect the policy refused; the member's load fails and its
// old value is kept.
var ErrRedirect = errors.New("redirect refused")

// Members refused in a path (each also warmer.ErrBadMember), see checkSegment.
var (
	// ErrDotSegment is a member that would become a "." or ".." path segment.
	ErrDotSegment = errors.New(`member would be a "." or ".." path segment`)
	// ErrPathSeparator is a member that would become more than one path
	// segment ('/' or '\', as written or once decoded).
	ErrPathSeparator = errors.New(`member would be more than one path segment (a '/' or '\' once decoded)`)
	// ErrControlChar is a member that decodes to a control character.
	ErrControlChar = errors.New("member decodes to a control character")
	// ErrInvalidUTF8 is a member that is, or decodes to, invalid UTF-8
	// (an overlong %C0%AE is a '.' to a lenient decoder).
	ErrInvalidUTF8 = errors.New("member is not valid UTF-8 once decoded")
)

// Config is an HTTP upstream source.
type Config struct {
	Name    string
	BaseURL string
	// Headers are sent with every request (e.g. Authorization); never logged,
	// never sent to another host.
	Headers map[string]string
	// Timeout bounds one request.
	Timeout time.Duration
	// Concurrency bounds the requests one batch has in flight.
	Concurrency  int
	MaxBodyBytes int64
	// HealthPath is requested by Ping; any answer below 500 counts as reachable.
	HealthPath string
	// Redirects is RedirectSameHost (the default when empty), RedirectNone or
	// RedirectAny.
	Redirects string
	// Metrics receives the source's counters; nil keeps them private.
	Metrics *Metrics
	// Budget is the process's in-flight payload budget, shared by every
	// source; nil bounds nothing.
	Budget *budget.Budget
	// Log receives refused redirects (sampled); the zero value discards them.
	Log zerolog.Logger
}

// Metrics are the HTTP sources' counters, shared by every HTTP source of a process.
type Metrics struct {
	redirectsRefused *prometheus.CounterVec
	notModified      *prometheus.CounterVec
}

// NewMetrics registers the HTTP sources' metrics with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg) // nil: unregistered
	m := &Metrics{
		redirectsRefused: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_source_redirects_refused_total",
			Help: "Redirects an HTTP source refused to follow (policy redirects: same-host or none); the member's old value is kept.",
		}, []string{"source"}),
		notModified: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_source_not_modified_total",
			Help: "Conditional HTTP loads the upstream answered 304 Not Modified: the remembered value was reused, no body sent.",
		}, []string{"source"}),
	}
	return m
}

// Source loads values over HTTP.
type Source struct {
	cfg    Config
	base   *url.URL
	client *nethttp.Client
	log    zerolog.Logger
	// refused counts refused redirects of this source.
	refused prometheus.Counter
	// cond remembers validators for conditional requests (conditional.go).
	cond        *condCache
	notModified prometheus.Counter
}

var _ warmer.Source = (*Source)(nil)

// New validates the base URL and builds the client.
func New(cfg Config) (*Source, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("source %s: base_url must be an absolute http(s) URL", cfg.Name)
	}
	switch cfg.Redirects {
	case "":
		cfg.Redirects = RedirectSameHost
	case RedirectSameHost, RedirectNone, RedirectAny:
	default:
		return nil, fmt.Errorf("source %s: redirects must be same-host, none or any (got %q)", cfg.Name, cfg.Redirects)
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 8
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	tr := nethttp.DefaultTransport.(*nethttp.Transport).Clone()
	tr.MaxIdleConnsPerHost = cfg.Concurrency
	s := &Source{
		cfg:  cfg,
		base: u,
		// One warning per member would flood the log when a whole family
		// redirects: a burst, then one per period.
		log:         cfg.Log.With().Str("component", "source").Str("source", cfg.Name).Logger().Sample(&zerolog.BurstSampler{Burst: 5, Period: time.Minute}),
		refused:     cfg.Metrics.redirectsRefused.WithLabelValues(cfg.Name),
		cond:        newCondCache(),
		notModified: cfg.Metrics.notModified.WithLabelValues(cfg.Name),
	}
	s.client = &nethttp.Client{Timeout: cfg.Timeout, Transport: tr, CheckRedirect: s.checkRedirect}
	return s, nil
}

type pingKey struct{}

// checkRedirect applies the redirect policy. net/http has already copied the
// original headers onto req; it strips only Authorization, Cookie and a few
// others on a host change, so the configured headers (X-Api-Key…) and the
// Referer (which may carry a base_url query token) are removed here.
func (s *Source) checkRedirect(req *nethttp.Request, via []*nethttp.Request) error {
	if req.Context().Value(pingKey{}) != nil {
		// Ping: a redirect is an answer, and reachable.
		return nethttp.ErrUseLastResponse
	}
	same := sameOrigin(via[0].URL, req.URL)
	switch {
	case len(via) >= maxRedirects:
		return s.refuse(req, via, fmt.Sprintf("more than %d redirects", maxRedirects))
	case s.cfg.Redirects == RedirectNone:
		return s.refuse(req, via, "redirects: none")
	case s.cfg.Redirects == RedirectSameHost && !same:
		return s.refuse(req, via, "redirects: same-host")
	}
	if !same {
		for k := range s.cfg.Headers {
			req.Header.Del(k)
		}
		req.Header.Del("Referer")
	}
	return nil
}

func (s *Source) refuse(req *nethttp.Request, via []*nethttp.Request, why string) error {
	s.refused.Inc()
	to := origin(req.URL)
	s.log.Warn().Str("from", origin(via[0].URL)).Str("to", to).Str("policy", s.cfg.Redirects).
		Msg("redirect refused; the member's old value is kept")
	return fmt.Errorf("%w to %s (%s)", ErrRedirect, to, why)
}

// origin names a URL's scheme, host and port only: no path, query or userinfo.
func origin(u *url.URL) string {
	return u.Scheme + "://" + u.Host
}

// sameOrigin reports whether a and b have the same scheme, host and port
// (default ports made explicit).
func sameOrigin(a, b *url.URL) bool {
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) && port(a) == port(b)
}

func port(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	switch strings.ToLower(u.Scheme) {
	case "http":
		return "80"
	case "https":
		return "443"
	}
	return ""
}

// Close releases idle connections.
func (s *Source) Close() { s.client.CloseIdleConnections() }

// Ping requests the health path (the base URL by default): reachable means any
// answer below 500. A redirect is not followed: it is an answer.
func (s *Source) Ping(ctx context.Context) error {
	u := *s.base
	if s.cfg.HealthPath != "" {
		u.Path = strings.TrimRight(u.Path, "/") + s.cfg.HealthPath
		u.RawPath = ""
	}
	resp, err := s.do(context.WithValue(ctx, pingKey{}, true), u.String(), nil)
	if err != nil {
		return fmt.Errorf("ping %s (%s): %w", s.cfg.Name, redact.URL(s.cfg.BaseURL), err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode >= 500 {
		return fmt.Errorf("ping %s (%s): HTTP %d", s.cfg.Name, redact.URL(s.cfg.BaseURL), resp.StatusCode)
	}
	return nil
}

// Load fetches every member in parallel (bounded by Concurrency). Each member's
// failure is its own: one bad answer never fails the batch.
func (s *Source) Load(ctx context.Context, spec *warmer.Spec, members []string) ([]warmer.Result, error) {
	if !spec.Template.IsFamily() {
		return []warmer.Result{s.fetch(ctx, spec, "")}, nil
	}
	out := make([]warmer.Result, len(members))
	var g errgroup.Group
	g.SetLimit(s.cfg.Concurrency)
	for i, m := range members {
		g.Go(func() error {
			out[i] = s.fetch(ctx, spec, m)
			return nil
		})
	}
	_ = g.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// URL builds the request URL for a member: the parameter is path-escaped in the
// path and query-escaped in the query string, so a member cannot change the host,
// the path's shape or add query parameters.
func (s *Source) URL(spec *warmer.Spec, member string) (string, error) {
	return BuildURL(s.base, spec.Path, spec.Template.Param(), member)
}

// BuildURL expands a path template against a base URL. The base URL's own query
// (an api_key=…) comes first, the template's after it. In the path the member
// must stay one path segment whatever decodes it (checkSegment): a member that
// would not is warmer.ErrBadMember and never requested.
func BuildURL(base *url.URL, pathTmpl, param, member string) (string, error) {
	path, query, _ := strings.Cut(pathTmpl, "?")
	ph := "{" + param + "}"
	if param != "" {
		if strings.Contains(path, ph) {
			if err := checkSegment(member); err != nil {
				return "", fmt.Errorf("%w: %w (got %q)", warmer.ErrBadMember, err, member)
			}
		}
		path = strings.ReplaceAll(path, ph, url.PathEscape(member))
		query = strings.ReplaceAll(query, ph, url.QueryEscape(member))
	}
	u := *base
	u.RawPath = ""
	u.Path = ""
	raw := strings.TrimRight(base.EscapedPath(), "/") + path
	if query != "" {
		raw += "?" + query
	}
	ref, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("build url: %w", err)
	}
	u.Path, u.RawPath, u.RawQuery = ref.Path, ref.RawPath, ref.RawQuery
	if base.RawQuery != "" {
		u.RawQuery = base.RawQuery
		if ref.RawQuery != "" {
			u.RawQuery += "&" + ref.RawQuery
		}
	}
	return u.String(), nil
}

// maxDecodes is how many rounds of percent-decoding checkSegment undoes: a
// proxy and a server each decoding once, and then some.
const maxDecodes = 4

// checkSegment refuses a member that would stop being one path segment once
// decoded as a proxy or server in front of the origin may decode it: escaping
// sends "a/../b" as a%2F..%2Fb, which a proxy that decodes %2F turns into a
// traversal, carrying the configured headers (an API key) to another path.
// Every decoded form (the member itself, then each round of percent-decoding,
// an invalid escape left as it is) must hold no '/' or '\' (a path parameter
// is one segment: a member that needs slashes belongs in the query string),
// no control character, and must not be "." or ".." (also as "..;x", which
// servlet containers read as ".."). The same holds of each form's Unicode
// compatibility normalization (NFKC), which some servers and frameworks apply
// after decoding: "．．" (U+FF0E) becomes "..", "ａ／ｂ" becomes "a/b". A
// decoded form must be valid UTF-8: an overlong encoding such as %C0%AE is a
// '.' to a lenient decoder. The member cannot be empty (the warmer refuses
// that), and so neither can its one segment.
func checkSegment(m string) error {
	for range maxDecodes + 1 {
		if !utf8.ValidString(m) {
			return ErrInvalidUTF8
		}
		for _, form := range []string{m, norm.NFKC.String(m)} {
			if strings.ContainsAny(form, `/\`) {
				return ErrPathSeparator
			}
			if isDot(form) {
				return ErrDotSegment
			}
		}
		for _, r := range m {
			if r < 0x20 || r == 0x7f {
				return ErrControlChar
			}
		}
		d := lenientUnescape(m)
		if d == m {
			return nil
		}
		m = d
	}
	return fmt.Errorf("%w: still percent-encoded after %d decodings", ErrPathSeparator, maxDecodes)
}

// isDot reports whether a segment is "." or "..", with any ";params" removed.
func isDot(seg string) bool {
	seg, _, _ = strings.Cut(seg, ";")
	return seg == "." || seg == ".."
}

// lenientUnescape decodes every valid %XX of s and keeps the rest as it is,
// as a forgiving proxy would (url.PathUnescape gives up on the whole string
// at the first invalid escape).
func lenientUnescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

func (s *Source) do(ctx context.Context, target string, cond *condEntry) (*nethttp.Response, error) {
	req, err := nethttp.NewRequestWithContext(ctx, nethttp.MethodGet, target, nil)
	if err != nil {
		return nil, redact.URLError(err, target)
	}
	for k, v := range s.cfg.Headers {
		req.Header.Set(k, v)
	}
	cond.set(req)
	resp, err := s.client.Do(req)
	if err != nil {
		// url.Error quotes the URL, which may carry the base_url's query token:
		// drop it, and mask the token wherever else it could appear.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, redact.URLError(err, s.cfg.BaseURL)
	}
	return resp, nil
}

func (s *Source) fetch(ctx context.Context, spec *warmer.Spec, member string) warmer.Result {
	r := warmer.Result{Member: member}
	target, err := s.URL(spec, member)
	if err != nil {
		r.Err = err
		return r
	}
	ck := condKey(spec.Name, nethttp.MethodGet, target, spec.JSONPointer)
	var cond *condEntry
	if e, ok := s.cond.get(ck); ok {
		cond = &e
	}
	resp, err := s.do(ctx, target, cond)
	if err != nil {
		r.Err = fmt.Errorf("%w: %w", warmer.ErrOrigin, err)
		return r
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == nethttp.StatusNotModified && cond != nil:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		s.notModified.Inc()
		r.Value = cond.value
		return r
	case resp.StatusCode == nethttp.StatusNotFound || resp.StatusCode == nethttp.StatusGone:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		s.cond.forget(ck)
		r.Missing = true
		return r
	case resp.StatusCode >= 500 || resp.StatusCode == nethttp.StatusTooManyRequests:
		// Worth retrying, and counted by the circuit breaker.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		r.Err = fmt.Errorf("%w: %w: HTTP %d", warmer.ErrOrigin, warmer.ErrUnavailable, resp.StatusCode)
		return r
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		r.Err = fmt.Errorf("%w: HTTP %d", warmer.ErrOrigin, resp.StatusCode)
		return r
	}
	// Without a pointer the body is the value: it is read only up to
	// max_value_bytes when that is the smaller bound, since a larger one would
	// be refused anyway. A Content-Length over the bound is refused unread.
	limit, what := s.cfg.MaxBodyBytes, "max_body_bytes"
	if spec.JSONPointer == "" && spec.MaxValueBytes > 0 && int64(spec.MaxValueBytes) < limit {
		limit, what = int64(spec.MaxValueBytes), "max_value_bytes"
	}
	if resp.ContentLength > limit {
		r.Err = fmt.Errorf("%w: body of %d bytes, %s is %d", warmer.ErrTooLarge, resp.ContentLength, what, limit)
		return r
	}
	// The body counts against the process's in-flight payload budget while it
	// is read and decoded: at its Content-Length, or at its bound without one,
	// at most the whole budget (a longer one then fails as over the budget).
	need := limit
	if resp.ContentLength >= 0 {
		need = resp.ContentLength
	} else if m := s.cfg.Budget.Max(); m > 0 && need > m {
		need, limit, what = m, m, "refresh.max_inflight_bytes"
	}
	release, err := s.cfg.Budget.Acquire(ctx, s.cfg.Name, need)
	if err != nil {
		r.Err = fmt.Errorf("body of %d bytes: %w", need, err)
		return r
	}
	defer release()
	body := &boundedReader{r: resp.Body, left: limit}
	if spec.JSONPointer == "" {
		v, err := io.ReadAll(body)
		switch {
		case body.over:
			r.Err = fmt.Errorf("%w: body over %s %d", warmer.ErrTooLarge, what, limit)
		case err != nil:
			r.Err = fmt.Errorf("%w: read body: %w", warmer.ErrOrigin, err)
		default:
			r.Value = v
			s.cond.remember(ck, resp.Header, v)
		}
		return r
	}
	// Streamed: only the pointed value is ever held, never the whole body.
	v, err := PointerReader(body, spec.JSONPointer)
	switch {
	case body.over:
		r.Err = fmt.Errorf("%w: body over %s %d", warmer.ErrTooLarge, what, limit)
	case body.err != nil:
		r.Err = fmt.Errorf("%w: read body: %w", warmer.ErrOrigin, body.err)
	case err != nil:
		r.Err = fmt.Errorf("keys[%s].json_pointer %q: %w", spec.Name, spec.JSONPointer, err)
	case spec.MaxValueBytes > 0 && len(v) > spec.MaxValueBytes:
		// Refused here, not after the whole batch: the batch would hold it.
		r.Err = fmt.Errorf("%w: pointed value of %d bytes, max_value_bytes is %d", warmer.ErrTooLarge, len(v), spec.MaxValueBytes)
	default:
		r.Value = v
		s.cond.remember(ck, resp.Header, v)
	}
	return r
}

// errBodyTooLarge stops a read past the body bound.
var errBodyTooLarge = errors.New("body too large")

// boundedReader reads at most left bytes, then fails with errBodyTooLarge (over
// is set) if the body has more. err keeps the underlying read error, so that a
// cut connection is not reported as a JSON syntax error.
type boundedReader struct {
	r    io.Reader
	left int64
	over bool
	err  error
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One more byte tells a body of exactly the bound from a longer one.
		var one [1]byte
		n, err := b.r.Read(one[:])
		if n > 0 {
			b.over = true
			return 0, errBodyTooLarge
		}
		if err != nil && err != io.EOF {
			b.err = err
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// PointerReader resolves an RFC 6901 JSON pointer in the JSON document r, read
// as a token stream: members and elements off the path are skipped token by
// token, and only the pointed value is held in memory. The rest of the document
// is still read and checked, so a body that is not one valid JSON value is
// refused as before. A string is returned without its quotes; any other value
// as compact JSON, its members in their original order. A JSON null is
// ErrNullValue; a pointer that leads nowhere, a body that is not JSON (or has
// duplicate names, invalid UTF-8, data after the value) is ErrBadPayload.
func PointerReader(r io.Reader, ptr string) ([]byte, error) {
	var toks []string
	if ptr != "" {
		if !strings.HasPrefix(ptr, "/") {
			return nil, fmt.Errorf("%w: pointer must start with '/'", warmer.ErrBadPayload)
		}
		for _, tok := range strings.Split(ptr[1:], "/") {
			toks = append(toks, strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~"))
		}
	}
	dec := jsontext.NewDecoder(r)
	notJSON := func(err error) error {
		return fmt.Errorf("%w: body is not JSON: %w", warmer.ErrBadPayload, err)
	}
	for _, tok := range toks {
		switch dec.PeekKind() {
		case '{':
			if _, err := dec.ReadToken(); err != nil {
				return nil, notJSON(err)
			}
			for {
				if dec.PeekKind() == '}' {
					return nil, fmt.Errorf("%w: no member %q", warmer.ErrBadPayload, tok)
				}
				name, err := dec.ReadToken()
				if err != nil {
					return nil, notJSON(err)
				}
				if name.String() == tok {
					break
				}
				if err := dec.SkipValue(); err != nil {
					return nil, notJSON(err)
				}
			}
		case '[':
			if _, err := dec.ReadToken(); err != nil {
				return nil, notJSON(err)
			}
			idx, err := strconv.Atoi(tok)
			if err != nil || idx < 0 || (len(tok) > 1 && tok[0] == '0') || tok[0] == '+' {
				return nil, fmt.Errorf("%w: no index %q", warmer.ErrBadPayload, tok)
			}
			for i := 0; i < idx; i++ {
				if dec.PeekKind() == ']' {
					return nil, fmt.Errorf("%w: no index %q", warmer.ErrBadPayload, tok)
				}
				if err := dec.SkipValue(); err != nil {
					return nil, notJSON(err)
				}
			}
			if dec.PeekKind() == ']' {
				return nil, fmt.Errorf("%w: no index %q", warmer.ErrBadPayload, tok)
			}
		case 0:
			_, err := dec.ReadToken()
			return nil, notJSON(err)
		default:
			return nil, fmt.Errorf("%w: cannot descend into a scalar at %q", warmer.ErrBadPayload, tok)
		}
	}
	if dec.PeekKind() == 0 {
		_, err := dec.ReadToken()
		return nil, notJSON(err)
	}
	raw, err := dec.ReadValue()
	if err != nil {
		return nil, notJSON(err)
	}
	kind := raw.Kind()
	var out []byte
	switch kind {
	case 'n':
	case '"':
		if out, err = jsontext.AppendUnquote(nil, raw); err != nil {
			return nil, notJSON(err)
		}
	default:
		// ReadValue's bytes are the decoder's buffer: copy before reading on.
		v := raw.Clone()
		if err := v.Compact(); err != nil {
			return nil, notJSON(err)
		}
		out = v
	}
	// The rest of the document, token by token: it must be valid JSON too.
	for dec.StackDepth() > 0 {
		if _, err := dec.ReadToken(); err != nil {
			return nil, notJSON(err)
		}
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		if err == nil {
			return nil, fmt.Errorf("%w: body has data after the JSON value", warmer.ErrBadPayload)
		}
		return nil, notJSON(err)
	}
	if kind == 'n' {
		return nil, fmt.Errorf("%w: pointer selects null", warmer.ErrNullValue)
	}
	return out, nil
}
