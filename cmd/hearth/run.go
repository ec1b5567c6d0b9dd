package main

import (
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/hearth-dev/hearth/daemon"
)

func newRunCmd(g *globals) *cobra.Command {
	var listen, pidFile string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon: load every declared key, then keep it warm",
		Long: `Run connects to Redis and every source (exit 1 if one is unreachable) and campaigns
for the leader lease. The leader loads every declared key once, reports ready on
/readyz, then refreshes each declaration every interval (TTL/2 by default), every
write fenced by its epoch; a standby stays idle and takes over when the leader
goes. SIGTERM or SIGINT drain in-flight writes within refresh.shutdown_timeout,
release the lease and exit 0. A second signal aborts at once.

SIGHUP, POST /admin/reload or a change to the config file reloads the config:
declarations are added, removed or rescheduled without a restart; an invalid file
is rejected (logged, hearth_config_reloads_total{result="invalid"}) and the old
config stays.
With HEARTH_ADMIN_TOKEN set, the admin API answers under /admin/ (docs/operations.md).`,
		Example: `  hearth run --config config.yaml
  HEARTH_REDIS_PASSWORD=secret hearth run -c /etc/hearth/config.yaml
  HEARTH_ADMIN_TOKEN=$(openssl rand -hex 32) hearth run --listen 127.0.0.1:9464
  hearth run -c config.yaml --pid-file /run/hearth.pid
  kill -HUP "$(cat /run/hearth.pid)"   # reload the config of this instance only`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			reload, stopReload := notifyReload()
			defer stopReload()
			if listen != "" {
				if err := checkListen(listen); err != nil {
					return fail(exitConfig, fmt.Errorf("--listen: %w", err))
				}
			}
			cfg, err := g.load()
			if err != nil {
				return err
			}
			if listen != "" {
				cfg.HTTP.Listen = listen
			}
			if pidFile != "" {
				if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
					return fail(exitFail, fmt.Errorf("--pid-file: %w", err))
				}
				defer func() { _ = os.Remove(pidFile) }()
			}
			d, err := daemon.New(cfg, daemon.Options{
				Logger: newLogger(g.stderr, cfg.Log), Version: version, Reload: reload, Abort: g.abort,
			})
			if err != nil {
				return fail(exitFail, err)
			}
			if err := d.Run(cmd.Context()); err != nil {
				return fail(exitFail, err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "override http.listen (host:port)")
	cmd.Flags().StringVar(&pidFile, "pid-file", "", "write the process id to this file (removed on exit), for kill -HUP \"$(cat FILE)\"")
	return cmd
}

// checkListen checks a host:port to listen on before anything connects, so
// that a typo is a usage error (exit 2), not a failure after connecting.
func checkListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("must be host:port (got %q)", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		return fmt.Errorf("port must be a number from 0 to 65535 (got %q in %q)", port, addr)
	}
	return nil
}
