package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"
)

// defaultHealthURL is the probe of a daemon on the default http.listen.
const defaultHealthURL = "http://127.0.0.1:9464/healthz"

func newHealthcheckCmd(g *globals) *cobra.Command {
	var (
		target  string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "healthcheck",
		Short: "Probe a running hearth's /healthz or /readyz (for containers without curl)",
		Long: `Healthcheck sends one GET to --url and exits 0 when it answers 200, 1 otherwise
(not listening, a timeout, any other status). It reads no config and makes no
other connection, so it suits a container's HEALTHCHECK on a distroless image
that has no curl. Probe /healthz for "the process is alive" (leader or standby)
and /readyz for "this instance leads and is warm".

Exit codes: 0 healthy, 1 not, 2 a bad flag.`,
		Example: `  hearth healthcheck
  hearth healthcheck --url http://127.0.0.1:9464/readyz --timeout 1s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			u, err := url.Parse(target)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fail(exitConfig, fmt.Errorf("--url: must be an http:// or https:// URL with a host (got %q)", target))
			}
			if timeout <= 0 {
				return fail(exitConfig, fmt.Errorf("--timeout: must be > 0 (got %s)", timeout))
			}
			return healthcheck(cmd.Context(), g.stdout, u.String(), timeout)
		},
	}
	cmd.Flags().StringVar(&target, "url", defaultHealthURL, "the endpoint to probe")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Second, "give up after this long")
	return cmd
}

func healthcheck(ctx context.Context, out io.Writer, target string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fail(exitConfig, fmt.Errorf("--url: %w", err))
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return fail(exitFail, fmt.Errorf("healthcheck %s: %w", target, err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fail(exitFail, fmt.Errorf("healthcheck %s: %s %s", target, resp.Status, body))
	}
	fmt.Fprintf(out, "%s: %s\n", target, body)
	return nil
}
