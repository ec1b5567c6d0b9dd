package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// defaultHealthURL is the probe of a daemon on the default http.listen.
const defaultHealthURL = "http://127.0.0.1:9464/healthz"

func newHealthcheckCmd(g *globals) *cobra.Command {
	var (
		target  string
		ready   bool
		timeout time.Duration
		wait    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "healthcheck",
		Short: "Probe a running hearth's /healthz or /readyz (for containers without curl)",
		Long: `Healthcheck sends a GET to a running hearth and exits 0 when it answers 200, 1
otherwise (not listening, a timeout, any other status). It makes no other
connection, so it suits a container's HEALTHCHECK on a distroless image that has
no curl. /healthz answers "the process is alive" (leader or standby); with
--ready it probes /readyz, "this instance leads and is warm".

The address is --url, or with --config the config's http.listen (HEARTH_HTTP_LISTEN
included), else ` + defaultHealthURL + `. --wait keeps probing until healthy
or the wait is over, for scripts that start hearth and go on once it is warm.

Exit codes: 0 healthy, 1 not, 2 a bad flag or config.`,
		Example: `  hearth healthcheck
  hearth healthcheck --url http://127.0.0.1:9464/readyz --timeout 1s
  hearth healthcheck --config config.yaml --ready --wait 30s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if timeout <= 0 {
				return fail(exitConfig, fmt.Errorf("--timeout: must be > 0 (got %s)", timeout))
			}
			if wait < 0 {
				return fail(exitConfig, fmt.Errorf("--wait: must be >= 0 (got %s)", wait))
			}
			path := "/healthz"
			if ready {
				path = "/readyz"
			}
			switch {
			case cmd.Flags().Changed("url"):
				if ready {
					return fail(exitConfig, fmt.Errorf("--ready: not with --url (name the path in the URL)"))
				}
			case cmd.Flags().Changed("config"):
				cfg, err := g.load()
				if err != nil {
					return err
				}
				host, port, err := net.SplitHostPort(cfg.HTTP.Listen)
				if err != nil {
					return fail(exitConfig, fmt.Errorf("http.listen: %w", err))
				}
				if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
					host = "127.0.0.1" // listening on every address: probe loopback
				}
				target = "http://" + net.JoinHostPort(host, port) + path
			default:
				target = strings.TrimSuffix(target, "/healthz") + path
			}
			u, err := url.Parse(target)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fail(exitConfig, fmt.Errorf("--url: must be an http:// or https:// URL with a host (got %q)", target))
			}
			return healthcheck(cmd.Context(), g.stdout, u.String(), timeout, wait)
		},
	}
	cmd.Flags().StringVar(&target, "url", defaultHealthURL, "the endpoint to probe")
	cmd.Flags().BoolVar(&ready, "ready", false, "probe /readyz instead of /healthz")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Second, "give up on one probe after this long")
	cmd.Flags().DurationVar(&wait, "wait", 0, "keep probing until healthy or this long has passed (0: probe once)")
	return cmd
}

// healthProbeEvery is the pause between two probes of --wait.
const healthProbeEvery = 200 * time.Millisecond

func healthcheck(ctx context.Context, out io.Writer, target string, timeout, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		body, err := probe(ctx, target, timeout)
		if err == nil {
			fmt.Fprintf(out, "%s: %s\n", target, body)
			return nil
		}
		if time.Now().Add(healthProbeEvery).After(deadline) || ctx.Err() != nil {
			return fail(exitFail, err)
		}
		select {
		case <-ctx.Done():
			return fail(exitFail, err)
		case <-time.After(healthProbeEvery):
		}
	}
}

// probe GETs target once and returns its body when it answered 200.
func probe(ctx context.Context, target string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, fmt.Errorf("healthcheck %s: %w", target, err)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("healthcheck %s: %w", target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	body = bytes.TrimSpace(body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("healthcheck %s: %s %s", target, resp.Status, body)
	}
	return body, nil
}
