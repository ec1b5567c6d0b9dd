package keytmpl_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/hearth-dev/hearth/keytmpl"
)

func TestParse(t *testing.T) {
	good := []struct {
		in, param, key string
	}{
		{"top-products:global", "", "top-products:global"},
		{"product:{id}", "id", "product:42"},
		{"{id}:profile", "id", "42:profile"},
		{"price:{sku}:eur", "sku", "price:42:eur"},
	}
	for _, c := range good {
		t.Run(c.in, func(t *testing.T) {
			tp, err := keytmpl.Parse(c.in)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := tp.Param(), c.param; got != want {
				t.Errorf("param = %q, want %q", got, want)
			}
			if got, want := tp.Key("42"), c.key; got != want {
				t.Errorf("Key(42) = %q, want %q", got, want)
			}
			m, ok := tp.Match(c.key)
			if !ok || (tp.IsFamily() && m != "42") {
				t.Errorf("Match(%q) = %q, %v", c.key, m, ok)
			}
		})
	}
	bad := map[string]string{
		"":                       "must not be empty",
		"a b":                    "whitespace",
		"a:{id":                  "unclosed",
		"a:}":                    "unbalanced",
		"a:{id}:{x}":             "at most one",
		"a:{}":                   "parameter",
		"a:{1d}":                 "parameter",
		"{id}":                   "no fixed part",
		"a:{id}\x00":             "control",
		strings.Repeat("k", 600): "at most 512",
	}
	for in, want := range bad {
		t.Run("bad", func(t *testing.T) {
			_, err := keytmpl.Parse(in)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Parse(%q) = %v, want error containing %q", in, err, want)
			}
		})
	}
}

func TestValidateMember(t *testing.T) {
	tp, err := keytmpl.Parse("user:{id}")
	if err != nil {
		t.Fatal(err)
	}
	for m, want := range map[string]error{
		"42":                     nil,
		"é-ß_~.":                 nil,
		"":                       keytmpl.ErrMemberEmpty,
		"a b":                    keytmpl.ErrMemberChars,
		"a\nb":                   keytmpl.ErrMemberChars,
		"{x}":                    keytmpl.ErrMemberChars,
		"\xff":                   keytmpl.ErrMemberChars,
		strings.Repeat("9", 129): keytmpl.ErrMemberTooLong,
	} {
		if got := tp.ValidateMember(m); !errors.Is(got, want) && !(got == nil && want == nil) {
			t.Errorf("ValidateMember(%q) = %v, want %v", m, got, want)
		}
	}
	strict, err := tp.WithMemberRules("[0-9]{1,6}", 0)
	if err != nil {
		t.Fatal(err)
	}
	for m, ok := range map[string]bool{"123": true, "1234567": false, "12a": false, "1 OR 1=1": false} {
		if got := strict.ValidateMember(m) == nil; got != ok {
			t.Errorf("pattern: ValidateMember(%q) ok = %v, want %v", m, got, ok)
		}
	}
	if _, ok := strict.Match("user:12a"); ok {
		t.Error("Match accepted a member that fails the pattern")
	}
}

func TestOverlaps(t *testing.T) {
	cases := []struct {
		a, b string
		want bool
	}{
		{"product:{id}", "product:{sku}", true},
		{"product:{id}", "product:{id}:v2", true},
		{"product:{id}", "products:{id}", false},
		{"product:{id}", "product:7", true},
		{"product:{id}", "product:", false},
		{"a:{x}:b", "a:{y}:c", false},
		{"top", "top", true},
		{"top", "tops", false},
		{"{id}:x", "a:{id}", true},
	}
	for _, c := range cases {
		a, _ := keytmpl.Parse(c.a)
		b, _ := keytmpl.Parse(c.b)
		if got := a.Overlaps(b); got != c.want {
			t.Errorf("%q overlaps %q = %v, want %v", c.a, c.b, got, c.want)
		}
		if got := b.Overlaps(a); got != c.want {
			t.Errorf("%q overlaps %q = %v, want %v (reversed)", c.b, c.a, got, c.want)
		}
	}
}
