package changes

import "testing"

// BenchmarkParsePayload: what reading one change notification costs, for a
// single id (the trigger's notification of a single-row UPDATE).
func BenchmarkParsePayload(b *testing.B) {
	const s = `{"hearth":1,"ts":1765090000123456,"ids":["4242"]}`
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parsePayload(s); err != nil {
			b.Fatal(err)
		}
	}
}
