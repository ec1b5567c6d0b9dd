package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// rootExample shows the whole tool at a glance in `hearth --help`.
const rootExample = `  hearth demo                                  # a stampede, then Hearth preventing it
  hearth validate -c config.yaml               # check a config, exit 2 if invalid
  hearth run -c config.yaml                    # the daemon
  hearth run -c config.yaml --pid-file hearth.pid
  kill -HUP "$(cat hearth.pid)"                # reload the config without a restart
  hearth healthcheck --url http://127.0.0.1:9464/healthz   # exit 0 healthy, 1 not
  source <(hearth completion bash)             # shell completion (bash, zsh, fish, powershell)`

// completionExamples are shown by `hearth completion SHELL --help`, next to
// cobra's own instructions.
var completionExamples = map[string]string{
	"bash": `  source <(hearth completion bash)                          # this shell only
  hearth completion bash > /etc/bash_completion.d/hearth     # every new shell (Linux)`,
	"zsh": `  source <(hearth completion zsh)                           # this shell only
  hearth completion zsh > "${fpath[1]}/_hearth"              # every new shell`,
	"fish": `  hearth completion fish | source                           # this shell only
  hearth completion fish > ~/.config/fish/completions/hearth.fish`,
	"powershell": `  hearth completion powershell | Out-String | Invoke-Expression`,
}

// polishHelp adds the completion command (cobra's) with examples, and the
// completions of the global flags.
func polishHelp(root *cobra.Command) {
	root.Example = rootExample
	root.SetHelpCommand(&cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Long:  "Help provides help for any command in the application.\nSimply type hearth help [path to command] for full details.",
		RunE: func(c *cobra.Command, args []string) error {
			cmd, _, err := c.Root().Find(args)
			if cmd == nil || err != nil || (len(args) > 0 && cmd == c.Root()) {
				return fail(exitConfig, fmt.Errorf("help: unknown command %q", strings.Join(args, " ")))
			}
			cmd.InitDefaultHelpFlag()
			return cmd.Help()
		},
	})
	_ = root.MarkPersistentFlagFilename("config", "yaml", "yml")
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() != "completion" {
			continue
		}
		// Runnable, so that an unknown shell is a usage error (exit 2)
		// rather than cobra's help and exit 0.
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fail(exitConfig, fmt.Errorf("completion: unknown shell %q (want bash, zsh, fish or powershell)", args[0]))
			}
			return cmd.Help()
		}
		c.Example = `  hearth completion bash > /etc/bash_completion.d/hearth
  hearth completion zsh > "${fpath[1]}/_hearth"
  hearth completion fish > ~/.config/fish/completions/hearth.fish`
		for _, sh := range c.Commands() {
			sh.Example = completionExamples[sh.Name()]
		}
	}
}
