// Package redact keeps secrets out of anything Hearth prints: the password of a
// URL's userinfo (or its user name when it has no password: a token), every
// part of its query string (the value of an `?api_key=…` in a base_url, and a
// bare `?TOKEN` whole), and passwords quoted by a library's error message. Errors stay errors: the
// redacting wrapper unwraps, so errors.Is and errors.As see what it wraps.
package redact

import (
	"net/url"
	"strings"
)

// Mask replaces a secret.
const Mask = "xxxxx"

// minQueryValueLen is the shortest query value replaced wherever it appears in an
// error message. A shorter one ("v=1") is still masked inside every URL printed
// through URL, but replacing "1" everywhere would garble the message instead.
// Passwords are always replaced, whatever their length.
const minQueryValueLen = 4

// URL returns raw with its password and every query value masked, a query part
// without '=' masked whole, for logs, errors and validation messages. It never
// returns raw unparsed.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return urlString(u)
}

func urlString(u *url.URL) string {
	c := *u
	if _, has := c.User.Password(); has {
		c.User = url.UserPassword(c.User.Username(), Mask)
	} else if c.User != nil && c.User.Username() != "" {
		// https://TOKEN@host/: a user name alone is how some APIs take a token.
		c.User = url.User(Mask)
	}
	if c.RawQuery != "" {
		c.RawQuery = maskQuery(c.RawQuery)
	}
	c.Fragment, c.RawFragment = "", ""
	return c.String()
}

// maskQuery masks every value of a raw query, keeping names (they say which
// parameter it was) and the order. A part without '=' (`?TOKEN`) has no name
// to keep: it is masked whole. Empty parts (`a=1&&b=2`) stay empty.
func maskQuery(raw string) string {
	parts := strings.Split(raw, "&")
	for i, p := range parts {
		if name, _, ok := strings.Cut(p, "="); ok {
			parts[i] = name + "=" + Mask
		} else if p != "" {
			parts[i] = Mask
		}
	}
	return strings.Join(parts, "&")
}

// URLSecrets returns the secrets raw carries: its password (its user name when
// it has no password) and its query values and bare query parts (of at least
// 4 bytes), both as written and decoded. A URL that does not parse
// is split by hand, so that its password is still known.
func URLSecrets(raw string) []string {
	var (
		pass     string
		hasPass  bool
		rawQuery string
	)
	if u, err := url.Parse(raw); err == nil {
		pass, hasPass = u.User.Password()
		if !hasPass && u.User != nil && len(u.User.Username()) >= minQueryValueLen {
			pass, hasPass = u.User.Username(), true
		}
		rawQuery = u.RawQuery
	} else {
		rest := raw
		if _, after, ok := strings.Cut(rest, "://"); ok {
			rest = after
		}
		rest, rawQuery, _ = strings.Cut(rest, "?")
		rawQuery, _, _ = strings.Cut(rawQuery, "#")
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			var user string
			user, pass, hasPass = strings.Cut(rest[:at], ":")
			if !hasPass && len(user) >= minQueryValueLen {
				pass, hasPass = user, true
			}
		}
	}
	var out []string
	if hasPass && pass != "" {
		out = append(out, pass, url.QueryEscape(pass), url.PathEscape(pass))
	}
	for _, p := range strings.Split(rawQuery, "&") {
		_, v, ok := strings.Cut(p, "=")
		if !ok {
			v = p // a bare part is a secret whole
		}
		if len(v) < minQueryValueLen {
			continue
		}
		out = append(out, v)
		if d, err := url.QueryUnescape(v); err == nil && d != v {
			out = append(out, d)
		}
	}
	return out
}

// Error is an error whose message has its secrets replaced. Unwrap returns the
// original, so errors.Is and errors.As keep working; only the message changes.
type Error struct {
	err error
	// urls are replaced by their redacted form first, then secrets by Mask.
	urls    []string
	secrets []string
	// withheld, when set, is the whole message: the original cannot be made safe.
	withheld string
}

// Error returns the wrapped message with every secret masked.
func (e *Error) Error() string {
	if e.withheld != "" {
		return e.withheld
	}
	return Text(e.err.Error(), e.urls, e.secrets)
}

// Unwrap returns the original error.
func (e *Error) Unwrap() error { return e.err }

// Text masks urls (each replaced by URL of it) and then secrets in s.
func Text(s string, urls, secrets []string) string {
	for _, u := range urls {
		if u != "" {
			s = strings.ReplaceAll(s, u, URL(u))
		}
	}
	for _, sec := range secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, Mask)
		}
	}
	return s
}

// Secrets wraps err so that its message never shows any of secrets (nil stays nil).
func Secrets(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	return &Error{err: err, secrets: secrets}
}

// URLError wraps err so that its message never shows rawURL's password or query
// values, whether it quotes the whole URL or only a part of it (nil stays nil).
func URLError(err error, rawURL string) error {
	if err == nil {
		return nil
	}
	return &Error{err: err, urls: []string{rawURL}, secrets: URLSecrets(rawURL)}
}

// Withheld wraps err with msg as its whole message, for an error that cannot be
// made safe (a parse error quoting a connection string that did not parse); err
// stays reachable through Unwrap (nil stays nil).
func Withheld(err error, msg string) error {
	if err == nil {
		return nil
	}
	return &Error{err: err, withheld: msg}
}
