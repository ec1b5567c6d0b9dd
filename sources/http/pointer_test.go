package http_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	httpsrc "github.com/hearth-dev/hearth/sources/http"
	"github.com/hearth-dev/hearth/warmer"
)

func TestPointerStreaming(t *testing.T) {
	doc := `{"skip": {"deep": [1, [2, {"x": "y"}], "z"]}, "a": [[0, 1], [2, [3, {"k": "v"}]]],
		"e~s/c": {"~1": "tilde-one", "/": "slash", "~": "tilde"}, "u": "caf\u00e9 \"q\" <b>",
		"n": null, "num": -1.5e3, "t": true, "": {"": "empty"}, "obj": {"b": 1, "a": [ ]}}`
	for _, tc := range []struct{ ptr, want string }{
		{"/a/1/1/1/k", "v"},
		{"/a/1", `[2,[3,{"k":"v"}]]`},
		{"/a/0/1", "1"},
		{"/e~0s~1c/~01", "tilde-one"},
		{"/e~0s~1c/~1", "slash"},
		{"/e~0s~1c/~0", "tilde"},
		{"/u", `café "q" <b>`},
		{"/num", "-1.5e3"},
		{"/t", "true"},
		{"/", `{"":"empty"}`},
		{"//", "empty"},
		{"/obj", `{"b":1,"a":[]}`}, // original member order, compact
	} {
		got, err := httpsrc.Pointer([]byte(doc), tc.ptr)
		if err != nil || string(got) != tc.want {
			t.Errorf("Pointer(%q) = %q, %v; want %q", tc.ptr, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		doc, ptr string
		want     error
	}{
		{doc, "/missing", warmer.ErrBadPayload},
		{doc, "/a/2", warmer.ErrBadPayload},
		{doc, "/a/-", warmer.ErrBadPayload},
		{doc, "/a/+1", warmer.ErrBadPayload},
		{doc, "/a/01", warmer.ErrBadPayload},
		{doc, "/a/", warmer.ErrBadPayload},
		{doc, "/t/x", warmer.ErrBadPayload},
		{doc, "/n", warmer.ErrNullValue},
		{doc, "t", warmer.ErrBadPayload},
		{"<html>not json", "/a", warmer.ErrBadPayload},
		{"", "/a", warmer.ErrBadPayload},
		{`{"a": 1`, "/a", warmer.ErrBadPayload},            // truncated after the value
		{`{"a": 1, "b": [}`, "/a", warmer.ErrBadPayload},   // broken after the value
		{`{"a": 1} {"b": 2}`, "/a", warmer.ErrBadPayload},  // a second document
		{`{"a": 1} x`, "/a", warmer.ErrBadPayload},         // trailing garbage
		{`{"a": 1, "a": 2}`, "/a", warmer.ErrBadPayload},   // ambiguous
		{"{\"a\": \"\xff\"}", "/a", warmer.ErrBadPayload},  // invalid UTF-8
		{`{"a": null, "b": }`, "/a", warmer.ErrBadPayload}, // null, but the body is broken
		{`[1, 2`, "/0", warmer.ErrBadPayload},
	} {
		if _, err := httpsrc.Pointer([]byte(tc.doc), tc.ptr); !errors.Is(err, tc.want) {
			t.Errorf("Pointer(%q, %q) err = %v, want %v", tc.doc, tc.ptr, err, tc.want)
		}
	}
}

// TestPointerBodyBound: a body over max_body_bytes is refused as too large even
// when the pointed value comes first, and a body of exactly the bound loads.
func TestPointerBodyBound(t *testing.T) {
	const bound = 1000
	pad := func(n int) string { // {"v":"ok","pad":"xxx…"} of exactly n bytes
		return `{"v":"ok","pad":"` + strings.Repeat("x", n-len(`{"v":"ok","pad":""}`)) + `"}`
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		_, _ = w.Write([]byte(pad(n)))
	}))
	defer srv.Close()
	src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: srv.URL, Timeout: 2 * time.Second, MaxBodyBytes: bound})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := src.Load(context.Background(), spec(t, "b:{n}", "/{n}", "/v"), []string{strconv.Itoa(bound), strconv.Itoa(bound + 1), "100000"})
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Err != nil || string(rs[0].Value) != "ok" {
		t.Errorf("body of exactly the bound: %q %v", rs[0].Value, rs[0].Err)
	}
	for _, r := range rs[1:] {
		if !errors.Is(r.Err, warmer.ErrTooLarge) {
			t.Errorf("body of %s bytes: err %v, want ErrTooLarge", r.Member, r.Err)
		}
	}
	// Without a pointer the body is the value: read no further than
	// max_value_bytes when it is the smaller bound (Content-Length or not).
	raw := spec(t, "b:{n}", "/{n}", "")
	raw.MaxValueBytes = 500
	rs, err = src.Load(context.Background(), raw, []string{"500", "501", "100000"})
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Err != nil || len(rs[0].Value) != 500 {
		t.Errorf("body of exactly max_value_bytes: %d bytes, %v", len(rs[0].Value), rs[0].Err)
	}
	for _, r := range rs[1:] {
		if !errors.Is(r.Err, warmer.ErrTooLarge) || !strings.Contains(r.Err.Error(), "max_value_bytes 500") && !strings.Contains(r.Err.Error(), "max_value_bytes is 500") {
			t.Errorf("raw body of %s bytes: err %v, want ErrTooLarge naming max_value_bytes", r.Member, r.Err)
		}
	}
}

// wholeDecode is the pointer as it was before streaming: decode the whole
// document, then walk it. The fuzz test holds the streaming one to it.
func wholeDecode(doc []byte, ptr string) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var node any
	if err := dec.Decode(&node); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("trailing data")
	}
	if ptr == "" {
		return node, nil
	}
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch n := node.(type) {
		case map[string]any:
			next, ok := n[tok]
			if !ok {
				return nil, errors.New("no member")
			}
			node = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(n) || (len(tok) > 1 && tok[0] == '0') || tok[0] == '+' {
				return nil, errors.New("no index")
			}
			node = n[i]
		default:
			return nil, errors.New("scalar")
		}
	}
	return node, nil
}

// FuzzPointer: the streaming pointer never panics, never accepts what the whole
// decode refuses, and when both succeed they select the same value. (It may
// refuse more: duplicate names, invalid UTF-8.)
func FuzzPointer(f *testing.F) {
	for _, s := range []string{`{"a":[1,{"b":"c"}]}`, `[[],{}]`, `"s"`, `{"a~b":{"c/d":null}}`, `{"a":1,"a":2}`, `1 2`, `{"x":"\u00e9"}`} {
		for _, p := range []string{"", "/a", "/a/1/b", "/0", "/1", "/a~0b/c~1d"} {
			f.Add(s, p)
		}
	}
	f.Fuzz(func(t *testing.T, doc, ptr string) {
		if ptr != "" && ptr[0] != '/' {
			ptr = "/" + ptr
		}
		want, werr := wholeDecode([]byte(doc), ptr)
		got, gerr := httpsrc.Pointer([]byte(doc), ptr)
		if gerr != nil {
			if !errors.Is(gerr, warmer.ErrBadPayload) && !errors.Is(gerr, warmer.ErrNullValue) {
				t.Fatalf("Pointer(%q, %q) err %v: neither ErrBadPayload nor ErrNullValue", doc, ptr, gerr)
			}
			if errors.Is(gerr, warmer.ErrNullValue) && (werr != nil || want != nil) {
				t.Fatalf("Pointer(%q, %q) says null, whole decode %v, %v", doc, ptr, want, werr)
			}
			return
		}
		if werr != nil {
			t.Fatalf("Pointer(%q, %q) = %q, but the whole decode fails: %v", doc, ptr, got, werr)
		}
		if s, ok := want.(string); ok {
			if string(got) != s {
				t.Fatalf("Pointer(%q, %q) = %q, want %q", doc, ptr, got, s)
			}
			return
		}
		var g any
		dec := json.NewDecoder(bytes.NewReader(got))
		dec.UseNumber()
		if err := dec.Decode(&g); err != nil || !reflect.DeepEqual(g, want) {
			t.Fatalf("Pointer(%q, %q) = %q (%v), want %v", doc, ptr, got, err, fmt.Sprint(want))
		}
	})
}
