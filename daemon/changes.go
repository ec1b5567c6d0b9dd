package daemon

import "github.com/hearth-dev/hearth/config"

// changeDSNs maps each postgres source's name to its DSN, for the change
// listeners (package changes).
func changeDSNs(cfg *config.Config) map[string]string {
	out := map[string]string{}
	for _, s := range cfg.Sources {
		if s.Type == "postgres" {
			out[s.Name] = s.DSN
		}
	}
	return out
}
