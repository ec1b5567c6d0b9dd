package keytmpl_test

import (
	"testing"

	"github.com/hearth-dev/hearth/keytmpl"
)

func TestTemplateCanName(t *testing.T) {
	for _, tc := range []struct {
		key, pattern string
		maxLen       int
		want         bool
	}{
		{key: "hearth:{id}", want: true},
		{key: "hearth:fence", want: true},
		{key: "hearth", want: true},
		{key: "hearth:x:{id}:y", want: true},
		{key: "hea{id}", want: true},                       // member "rth" makes hearth, "rth:warm" hearth:warm
		{key: "h{id}", want: true},                         // member "earth:warm"
		{key: "{id}:warm", want: true},                     // member "hearth"
		{key: "{id}:fence", pattern: "[a-z]+", want: true}, // member "hearth", suffix ":fence"
		{key: "hearth{id}", pattern: ":[a-z]+", want: true},
		{key: "h{id}", pattern: "(?i)EARTH:.*", want: true}, // case folding counts
		{key: "hearthstone:{id}"},
		{key: "hearth-{id}"},
		{key: "Hearth:{id}"},
		{key: "app:hearth:{id}"},
		{key: "hearth-fence"},
		{key: "h{id}", pattern: "[0-9]+"},
		{key: "{id}:warm", pattern: "[0-9]+"},
		{key: "hea{id}", pattern: "rt[a-g]+"},
		{key: "h{id}", maxLen: 4},              // neither "earth" nor "earth:" fits
		{key: "h{id}", maxLen: 5, want: true},  // "earth": the key hearth itself
		{key: "hearth{id}", pattern: "[a-z]+"}, // ':' never begins a member
	} {
		t.Run(tc.key+" "+tc.pattern, func(t *testing.T) {
			tpl, err := keytmpl.Parse(tc.key)
			if err != nil {
				t.Fatal(err)
			}
			if tpl, err = tpl.WithMemberRules(tc.pattern, tc.maxLen); err != nil {
				t.Fatal(err)
			}
			if got := tpl.CanName("hearth"); got != tc.want {
				t.Errorf("CanName(hearth) = %v, want %v", got, tc.want)
			}
		})
	}
}
