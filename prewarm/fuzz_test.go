package prewarm_test

import (
	"strings"
	"testing"

	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/prewarm"
	"github.com/hearth-dev/hearth/warmer"
)

// FuzzPrewarmClassify feeds arbitrary access-log keys to the matcher: it never
// panics; a key it accepts is exactly its declaration's key for a valid member;
// a key it skips has a known reason and matches no declaration.
func FuzzPrewarmClassify(f *testing.F) {
	for _, k := range []string{"product:7", "product:{id}", "product:1' OR '1'='1", "user:7", "top", "top:x",
		"product:", "price:7:eur", "price::eur", "product:1\x00", "\xff", strings.Repeat("9", 5000)} {
		f.Add(k)
	}
	specs := []*warmer.Spec{fuzzSingle(f, "top"), fuzzFamily(f, "product", "product:{id}", "[0-9]{1,12}"), fuzzFamily(f, "price", "price:{sku}:eur", "")}
	reasons := map[string]bool{prewarm.SkipTooLong: true, prewarm.SkipMalformed: true, prewarm.SkipUnknown: true, prewarm.SkipInvalidMember: true}
	f.Fuzz(func(t *testing.T, key string) {
		spec, member, reason := prewarm.Classify(specs, key)
		if reason != "" {
			if !reasons[reason] || spec != nil {
				t.Fatalf("Classify(%q) = %v, %q, %q: unknown reason or a spec with a skip", key, spec, member, reason)
			}
			for _, s := range specs {
				if m, ok := s.Template.Match(key); ok && len(key) <= prewarm.MaxLogKeyBytes {
					t.Fatalf("Classify(%q) skipped it (%s), but %s matches it with member %q", key, reason, s.Name, m)
				}
			}
			return
		}
		if spec == nil {
			t.Fatalf("Classify(%q): no spec and no reason", key)
		}
		if got := spec.Template.Key(member); got != key {
			t.Fatalf("Classify(%q) = %s member %q, whose key is %q", key, spec.Name, member, got)
		}
		if spec.Template.IsFamily() {
			if err := spec.Template.ValidateMember(member); err != nil {
				t.Fatalf("Classify(%q) accepted member %q: %v", key, member, err)
			}
		}
	})
}

func fuzzSingle(f *testing.F, key string) *warmer.Spec {
	tp, err := keytmpl.Parse(key)
	if err != nil {
		f.Fatal(err)
	}
	return &warmer.Spec{Name: key, Template: tp, Source: "o"}
}

func fuzzFamily(f *testing.F, name, key, pattern string) *warmer.Spec {
	tp, err := keytmpl.Parse(key)
	if err != nil {
		f.Fatal(err)
	}
	if tp, err = tp.WithMemberRules(pattern, 0); err != nil {
		f.Fatal(err)
	}
	return &warmer.Spec{Name: name, Template: tp, Source: "o", BatchSize: 10}
}
