package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// server is Hearth's own HTTP listener: metrics, liveness and readiness.
type server struct {
	ln    net.Listener
	srv   *http.Server
	mux   *http.ServeMux
	ready atomic.Bool
	done  chan error
}

// listen binds the address now, so that a taken port fails start-up.
func listen(addr string, gatherer prometheus.Gatherer, log zerolog.Logger) (*server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	s := &server{ln: ln, mux: mux, done: make(chan error, 1)}
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready: start-up load not finished", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: nil}
	log.Info().Str("addr", ln.Addr().String()).Msg("http listening")
	return s, nil
}

// Addr is the bound address (useful with port 0).
func (s *server) Addr() string { return s.ln.Addr().String() }

func (s *server) serve() {
	go func() {
		err := s.srv.Serve(s.ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
}

func (s *server) shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; serr != nil && err == nil {
		err = serr
	}
	return err
}
