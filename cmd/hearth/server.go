package main

import (
	"context"
	"encoding/json"
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
	// role ("leader", "standby") and epoch describe this instance on /healthz;
	// instance is its name in the leader lease.
	role     atomic.Value
	epoch    atomic.Int64
	instance string
}

// setRole records this instance's role and, for a leader, its epoch.
func (s *server) setRole(role string, epoch int64) {
	s.epoch.Store(epoch)
	s.role.Store(role)
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
		// Healthy whether leader or standby; the body says which.
		role, _ := s.role.Load().(string)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(struct {
			Status   string `json:"status"`
			Role     string `json:"role,omitempty"`
			Epoch    int64  `json:"epoch,omitempty"`
			Ready    bool   `json:"ready"`
			Instance string `json:"instance,omitempty"`
		}{"ok", role, s.epoch.Load(), s.ready.Load(), s.instance})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			msg := "not ready: start-up load not finished"
			if role, _ := s.role.Load().(string); role == "standby" {
				msg = "not ready: standby (another instance leads)"
			}
			http.Error(w, msg, http.StatusServiceUnavailable)
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
