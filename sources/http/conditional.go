package http

import (
	nethttp "net/http"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/net/http/httpguts"
)

// Conditional requests: for each request the source remembers the validators
// (ETag, Last-Modified) and the value of its last 200 answer, and sends them
// back (If-None-Match, If-Modified-Since). A 304 Not Modified returns the
// remembered value without the origin sending a body; the write path then
// finds it byte-identical to what Hearth last wrote and only extends the TTL.
// Memory is bounded: at most MaxConditionalEntries members and
// MaxConditionalBytes of values per source, least recently loaded evicted
// first, and a value over MaxConditionalValue is not remembered at all.

const (
	// MaxConditionalEntries bounds the members remembered per source.
	MaxConditionalEntries = 100_000
	// MaxConditionalBytes bounds the remembered values' bytes per source.
	MaxConditionalBytes = 64 << 20
	// MaxConditionalValue is the largest value remembered.
	MaxConditionalValue = 256 << 10
	// maxValidator bounds an ETag or Last-Modified kept from an upstream.
	maxValidator = 256
)

// condEntry is what one member's last 200 answer left.
type condEntry struct {
	etag, lastModified string
	value              []byte
}

// condCache is a byte- and count-bounded LRU of condEntries.
type condCache struct {
	mu    sync.Mutex
	lru   *simplelru.LRU[string, condEntry]
	bytes int
}

func newCondCache() *condCache {
	c := &condCache{}
	c.lru, _ = simplelru.NewLRU[string, condEntry](MaxConditionalEntries, func(_ string, e condEntry) { c.bytes -= len(e.value) })
	return c
}

// condKey names what shapes a remembered value: the declaration, the method,
// the resolved request URL (base_url, path, query and member) and the JSON
// pointer that picked the value out of the body. The configured headers are
// the source's, fixed for its lifetime (a change needs a restart), and so is
// the cache. A reload that changes any of these makes a new key: the old
// validators are never sent for it, so a 304 can only return a value this very
// request produced before; the old entries age out of the LRU.
func condKey(spec, method, target, pointer string) string {
	return spec + "\x00" + method + "\x00" + target + "\x00" + pointer
}

func (c *condCache) get(key string) (condEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Get(key)
}

func (c *condCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.Remove(key)
}

// remember keeps a 200 answer's validators, if it had usable ones. An upstream's
// headers are untrusted: a validator that is not a valid header value (the
// client would refuse to send it back, failing every later load) or is too
// long is not kept, nor is a Last-Modified that is not an HTTP date.
func (c *condCache) remember(key string, h nethttp.Header, value []byte) {
	e := condEntry{value: value}
	if et := h.Get("ETag"); et != "" && len(et) <= maxValidator && httpguts.ValidHeaderFieldValue(et) {
		e.etag = et
	}
	if lm := h.Get("Last-Modified"); lm != "" && len(lm) <= maxValidator {
		if t, err := nethttp.ParseTime(lm); err == nil {
			e.lastModified = t.UTC().Format(nethttp.TimeFormat)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if (e.etag == "" && e.lastModified == "") || len(value) > MaxConditionalValue {
		c.lru.Remove(key)
		return
	}
	c.lru.Remove(key)
	c.lru.Add(key, e)
	c.bytes += len(value)
	for c.bytes > MaxConditionalBytes && c.lru.Len() > 0 {
		c.lru.RemoveOldest()
	}
}

// set adds the conditional headers of e to req.
func (e *condEntry) set(req *nethttp.Request) {
	if e == nil {
		return
	}
	if e.etag != "" {
		req.Header.Set("If-None-Match", e.etag)
	}
	if e.lastModified != "" {
		req.Header.Set("If-Modified-Since", e.lastModified)
	}
}
