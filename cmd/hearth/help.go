package main

import (
	"github.com/spf13/cobra"
)

// rootExample shows the whole tool at a glance in `hearth --help`.
const rootExample = `  hearth demo                                  # a stampede, then Hearth preventing it
  hearth validate -c config.yaml               # check a config, exit 2 if invalid
  hearth run -c config.yaml                    # the daemon
  kill -HUP $(pidof hearth)                    # reload the config without a restart
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
	_ = root.MarkPersistentFlagFilename("config", "yaml", "yml")
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() != "completion" {
			continue
		}
		c.Example = `  hearth completion bash > /etc/bash_completion.d/hearth
  hearth completion zsh > "${fpath[1]}/_hearth"
  hearth completion fish > ~/.config/fish/completions/hearth.fish`
		for _, sh := range c.Commands() {
			sh.Example = completionExamples[sh.Name()]
		}
	}
}
