package config_test

import (
	"net/textproto"
	"strings"
	"testing"

	"github.com/hearth-dev/hearth/config"
)

func httpConfig(headers, baseURL string) string {
	return `
sources:
  - name: api
    type: http
    base_url: "` + baseURL + `"
    timeout: 1s
    headers: {` + headers + `}
keys:
  - name: p
    key: "p:{id}"
    source: api
    ttl: 60s
    members: ["1"]
    path: "/p/{id}"
`
}

// TestReservedHeadersRefused: a source's headers may not set the request's
// framing, the connection's hop-by-hop headers, a proxy's headers or the ones
// Hearth sets itself; the message names the source and the header, in any
// letter case.
func TestReservedHeadersRefused(t *testing.T) {
	for _, h := range []string{"Host", "host", "Content-Length", "Transfer-Encoding", "transfer-encoding", "Connection",
		"Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "proxy-anything", "TE", "Trailer", "Upgrade", "Expect",
		"If-None-Match", "If-Modified-Since", "Range"} {
		_, err := config.Parse("test.yaml", []byte(httpConfig(h+`: "v"`, "http://127.0.0.1:1")))
		if err == nil {
			t.Errorf("header %s passed validation", h)
			continue
		}
		// The config's map keys arrive lower-cased; the message names the
		// header as HTTP spells it.
		canon := textproto.CanonicalMIMEHeaderKey(h)
		if want := "sources[api].headers." + strings.ToLower(h) + ": header " + canon + " cannot be configured"; !strings.Contains(err.Error(), want) {
			t.Errorf("header %s: error %q does not say %q", h, err, want)
		}
	}
	if _, err := config.Parse("test.yaml", []byte(httpConfig(`Authorization: "Bearer x", X-Api-Key: "k", Accept: "application/json"`, "http://127.0.0.1:1"))); err != nil {
		t.Errorf("ordinary headers refused: %v", err)
	}
}

// TestValidateMasksBareQuery: a base_url that fails validation is quoted with
// every query part masked, a bare ?TOKEN too.
func TestValidateMasksBareQuery(t *testing.T) {
	_, err := config.Parse("test.yaml", []byte(httpConfig("", "ftp://api.example.com/v1?SECRETTOKEN")))
	if err == nil {
		t.Fatal("an ftp base_url passed validation")
	}
	if msg := err.Error(); strings.Contains(msg, "SECRETTOKEN") || !strings.Contains(msg, "ftp://api.example.com/v1?xxxxx") {
		t.Errorf("message does not mask the bare query part: %s", msg)
	}
}
