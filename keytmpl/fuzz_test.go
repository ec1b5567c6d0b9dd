package keytmpl_test

import (
	"strings"
	"testing"

	"github.com/hearth-dev/hearth/keytmpl"
)

// FuzzParseTemplate: parsing never panics; a parsed template round-trips, and
// every key it makes from a valid member matches back to that member.
func FuzzParseTemplate(f *testing.F) {
	for _, seed := range [][2]string{
		{"product:{id}", "42"},
		{"top-products:global", ""},
		{"{id}:profile", "a-b_c.d"},
		{"price:{sku}:eur", "ü-ñ"},
		{"a:{id}:{id}", "1"},
		{"a:{}", "1"},
		{"{id}", "x"},
		{"a:{id", "1"},
		{"a:id}", "1"},
		{"a b:{id}", "1"},
		{"p:{id}", "has space"},
		{"p:{id}", "{x}"},
		{"p:{id}", "\x00\xff"},
		{"p:{id}:s", "1:s"},
		{"p:{id}", strings.Repeat("9", 200)},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, tmpl, member string) {
		tp, err := keytmpl.Parse(tmpl)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if tp.String() != tmpl {
			t.Fatalf("String() = %q, want %q", tp.String(), tmpl)
		}
		if !tp.Overlaps(tp) {
			t.Fatalf("%q does not overlap itself", tmpl)
		}
		if !tp.IsFamily() {
			if m, ok := tp.Match(tmpl); !ok || m != "" {
				t.Fatalf("single key %q does not match itself: %q, %v", tmpl, m, ok)
			}
			return
		}
		if err := tp.ValidateMember(member); err == nil {
			key := tp.Key(member)
			m, ok := tp.Match(key)
			if !ok || m != member {
				t.Fatalf("Match(Key(%q)) = %q, %v for template %q", member, m, ok, tmpl)
			}
			if strings.ContainsAny(member, "{} \t\r\n") {
				t.Fatalf("member %q with braces or whitespace passed validation", member)
			}
		}
		// Any key the template matches names a valid member that rebuilds it.
		if m, ok := tp.Match(member); ok {
			if err := tp.ValidateMember(m); err != nil {
				t.Fatalf("Match(%q) returned invalid member %q: %v", member, m, err)
			}
			if got := tp.Key(m); got != member {
				t.Fatalf("Key(Match(%q)) = %q", member, got)
			}
		}
	})
}
