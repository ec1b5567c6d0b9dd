// Package http is the HTTP upstream origin: one GET per member, the path template's
// parameter URL-escaped, the value the response body or a JSON pointer into it.
package http

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	nethttp "net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/hearth-dev/hearth/warmer"
)

// DefaultMaxBodyBytes bounds a response body when the source sets no bound.
const DefaultMaxBodyBytes = 8 << 20

// Config is an HTTP upstream source.
type Config struct {
	Name    string
	BaseURL string
	// Headers are sent with every request (e.g. Authorization); never logged.
	Headers map[string]string
	// Timeout bounds one request.
	Timeout time.Duration
	// Concurrency bounds the requests one batch has in flight.
	Concurrency  int
	MaxBodyBytes int64
	// HealthPath is requested by Ping; any answer below 500 counts as reachable.
	HealthPath string
}

// Source loads values over HTTP.
type Source struct {
	cfg    Config
	base   *url.URL
	client *nethttp.Client
}

var _ warmer.Source = (*Source)(nil)

// New validates the base URL and builds the client.
func New(cfg Config) (*Source, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("source %s: base_url must be an absolute http(s) URL", cfg.Name)
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 8
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	tr := nethttp.DefaultTransport.(*nethttp.Transport).Clone()
	tr.MaxIdleConnsPerHost = cfg.Concurrency
	return &Source{cfg: cfg, base: u, client: &nethttp.Client{Timeout: cfg.Timeout, Transport: tr}}, nil
}

// Close releases idle connections.
func (s *Source) Close() { s.client.CloseIdleConnections() }

// Ping requests the health path (the base URL by default): reachable means any
// answer below 500.
func (s *Source) Ping(ctx context.Context) error {
	u := *s.base
	if s.cfg.HealthPath != "" {
		u.Path = strings.TrimRight(u.Path, "/") + s.cfg.HealthPath
	}
	resp, err := s.do(ctx, u.String())
	if err != nil {
		return fmt.Errorf("ping %s (%s): %w", s.cfg.Name, s.base.Redacted(), err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode >= 500 {
		return fmt.Errorf("ping %s (%s): HTTP %d", s.cfg.Name, s.base.Redacted(), resp.StatusCode)
	}
	return nil
}

// Load fetches every member in parallel (bounded by Concurrency). Each member's
// failure is its own: one bad answer never fails the batch.
func (s *Source) Load(ctx context.Context, spec *warmer.Spec, members []string) ([]warmer.Result, error) {
	if !spec.Template.IsFamily() {
		return []warmer.Result{s.fetch(ctx, spec, "")}, nil
	}
	out := make([]warmer.Result, len(members))
	var g errgroup.Group
	g.SetLimit(s.cfg.Concurrency)
	for i, m := range members {
		g.Go(func() error {
			out[i] = s.fetch(ctx, spec, m)
			return nil
		})
	}
	_ = g.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// URL builds the request URL for a member: the parameter is path-escaped in the
// path and query-escaped in the query string, so a member cannot change the host,
// the path's shape or add query parameters.
func (s *Source) URL(spec *warmer.Spec, member string) (string, error) {
	return BuildURL(s.base, spec.Path, spec.Template.Param(), member)
}

// BuildURL expands a path template against a base URL.
func BuildURL(base *url.URL, pathTmpl, param, member string) (string, error) {
	path, query, _ := strings.Cut(pathTmpl, "?")
	ph := "{" + param + "}"
	if param != "" {
		path = strings.ReplaceAll(path, ph, url.PathEscape(member))
		query = strings.ReplaceAll(query, ph, url.QueryEscape(member))
	}
	u := *base
	u.RawPath = ""
	u.Path = ""
	raw := strings.TrimRight(base.EscapedPath(), "/") + path
	if query != "" {
		raw += "?" + query
	}
	ref, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("build url: %w", err)
	}
	u.Path, u.RawPath, u.RawQuery = ref.Path, ref.RawPath, ref.RawQuery
	return u.String(), nil
}

func (s *Source) do(ctx context.Context, target string) (*nethttp.Response, error) {
	req, err := nethttp.NewRequestWithContext(ctx, nethttp.MethodGet, target, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range s.cfg.Headers {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		// url.Error quotes the URL; it holds no secret (headers are not in it),
		// but strip it anyway to keep errors short and member-free.
		var ue *url.Error
		if errors.As(err, &ue) {
			return nil, ue.Err
		}
		return nil, err
	}
	return resp, nil
}

func (s *Source) fetch(ctx context.Context, spec *warmer.Spec, member string) warmer.Result {
	r := warmer.Result{Member: member}
	target, err := s.URL(spec, member)
	if err != nil {
		r.Err = err
		return r
	}
	resp, err := s.do(ctx, target)
	if err != nil {
		r.Err = fmt.Errorf("%w: %w", warmer.ErrOrigin, err)
		return r
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == nethttp.StatusNotFound || resp.StatusCode == nethttp.StatusGone:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		r.Missing = true
		return r
	case resp.StatusCode >= 500 || resp.StatusCode == nethttp.StatusTooManyRequests:
		// Worth retrying, and counted by the circuit breaker.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		r.Err = fmt.Errorf("%w: %w: HTTP %d", warmer.ErrOrigin, warmer.ErrUnavailable, resp.StatusCode)
		return r
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		r.Err = fmt.Errorf("%w: HTTP %d", warmer.ErrOrigin, resp.StatusCode)
		return r
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, s.cfg.MaxBodyBytes+1))
	if err != nil {
		r.Err = fmt.Errorf("%w: read body: %w", warmer.ErrOrigin, err)
		return r
	}
	if int64(len(body)) > s.cfg.MaxBodyBytes {
		r.Err = fmt.Errorf("%w: body over %d bytes", warmer.ErrTooLarge, s.cfg.MaxBodyBytes)
		return r
	}
	if spec.JSONPointer == "" {
		r.Value = body
		return r
	}
	v, err := Pointer(body, spec.JSONPointer)
	if err != nil {
		r.Err = fmt.Errorf("keys[%s].json_pointer %q: %w", spec.Name, spec.JSONPointer, err)
		return r
	}
	r.Value = v
	return r
}

// Pointer resolves an RFC 6901 JSON pointer in doc. A string is returned without
// its quotes; any other value as compact JSON. A JSON null is ErrNullValue, a
// pointer that leads nowhere or a body that is not JSON is ErrBadPayload.
func Pointer(doc []byte, ptr string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var node any
	if err := dec.Decode(&node); err != nil {
		return nil, fmt.Errorf("%w: body is not JSON: %w", warmer.ErrBadPayload, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: body has data after the JSON value", warmer.ErrBadPayload)
	}
	if ptr != "" {
		if !strings.HasPrefix(ptr, "/") {
			return nil, fmt.Errorf("%w: pointer must start with '/'", warmer.ErrBadPayload)
		}
		for _, tok := range strings.Split(ptr[1:], "/") {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			switch n := node.(type) {
			case map[string]any:
				next, ok := n[tok]
				if !ok {
					return nil, fmt.Errorf("%w: no member %q", warmer.ErrBadPayload, tok)
				}
				node = next
			case []any:
				i, err := strconv.Atoi(tok)
				if err != nil || i < 0 || i >= len(n) || (len(tok) > 1 && tok[0] == '0') {
					return nil, fmt.Errorf("%w: no index %q", warmer.ErrBadPayload, tok)
				}
				node = n[i]
			default:
				return nil, fmt.Errorf("%w: cannot descend into a scalar at %q", warmer.ErrBadPayload, tok)
			}
		}
	}
	switch n := node.(type) {
	case nil:
		return nil, fmt.Errorf("%w: pointer selects null", warmer.ErrNullValue)
	case string:
		return []byte(n), nil
	default:
		return json.Marshal(n)
	}
}
