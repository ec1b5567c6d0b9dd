package http_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/keytmpl"
	httpsrc "github.com/hearth-dev/hearth/sources/http"
	"github.com/hearth-dev/hearth/warmer"
)

func spec(t *testing.T, key, path, ptr string) *warmer.Spec {
	t.Helper()
	tp, err := keytmpl.Parse(key)
	if err != nil {
		t.Fatal(err)
	}
	return &warmer.Spec{Name: "price", Template: tp, Path: path, JSONPointer: ptr}
}

func TestLoad(t *testing.T) {
	var (
		mu    sync.Mutex
		paths []string
		auth  []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.RequestURI())
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		switch r.URL.Query().Get("sku") {
		case "missing":
			http.NotFound(w, r)
		case "broken":
			http.Error(w, "upstream down", http.StatusBadGateway)
		case "garbage":
			_, _ = w.Write([]byte("<html>not json"))
		case "null":
			_, _ = w.Write([]byte(`{"price": null}`))
		case "big":
			_, _ = w.Write([]byte(`{"price": "` + strings.Repeat("9", 200) + `"}`))
		default:
			_, _ = w.Write([]byte(`{"price": {"eur": 12.5, "tags": ["a"]}, "sku": "` + r.URL.Query().Get("sku") + `"}`))
		}
	}))
	defer srv.Close()
	src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: srv.URL + "/v1/", Timeout: 2 * time.Second,
		Headers: map[string]string{"Authorization": "Bearer t"}, MaxBodyBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	s := spec(t, "price:{sku}", "/prices?sku={sku}", "/price")
	members := []string{"A-1", "missing", "broken", "garbage", "null", "big", "a&b=c"}
	rs, err := src.Load(context.Background(), s, members)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]warmer.Result{}
	for _, r := range rs {
		by[r.Member] = r
	}
	if got, want := string(by["A-1"].Value), `{"eur":12.5,"tags":["a"]}`; got != want {
		t.Errorf("A-1 = %q, want %q", got, want)
	}
	if !by["missing"].Missing {
		t.Error("404 not reported as missing")
	}
	for m, want := range map[string]error{"broken": warmer.ErrOrigin, "garbage": warmer.ErrBadPayload, "null": warmer.ErrNullValue, "big": warmer.ErrTooLarge} {
		if err := by[m].Err; !errors.Is(err, want) {
			t.Errorf("%s: err = %v, want %v", m, err, want)
		}
	}
	if got := string(by["a&b=c"].Value); !strings.Contains(got, "eur") {
		t.Errorf("member with query characters got %q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range paths {
		if !strings.HasPrefix(p, "/v1/prices?sku=") || strings.Count(p, "=") != 1 {
			t.Errorf("request %q escaped its template", p)
		}
		if strings.Contains(p, "&b=") {
			t.Errorf("member injected a query parameter: %q", p)
		}
	}
	for _, a := range auth {
		if a != "Bearer t" {
			t.Errorf("Authorization header = %q", a)
		}
	}
}

func TestPathEscaping(t *testing.T) {
	var got []string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.URL.EscapedPath())
		mu.Unlock()
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: srv.URL, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s := spec(t, "item:{id}", "/items/{id}/detail", "")
	for _, m := range []string{"x?y=1", "...", "a;b", "100%", "%zz"} {
		rs, err := src.Load(context.Background(), s, []string{m})
		if err != nil || rs[0].Err != nil {
			t.Fatalf("load %q: %v %v", m, err, rs[0].Err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"/items/x%3Fy=1/detail", "/items/.../detail", "/items/a%3Bb/detail", "/items/100%25/detail", "/items/%25zz/detail"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request path = %q, want %q", got[i], want[i])
		}
	}
}

func TestPointer(t *testing.T) {
	doc := []byte(`{"a/b": {"m~n": [10, "x", true]}, "s": "plain"}`)
	for ptr, want := range map[string]string{
		"":             `{"a/b":{"m~n":[10,"x",true]},"s":"plain"}`,
		"/s":           "plain",
		"/a~1b/m~0n":   `[10,"x",true]`,
		"/a~1b/m~0n/0": "10",
		"/a~1b/m~0n/2": "true",
	} {
		got, err := httpsrc.Pointer(doc, ptr)
		if err != nil || string(got) != want {
			t.Errorf("Pointer(%q) = %q, %v; want %q", ptr, got, err, want)
		}
	}
	for _, ptr := range []string{"/nope", "/a~1b/m~0n/3", "/a~1b/m~0n/01", "/s/x", "s"} {
		if _, err := httpsrc.Pointer(doc, ptr); !errors.Is(err, warmer.ErrBadPayload) {
			t.Errorf("Pointer(%q) err = %v, want ErrBadPayload", ptr, err)
		}
	}
	if _, err := httpsrc.Pointer([]byte(`{} {}`), ""); !errors.Is(err, warmer.ErrBadPayload) {
		t.Errorf("trailing data accepted: %v", err)
	}
}
