package main

import (
	"github.com/spf13/cobra"

	"github.com/hearth-dev/hearth/daemon"
)

func newRunCmd(g *globals) *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon: load every declared key, then keep it warm",
		Long: `Run connects to Redis and every source (exit 1 if one is unreachable) and campaigns
for the leader lease. The leader loads every declared key once, reports ready on
/readyz, then refreshes each declaration every interval (TTL/2 by default), every
write fenced by its epoch; a standby stays idle and takes over when the leader
goes. SIGTERM or SIGINT drain in-flight writes within refresh.shutdown_timeout,
release the lease and exit 0. A second signal aborts at once.

SIGHUP, or a change to the config file, reloads the config: declarations are
added, removed or rescheduled without a restart; an invalid file is rejected
(logged, hearth_config_reloads_total{result="invalid"}) and the old config stays.
With HEARTH_ADMIN_TOKEN set, the admin API answers under /admin/ (see README).`,
		Example: `  hearth run --config config.yaml
  HEARTH_REDIS_PASSWORD=secret hearth run -c /etc/hearth/config.yaml
  HEARTH_ADMIN_TOKEN=$(openssl rand -hex 32) hearth run --listen 127.0.0.1:9464
  kill -HUP $(pidof hearth)   # reload the config`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			if listen != "" {
				cfg.HTTP.Listen = listen
			}
			d, err := daemon.New(cfg, daemon.Options{Logger: newLogger(g.stderr, cfg.Log), Version: version})
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
	return cmd
}
