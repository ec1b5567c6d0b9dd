// Package keytmpl owns key templates: a declaration's key ("top-products:global")
// or family ("product:{id}"), the rules a member must pass before it becomes part
// of a key, and what config, the warmer, the pre-warm and the sources ask of a
// template (its key for a member, the member a key names, overlaps, Hearth's
// namespace).
package keytmpl

import (
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"strings"
	"unicode"
	"unicode/utf8"
)

// DefaultMaxMemberLen bounds a family member (a template parameter value) when the
// declaration sets no length of its own.
const DefaultMaxMemberLen = 128

// maxTemplateLen bounds a key template; Redis allows far longer keys, but a hot
// key's name is short, and a bound keeps hostile configs and log lines small.
const maxTemplateLen = 512

var paramName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// Template is a cache key name as declared: either a plain key ("top-products:global")
// or a family with exactly one parameter ("product:{id}").
type Template struct {
	raw     string
	prefix  string
	param   string
	suffix  string
	pattern *regexp.Regexp
	class   *memberClass // pattern as a table, when it is one ASCII class repeated
	maxLen  int
	// namespace, when set, is Hearth's own: Match refuses every key in it.
	namespace string
}

// Parse parses a key template. Literal parts may not contain braces,
// whitespace or control characters; a family has exactly one {param}.
func Parse(s string) (Template, error) {
	if s == "" {
		return Template{}, errors.New("must not be empty")
	}
	if len(s) > maxTemplateLen {
		return Template{}, fmt.Errorf("must be at most %d bytes (got %d)", maxTemplateLen, len(s))
	}
	if !utf8.ValidString(s) {
		return Template{}, errors.New("must be valid UTF-8")
	}
	open := strings.IndexByte(s, '{')
	if open < 0 {
		if strings.IndexByte(s, '}') >= 0 {
			return Template{}, fmt.Errorf("unbalanced '}' in %q", s)
		}
		if err := checkLiteral(s); err != nil {
			return Template{}, err
		}
		return Template{raw: s, prefix: s, maxLen: DefaultMaxMemberLen}, nil
	}
	closing := strings.IndexByte(s[open:], '}')
	if closing < 0 {
		return Template{}, fmt.Errorf("unclosed '{' in %q", s)
	}
	closing += open
	prefix, param, suffix := s[:open], s[open+1:closing], s[closing+1:]
	if !paramName.MatchString(param) {
		return Template{}, fmt.Errorf("parameter %q must be a name of letters, digits and '_' (at most 64)", param)
	}
	if strings.ContainsAny(suffix, "{}") || strings.IndexByte(prefix, '}') >= 0 {
		return Template{}, fmt.Errorf("at most one {parameter} is allowed in %q", s)
	}
	for _, lit := range []string{prefix, suffix} {
		if err := checkLiteral(lit); err != nil {
			return Template{}, err
		}
	}
	if prefix == "" && suffix == "" {
		return Template{}, fmt.Errorf("%q has no fixed part: it would match every key", s)
	}
	return Template{raw: s, prefix: prefix, param: param, suffix: suffix, maxLen: DefaultMaxMemberLen}, nil
}

func checkLiteral(s string) error {
	for _, r := range s {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return fmt.Errorf("must not contain whitespace or control characters (found %q)", r)
		}
	}
	return nil
}

// WithMemberRules returns the template with its member validation set: pattern
// (optional, matched against the whole member) and the maximum member length.
func (t Template) WithMemberRules(pattern string, maxLen int) (Template, error) {
	if maxLen > 0 {
		t.maxLen = maxLen
	}
	if pattern != "" {
		re, err := regexp.Compile(`^(?:` + pattern + `)$`)
		if err != nil {
			return t, fmt.Errorf("invalid pattern %q: %w", pattern, err)
		}
		t.pattern, t.class = re, compileMemberClass(re.String())
	}
	return t, nil
}

// Same reports whether t and o name and accept the same keys: the same
// template, member length bound and pattern (the namespace is not compared).
func (t Template) Same(o Template) bool {
	return t.raw == o.raw && t.maxLen == o.maxLen && patternOf(t) == patternOf(o)
}

func patternOf(t Template) string {
	if t.pattern == nil {
		return ""
	}
	return t.pattern.String()
}

// String returns the template as declared.
func (t Template) String() string { return t.raw }

// IsFamily reports whether the template has a parameter.
func (t Template) IsFamily() bool { return t.param != "" }

// Param returns the parameter's name, or "" for a single key.
func (t Template) Param() string { return t.param }

// Key returns the cache key for a member; for a single key it returns the key.
// The member must have passed ValidateMember.
func (t Template) Key(member string) string {
	if !t.IsFamily() {
		return t.raw
	}
	return t.prefix + member + t.suffix
}

// Match returns the member a cache key names, if the key belongs to this template
// and its member is valid.
func (t Template) Match(key string) (string, bool) {
	if !t.IsFamily() {
		return "", key == t.raw
	}
	if len(key) <= len(t.prefix)+len(t.suffix) ||
		!strings.HasPrefix(key, t.prefix) || !strings.HasSuffix(key, t.suffix) {
		return "", false
	}
	member := key[len(t.prefix) : len(key)-len(t.suffix)]
	if t.ValidateMember(member) != nil || t.namespace != "" && InNamespace(key, t.namespace) {
		return "", false
	}
	return member, true
}

// Member validation failures.
var (
	ErrMemberEmpty   = errors.New("member is empty")
	ErrMemberTooLong = errors.New("member is too long")
	ErrMemberChars   = errors.New("member has braces, whitespace, control characters or invalid UTF-8")
	ErrMemberPattern = errors.New("member does not match the declared pattern")
)

// ValidateMember checks a family member before it becomes part of a key, a SQL
// parameter or a URL: by default no braces, whitespace or control characters and a
// bounded length; a declared pattern must also match.
func (t Template) ValidateMember(m string) error {
	switch {
	case m == "":
		return ErrMemberEmpty
	case len(m) > t.maxLen:
		return fmt.Errorf("%w (%d bytes, at most %d)", ErrMemberTooLong, len(m), t.maxLen)
	case !cleanMember(m):
		return ErrMemberChars
	}
	if t.class != nil {
		if !t.class.match(m) {
			return ErrMemberPattern
		}
	} else if t.pattern != nil && !t.pattern.MatchString(m) {
		return ErrMemberPattern
	}
	return nil
}

// badASCII is which ASCII bytes a member may not hold: braces, whitespace and
// control characters.
var badASCII = func() (bad [utf8.RuneSelf]bool) {
	for r := range rune(utf8.RuneSelf) {
		bad[r] = !memberRune(r)
	}
	return bad
}()

// memberRune reports whether a member may hold r.
func memberRune(r rune) bool {
	return r != '{' && r != '}' && !unicode.IsSpace(r) && !unicode.IsControl(r)
}

// cleanMember reports whether m is valid UTF-8 without braces, whitespace or
// control characters; an ASCII member is checked a byte at a time by table.
func cleanMember(m string) bool {
	for i := 0; i < len(m); i++ {
		b := m[i]
		if b >= utf8.RuneSelf {
			return cleanRunes(m[i:])
		}
		if badASCII[b] {
			return false
		}
	}
	return true
}

func cleanRunes(m string) bool {
	if !utf8.ValidString(m) {
		return false
	}
	for _, r := range m {
		if !memberRune(r) {
			return false
		}
	}
	return true
}

// Overlaps reports whether some key could belong to both templates, in which case
// two declarations would fight over it.
func (t Template) Overlaps(o Template) bool {
	switch {
	case !t.IsFamily() && !o.IsFamily():
		return t.raw == o.raw
	case !t.IsFamily():
		return o.CouldMatch(t.raw)
	case !o.IsFamily():
		return t.CouldMatch(o.raw)
	}
	// Two families share a key exactly when one prefix extends the other and one
	// suffix extends the other: the key longer prefix + "x" + longer suffix is in both.
	return (strings.HasPrefix(t.prefix, o.prefix) || strings.HasPrefix(o.prefix, t.prefix)) &&
		(strings.HasSuffix(t.suffix, o.suffix) || strings.HasSuffix(o.suffix, t.suffix))
}

// CouldMatch reports whether key has the family's prefix and suffix around a
// non-empty member; it ignores member rules: overlap is judged on names alone.
func (t Template) CouldMatch(key string) bool {
	return len(key) > len(t.prefix)+len(t.suffix) &&
		strings.HasPrefix(key, t.prefix) && strings.HasSuffix(key, t.suffix)
}

// Literals returns the literal parts around a family's parameter.
func (t Template) Literals() (prefix, suffix string) { return t.prefix, t.suffix }

// Namespace is Hearth's namespace set by WithNamespace, "" when none is.
func (t Template) Namespace() string { return t.namespace }

// InNamespace reports whether key is one of Hearth's own under namespace ns:
// ns itself or ns followed by ':' (<ns>:fence, <ns>:{lease}, <ns>:warm,
// <ns>:access:<bucket>, ...). No declaration may write such a key.
func InNamespace(key, ns string) bool {
	return strings.HasPrefix(key, ns) && (len(key) == len(ns) || key[len(ns)] == ':')
}

// WithNamespace returns the template with Hearth's namespace set: from then on
// Match refuses a key inside it, whatever the template (defence in depth
// behind CanName, for keys read from the access log).
func (t Template) WithNamespace(ns string) Template {
	t.namespace = ns
	return t
}

// CanName reports whether some key of the template, with a member its rules
// accept, is inside namespace ns (see InNamespace). Member rules count: h{id}
// can name hearth:warm, but not with param_pattern [0-9]+.
func (t Template) CanName(ns string) bool {
	if !t.IsFamily() {
		return InNamespace(t.raw, ns)
	}
	p, s := t.prefix, t.suffix
	// The key ns itself: the member is what lies between prefix and suffix.
	if len(p)+len(s) < len(ns) && strings.HasPrefix(ns, p) && strings.HasSuffix(ns, s) &&
		t.ValidateMember(ns[len(p):len(ns)-len(s)]) == nil {
		return true
	}
	// A key starting with ns + ":".
	n := ns + ":"
	switch {
	case strings.HasPrefix(p, n):
		return true
	case !strings.HasPrefix(n, p):
		return false
	}
	rest := n[len(p):]
	// The member is a proper beginning of rest and the suffix completes it ...
	for j := 1; j < len(rest); j++ {
		if strings.HasPrefix(s, rest[j:]) && t.ValidateMember(rest[:j]) == nil {
			return true
		}
	}
	// ... or the member itself starts with rest.
	if len(rest) > t.maxLen {
		return false
	}
	return t.pattern == nil || canStartWith(t.pattern.String(), rest)
}

// canStartWith reports whether the regular expression could match a string
// starting with prefix: it runs the compiled program on prefix and sees if any
// thread is still alive. It errs towards true (an empty-width assertion is
// taken as satisfied), which only makes CanName stricter.
func canStartWith(expr, prefix string) bool {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return true
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return true
	}
	cur := closure(prog, []uint32{uint32(prog.Start)})
	for _, r := range prefix {
		var next []uint32
		for _, pc := range cur {
			switch in := &prog.Inst[pc]; in.Op {
			case syntax.InstRune, syntax.InstRune1, syntax.InstRuneAny, syntax.InstRuneAnyNotNL:
				if in.MatchRune(r) {
					next = append(next, in.Out)
				}
			}
		}
		if cur = closure(prog, next); len(cur) == 0 {
			return false
		}
	}
	return true
}

// closure follows the instructions that consume no input from pcs and
// returns the ones that do (or match).
func closure(prog *syntax.Prog, pcs []uint32) []uint32 {
	seen := map[uint32]bool{}
	var out []uint32
	for len(pcs) > 0 {
		pc := pcs[len(pcs)-1]
		pcs = pcs[:len(pcs)-1]
		if seen[pc] {
			continue
		}
		seen[pc] = true
		switch in := &prog.Inst[pc]; in.Op {
		case syntax.InstAlt, syntax.InstAltMatch:
			pcs = append(pcs, in.Out, in.Arg)
		case syntax.InstCapture, syntax.InstNop, syntax.InstEmptyWidth:
			pcs = append(pcs, in.Out)
		case syntax.InstRune, syntax.InstRune1, syntax.InstRuneAny, syntax.InstRuneAnyNotNL, syntax.InstMatch:
			out = append(out, pc)
		}
	}
	return out
}
