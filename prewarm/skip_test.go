package prewarm

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/warmer"
	"github.com/rs/zerolog"
)

// An access log holds the application's every read, most of them keys no
// declaration names: skipping one is counted, and costs no allocation unless
// its debug line is written. A key in Hearth's own namespace is still
// logged at warn, quoted.
func TestSkippedKeysAreCountedWithoutAllocating(t *testing.T) {
	tmpl, err := keytmpl.Parse("item:{id}")
	if err != nil {
		t.Fatal(err)
	}
	spec := &warmer.Spec{Name: "item", Template: tmpl.WithNamespace("hearth"), BatchSize: 100}
	var out bytes.Buffer
	r := &prewarmRun{
		p:      &Prewarmer{log: zerolog.New(&out).Level(zerolog.InfoLevel)},
		po:     Options{TopN: 1000},
		specs:  []*warmer.Spec{spec},
		reader: prewarmReader{pending: map[*warmer.Spec]*pendingBatch{}, skipped: map[string]int{}},
	}
	keys := []string{"user:7", "item:a{b", "item:a b", "hearth:fence"}
	r.add("user:1") // the first skip makes its counter's map entry
	allocs := testing.AllocsPerRun(200, func() {
		for _, k := range keys[:3] {
			r.add(k)
		}
	})
	if allocs != 0 {
		t.Errorf("skipping 3 keys allocated %.1f times with debug lines off, want 0", allocs)
	}
	if out.Len() != 0 {
		t.Errorf("debug lines written at info level: %s", out.String())
	}
	r.add(keys[3])
	if got := out.String(); !strings.Contains(got, `"level":"warn"`) || !strings.Contains(got, `\"hearth:fence\"`) {
		t.Errorf("a key in Hearth's namespace was not logged at warn, quoted: %s", got)
	}
	want := map[string]int{SkipUnknown: 1 + 201, SkipInvalidMember: 201, SkipMalformed: 201, SkipNamespace: 1}
	for reason, n := range want {
		if got := r.reader.skipped[reason]; got != n {
			t.Errorf("skipped[%s] = %d, want %d (all: %v)", reason, got, n, r.reader.skipped)
		}
	}
}
