package config

import (
	"fmt"
	"maps"
	"net"
	"net/textproto"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/net/http/httpguts"

	"github.com/hearth-dev/hearth/internal/redact"
	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/warmer"
)

// Problem is one thing wrong with a config: the field path and what is wrong,
// and the line of the file when it is known.
type Problem struct {
	Line int
	Path string
	Msg  string
}

func (p Problem) String() string {
	if p.Path == "" {
		return p.Msg
	}
	return p.Path + ": " + p.Msg
}

// Error lists every problem found in one config file.
type Error struct {
	File     string
	Problems []Problem
}

func (e *Error) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		if e.File != "" {
			b.WriteString(e.File)
			if p.Line > 0 {
				fmt.Fprintf(&b, ":%d", p.Line)
			}
			b.WriteString(": ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

var nameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// itemPath names item i of a list by its name when that is valid
// (keys[product]), else by its index (keys[3]): every message does.
func itemPath(list string, i int, name string) string {
	if nameRe.MatchString(name) {
		return fmt.Sprintf("%s[%s]", list, name)
	}
	return fmt.Sprintf("%s[%d]", list, i)
}

type checker struct {
	problems []Problem
	// flagged are the fields checkNumbers found non-finite or too long: their
	// own range checks, which would repeat the problem, are not reported.
	flagged map[string]bool
}

func (c *checker) add(path, format string, args ...any) {
	if c.flagged[path] {
		return
	}
	c.problems = append(c.problems, Problem{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// flag reports a problem on path and silences the other checks of that field.
func (c *checker) flag(path, format string, args ...any) {
	c.add(path, format, args...)
	if c.flagged == nil {
		c.flagged = map[string]bool{}
	}
	c.flagged[path] = true
}

// Validate checks the whole config and returns an *Error listing every problem.
func (cfg *Config) Validate() error {
	c := &checker{}
	cfg.checkNumbers(c)
	cfg.validateRedis(c)
	if _, _, err := net.SplitHostPort(cfg.HTTP.Listen); err != nil {
		c.add("http.listen", "must be host:port (got %q)", cfg.HTTP.Listen)
	}
	if cfg.HTTP.ProbeListen != "" {
		if _, _, err := net.SplitHostPort(cfg.HTTP.ProbeListen); err != nil {
			c.add("http.probe_listen", "must be host:port (got %q)", cfg.HTTP.ProbeListen)
		} else if cfg.HTTP.ProbeListen == cfg.HTTP.Listen {
			c.add("http.probe_listen", "must differ from http.listen (both %q)", cfg.HTTP.Listen)
		}
	}
	switch cfg.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		c.add("log.level", "must be debug, info, warn or error (got %q)", cfg.Log.Level)
	}
	switch cfg.Log.Format {
	case "auto", "json", "console":
	default:
		c.add("log.format", "must be auto, json or console (got %q)", cfg.Log.Format)
	}
	types := cfg.validateSources(c)
	perKey := cfg.validateKeys(c, types)
	cfg.validateRates(c, perKey)
	lease := cfg.leaseTiming(perKey)
	cfg.validateLeader(c, lease)
	cfg.validatePrewarm(c, types)
	cfg.specs, cfg.lease = nil, LeaseTiming{}
	if len(c.problems) > 0 {
		return &Error{File: cfg.File, Problems: c.problems}
	}
	cfg.specs, cfg.lease = perKey, lease
	return nil
}

func (cfg *Config) validateRedis(c *checker) {
	r := cfg.Redis
	if len(r.Addrs) == 0 {
		c.add("redis.addrs", "must list at least one address")
	}
	for i, a := range r.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			c.add(fmt.Sprintf("redis.addrs[%d]", i), "must be host:port (got %q)", redactAddr(a))
		}
	}
	if r.DB != 0 && len(r.Addrs) > 1 && r.MasterName == "" {
		c.add("redis.db", "a cluster has only database 0 (got %d)", r.DB)
	}
	if !nameRe.MatchString(r.Namespace) {
		c.add("redis.namespace", "must be 1-64 letters, digits, '_', '.' or '-' (got %q)", r.Namespace)
	}
}

func (cfg *Config) validateSources(c *checker) map[string]string {
	types := map[string]string{}
	for i, s := range cfg.Sources {
		path := itemPath("sources", i, s.Name)
		if !nameRe.MatchString(s.Name) {
			c.add(path+".name", "must be 1-64 letters, digits, '_', '.' or '-' (got %q)", s.Name)
		}
		if _, dup := types[s.Name]; dup {
			c.add(path+".name", "duplicate source name %q", s.Name)
		}
		types[s.Name] = s.Type
		s.Protection.validate(c, path)
		switch s.Type {
		case "postgres":
			if s.DSN == "" {
				c.add(path+".dsn", "is required for a postgres source")
			} else if _, err := pgconn.ParseConfig(s.DSN); err != nil {
				c.add(path+".dsn", "cannot be parsed (value withheld: it may hold a password)")
			}
			for _, f := range setFields(field{"base_url", s.BaseURL != ""}, field{"headers", len(s.Headers) > 0}, field{"timeout", s.Timeout != 0}, field{"health_path", s.HealthPath != ""}, field{"redirects", s.Redirects != ""}) {
				c.add(path+"."+f, "is not valid for a postgres source")
			}
		case "http":
			u, err := url.Parse(s.BaseURL)
			if s.BaseURL == "" {
				c.add(path+".base_url", "is required for an http source")
			} else if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				c.add(path+".base_url", "must be an absolute http(s) URL (got %q)", redact.URL(s.BaseURL))
			}
			if s.Timeout == 0 {
				c.add(path+".timeout", "is required for an http source, e.g. 5s")
			}
			switch s.Redirects {
			case "", "same-host", "none", "any":
			default:
				c.add(path+".redirects", "must be same-host, none or any (got %q)", s.Redirects)
			}
			checkHeaders(c, path+".headers", s.Headers)
			if s.HealthPath != "" && !strings.HasPrefix(s.HealthPath, "/") {
				c.add(path+".health_path", "must start with '/' (got %q)", s.HealthPath)
			}
			for _, f := range setFields(field{"dsn", s.DSN != ""}, field{"max_conns", s.MaxConns != 0}, field{"statement_timeout", s.StatementTimeout != 0}) {
				c.add(path+"."+f, "is not valid for an http source")
			}
		default:
			c.add(path+".type", "must be postgres or http (got %q)", s.Type)
		}
	}
	return types
}

// redactAddr masks what may be a password in an address that is not
// host:port: a Redis URL pasted where an address belongs
// (redis://:PASSWORD@host:6379), or user:PASSWORD@host:6379, which no URL
// parser reads as userinfo. Everything before the last '@' goes, the scheme
// excepted, and the rest is masked as a URL.
func redactAddr(a string) string {
	scheme, rest := "", a
	if i := strings.Index(a, "://"); i >= 0 {
		scheme, rest = a[:i+3], a[i+3:]
	}
	user := ""
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		user, rest = "xxxxx@", rest[at+1:]
	}
	// As a URL's host and what follows, so that a query's values are masked
	// too; a bare host:port parses only with a scheme in front.
	return scheme + user + strings.TrimPrefix(redact.URL("x://"+rest), "x://")
}

// validateKeys checks every declaration and returns the specs it built, one
// per key, nil where a key has problems.
func (cfg *Config) validateKeys(c *checker, sourceTypes map[string]string) []*warmer.Spec {
	specs := make([]*warmer.Spec, len(cfg.Keys))
	if len(cfg.Keys) == 0 {
		c.add("keys", "must declare at least one key")
	}
	names := map[string]bool{}
	type declared struct {
		path string
		t    keytmpl.Template
	}
	var templates []declared
	for i, k := range cfg.Keys {
		path := itemPath("keys", i, k.Name)
		if !nameRe.MatchString(k.Name) {
			c.add(path+".name", "must be 1-64 letters, digits, '_', '.' or '-' (got %q)", k.Name)
		}
		if names[k.Name] {
			c.add(path+".name", "duplicate declaration name %q", k.Name)
		}
		names[k.Name] = true

		spec, problems := cfg.spec(k)
		for _, p := range problems {
			c.add(path+"."+p.Path, "%s", p.Msg)
		}
		if spec == nil {
			continue
		}
		if len(problems) == 0 {
			specs[i] = spec
		}
		for _, d := range templates {
			if d.t.Overlaps(spec.Template) {
				c.add(path+".key", "template %q overlaps %q of %s: a key could belong to both", spec.Template, d.t, d.path)
			}
		}
		templates = append(templates, declared{path, spec.Template})
		typ, ok := sourceTypes[k.Source]
		switch {
		case k.Source == "":
			c.add(path+".source", "is required")
		case !ok:
			c.add(path+".source", "names no configured source (got %q)", k.Source)
		default:
			checkLoad(c, path, typ, k, spec)
			checkFreshness(c, path, typ, k, spec)
		}
	}
	return specs
}

func checkLoad(c *checker, path, typ string, k Key, spec *warmer.Spec) {
	switch typ {
	case "postgres":
		if k.Query == "" {
			c.add(path+".query", "is required for a postgres source")
		} else if spec.Template.IsFamily() && !strings.Contains(k.Query, "$1") {
			c.add(path+".query", "must take the members as $1 (text[]), e.g. WHERE id = ANY($1)")
		} else if !spec.Template.IsFamily() && strings.Contains(k.Query, "$1") {
			c.add(path+".query", "a single key's query takes no parameter ($1 found)")
		}
		for _, f := range setFields(field{"path", k.Path != ""}, field{"json_pointer", k.JSONPointer != ""}) {
			c.add(path+"."+f, "is not valid with a postgres source")
		}
	case "http":
		if k.Path == "" {
			c.add(path+".path", "is required for an http source")
		} else {
			checkPath(c, path, k.Path, spec.Template)
		}
		if k.JSONPointer != "" && !strings.HasPrefix(k.JSONPointer, "/") {
			c.add(path+".json_pointer", "must start with '/' (got %q)", k.JSONPointer)
		}
		if k.Query != "" {
			c.add(path+".query", "is not valid with an http source")
		}
		if k.MembersQuery != "" {
			c.add(path+".members_query", "needs a postgres source; list the members instead")
		}
	}
}

var pathParam = regexp.MustCompile(`\{([^{}]*)\}`)

func checkPath(c *checker, path, p string, t keytmpl.Template) {
	if !strings.HasPrefix(p, "/") {
		c.add(path+".path", "must start with '/' (got %q)", p)
		return
	}
	for _, r := range p {
		if r <= ' ' || r == 0x7f {
			c.add(path+".path", "must not contain whitespace or control characters")
			return
		}
	}
	found := false
	for _, m := range pathParam.FindAllStringSubmatch(p, -1) {
		if m[1] != t.Param() || t.Param() == "" {
			c.add(path+".path", "uses {%s}, which the key template %q does not define", m[1], t)
			return
		}
		found = true
	}
	if t.IsFamily() && !found {
		c.add(path+".path", "must use {%s} so each member gets its own URL", t.Param())
	}
}

// spec turns one key declaration into a warmer.Spec, with field-relative problems.
func (cfg *Config) spec(k Key) (*warmer.Spec, []Problem) {
	var ps []Problem
	add := func(field, format string, args ...any) {
		ps = append(ps, Problem{Path: field, Msg: fmt.Sprintf(format, args...)})
	}
	r := cfg.Refresh
	t, err := keytmpl.Parse(k.Key)
	if err != nil {
		add("key", "%v", err)
		return nil, ps
	}
	t, err = t.WithMemberRules(k.ParamPattern, min(max(k.MaxParamLen, 0), 1024))
	if err != nil {
		add("param_pattern", "%v", err)
	}
	if ns := cfg.Redis.Namespace; nameRe.MatchString(ns) {
		t = t.WithNamespace(ns)
		switch {
		case !t.CanName(ns):
		case t.IsFamily():
			add("key", "template %q can name a key inside Hearth's own namespace (%s or %s:…, redis.namespace): use another prefix or namespace", t, ns, ns)
		default:
			add("key", "key %q is inside Hearth's own namespace (%s or %s:…, redis.namespace): use another key or namespace", t, ns, ns)
		}
	}
	s := &warmer.Spec{
		Name: k.Name, Template: t, Source: k.Source,
		TTL: k.TTL, Jitter: r.Jitter, Interval: k.Interval, LoadTimeout: r.LoadTimeout,
		Members: k.Members, MembersQuery: k.MembersQuery, MaxMembers: r.MaxMembers, BatchSize: r.BatchSize,
		Query: k.Query, Path: k.Path, JSONPointer: k.JSONPointer,
		NegativeTTL: r.NegativeTTL, MaxStale: r.MaxStale, MaxValueBytes: r.MaxValueBytes,
	}
	if k.Jitter != nil {
		s.Jitter = *k.Jitter
	}
	if k.LoadTimeout != 0 {
		s.LoadTimeout = k.LoadTimeout
	}
	if k.MaxMembers != 0 {
		s.MaxMembers = k.MaxMembers
	}
	if k.BatchSize != 0 {
		s.BatchSize = k.BatchSize
	}
	if k.NegativeTTL != 0 {
		s.NegativeTTL = k.NegativeTTL
	} else if k.TTL > 0 {
		// The inherited default never outlives the key's own TTL.
		s.NegativeTTL = min(s.NegativeTTL, k.TTL)
	}
	if k.NegativeValue != nil {
		s.NegativeValue = []byte(*k.NegativeValue)
	} else {
		s.NegativeValue = []byte{}
	}
	if k.MaxStale != nil {
		s.MaxStale = *k.MaxStale
	}
	if k.MaxValueBytes != 0 {
		s.MaxValueBytes = k.MaxValueBytes
	}

	if k.TTL > 0 {
		half := k.TTL / 2
		switch {
		case k.Interval == 0:
			s.Interval = half
		case k.Interval > half:
			add("interval", "must be at most ttl/2 = %s (got %s)", half, k.Interval)
		}
		if s.NegativeTTL > k.TTL {
			add("negative_ttl", "must be at most ttl %s (got %s)", k.TTL, s.NegativeTTL)
		}
	}
	if t.IsFamily() {
		switch {
		case len(k.Members) == 0 && k.MembersQuery == "" && k.MembersFrom == nil:
			add("members", "a family needs members, members_query or members_from")
		case len(k.Members) > 0 && k.MembersQuery != "":
			add("members", "set members or members_query, not both")
		}
		if len(k.Members) > s.MaxMembers {
			add("members", "lists %d members, more than max_members %d", len(k.Members), s.MaxMembers)
		}
		seen := map[string]bool{}
		for i, m := range k.Members {
			if err := t.ValidateMember(m); err != nil {
				add(fmt.Sprintf("members[%d]", i), "%v (got %q)", err, truncate(m))
			} else if seen[m] {
				add(fmt.Sprintf("members[%d]", i), "duplicate member %q", m)
			}
			seen[m] = true
		}
	} else {
		for _, f := range setFields(field{"members", len(k.Members) > 0}, field{"members_query", k.MembersQuery != ""}, field{"param_pattern", k.ParamPattern != ""}, field{"members_from", k.MembersFrom != nil}) {
			add(f, "is only valid for a family (a key with a {parameter})")
		}
	}
	if t.IsFamily() && k.MembersFrom != nil {
		s.HotSet = cfg.hotSet(k.MembersFrom, s, add)
	}
	if timeable(s, r.Spread) {
		if p, bad := checkTiming(refreshTiming(s, k, r.Spread, cfg.sourceRate(k.Source)), k.TTL, s.Jitter); bad {
			ps = append(ps, p)
		}
	}
	return s, ps
}

// timeable reports whether the figures the timing rule reads are each in
// bounds (else they have their own problems, and the rule is not run).
func timeable(s *warmer.Spec, spread float64) bool {
	return s.Interval >= MinInterval && s.TTL >= 100*time.Millisecond && s.TTL <= MaxDuration &&
		s.LoadTimeout >= MinTimeout && s.LoadTimeout <= MaxDuration && !badJitter(s.Jitter) && !badJitter(spread)
}

// badJitter reports a fraction the bounds table refuses (its own problem).
func badJitter(x float64) bool { return !(x >= 0 && x < 1) }

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// Specs returns the declarations the last Validate built, in config order:
// built once, never rebuilt. A config that has not passed Validate has none.
func (cfg *Config) Specs() []*warmer.Spec {
	return slices.Clone(cfg.specs)
}

type field struct {
	name string
	set  bool
}

// setFields returns, in order, the names of the fields that are set.
func setFields(fs ...field) []string {
	var out []string
	for _, f := range fs {
		if f.set {
			out = append(out, f.name)
		}
	}
	return out
}

// checkHeaders rejects, before any request is made, a header the HTTP client
// would refuse on every call (a name that is not an RFC 9110 token, a value
// with a control character), or one that frames the request or that Hearth
// sets itself (reservedHeader). Values are withheld: headers carry API keys.
func checkHeaders(c *checker, path string, headers map[string]string) {
	for _, name := range slices.Sorted(maps.Keys(headers)) {
		if !httpguts.ValidHeaderFieldName(name) {
			c.add(path, "%q is not a valid header name (letters, digits and !#$%%&'*+-.^_`|~ only)", truncate(name))
			continue
		}
		if why := reservedHeader(name); why != "" {
			c.add(path+"."+name, "header %s cannot be configured: %s", textproto.CanonicalMIMEHeaderKey(name), why)
			continue
		}
		if !httpguts.ValidHeaderFieldValue(headers[name]) {
			c.add(path+"."+name, "value must not contain CR, LF, NUL or other control characters (value withheld: it may hold a secret)")
		}
	}
}

// reservedHeader says why a header may not be configured, or "" if it may.
func reservedHeader(name string) string {
	canon := textproto.CanonicalMIMEHeaderKey(name)
	switch canon {
	case "Host":
		return "the host is the base_url's"
	case "Content-Length", "Transfer-Encoding", "Trailer", "Te", "Expect":
		return "it frames the request, which the HTTP client does"
	case "Connection", "Keep-Alive", "Upgrade", "Proxy-Connection":
		return "it is a hop-by-hop header of the connection"
	case "If-None-Match", "If-Modified-Since", "If-Match", "If-Unmodified-Since", "If-Range":
		return "Hearth sends the conditional headers itself"
	case "Range":
		return "a partial answer is not a value"
	}
	if strings.HasPrefix(canon, "Proxy-") {
		return "Proxy-* headers are for a proxy, not the origin"
	}
	return ""
}
