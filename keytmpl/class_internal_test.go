package keytmpl

import (
	"regexp"
	"testing"
	"unicode/utf8"
)

// The table form of a param_pattern must accept exactly what the regexp
// accepts: it replaces the regexp for classifying access-log keys.
func TestMemberClassMatchesRegexp(t *testing.T) {
	classes := []string{
		`[0-9]{1,9}`, `[0-9]+`, `[0-9]*`, `[0-9]?`, `[0-9]`, `[0-9]{3}`, `[0-9]{2,}`, `[0-9]{0,2}`,
		`[a-z0-9_-]{1,64}`, `[A-Fa-f0-9]{32}`, `\d+`, `\w{1,8}`, `[[:alnum:]]+`, `x+`, `x`,
		`([0-9]+)`, `(?:[0-9]+)`, `[0-9]+?`, `[0-9]{1,3}?`, `(?i)[a-f]+`, `a|b`,
	}
	others := []string{
		`[0-9]+[a-z]`, `abc`, `(?s).`, `[^0-9]+`, `.+`, `\pL+`, `[é]+`, `(?i)k+`, `(?i)x+`, `[0-9]+$`, `^[0-9]+`,
		`(?:[0-9]{2}){3}`, `[0-9]+|x`, `\S+`, `\b[0-9]+`,
	}
	members := []string{"", "0", "7", "42", "123", "1234567890", "12345678901", "abc", "ABC", "a-b_c", "deadbeef",
		"0123456789abcdef0123456789abcdef", "x", "xx", "é", "1é", "k", "K", "\u212a", "12 3", "1\n", "\n", "_", "-", "\x00", "\xff"}
	for _, p := range classes {
		c := compileMemberClass(`^(?:` + p + `)$`)
		if c == nil {
			t.Errorf("%q: not recognised as one ASCII class repeated", p)
			continue
		}
		re := regexp.MustCompile(`^(?:` + p + `)$`)
		for _, m := range members {
			if got, want := c.match(m), re.MatchString(m); got != want {
				t.Errorf("%q on %q: table says %v, regexp %v", p, m, got, want)
			}
		}
	}
	for _, p := range others {
		if c := compileMemberClass(`^(?:` + p + `)$`); c != nil {
			t.Errorf("%q: taken as a class repeated %d to %d times; it must be left to the regexp", p, c.min, c.max)
		}
	}
}

// A template with a class pattern validates members as one with the regexp
// alone would, errors included.
func TestValidateMemberWithClassPattern(t *testing.T) {
	tpl, err := Parse("item:{id}")
	if err != nil {
		t.Fatal(err)
	}
	fast, err := tpl.WithMemberRules(`[0-9]{1,9}`, 0)
	if err != nil {
		t.Fatal(err)
	}
	if fast.class == nil {
		t.Fatal("[0-9]{1,9} was not compiled to a table")
	}
	slow := fast
	slow.class = nil
	for _, m := range []string{"1", "123456789", "1234567890", "", "12a", "1 2", "{1}", "１２", "12\u00a0", "\xff1", "1\u200b"} {
		if got, want := fast.ValidateMember(m), slow.ValidateMember(m); !sameErr(got, want) {
			t.Errorf("member %q: %v with the table, %v with the regexp", m, got, want)
		}
	}
}

func sameErr(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Error() == b.Error()
}

// The byte table and the rune check agree on every member.
func TestCleanMemberMatchesRuneCheck(t *testing.T) {
	for _, m := range []string{"abc", "a b", "a\tb", "{", "}", "a\x7f", "é", "a\u00a0", "a\u2028", "\x85", "a\xc2\x85", "\xff", "ok-1_2.3:4", "日本"} {
		want := utf8.ValidString(m)
		for _, r := range m {
			want = want && memberRune(r)
		}
		if got := cleanMember(m); got != want {
			t.Errorf("cleanMember(%q) = %v, want %v", m, got, want)
		}
	}
}

func FuzzMemberClass(f *testing.F) {
	for _, s := range [][2]string{{`[0-9]{1,9}`, "123"}, {`[a-z_-]+`, "a-b"}, {`\w{2,}`, "ab"}, {`x?`, ""}, {`(?i)[a-c]`, "B"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, member string) {
		expr := `^(?:` + pattern + `)$`
		re, err := regexp.Compile(expr)
		if err != nil {
			return
		}
		c := compileMemberClass(re.String())
		if c == nil {
			return
		}
		if got, want := c.match(member), re.MatchString(member); got != want {
			t.Fatalf("pattern %q, member %q: table says %v, regexp %v", pattern, member, got, want)
		}
		if got, want := cleanMember(member), cleanRunes(member); got != want {
			t.Fatalf("cleanMember(%q) = %v, the rune check says %v", member, got, want)
		}
	})
}
