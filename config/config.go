// Package config owns Hearth's configuration file: its typed form, the defaults,
// loading through viper (with ${VAR} expansion and HEARTH_… overrides) and the
// validation that turns every mistake into an error naming the field.
package config

import (
	"time"

	"github.com/hearth-dev/hearth/warmer"
)

// Config is the whole configuration file.
type Config struct {
	Redis   Redis    `mapstructure:"redis"`
	HTTP    HTTP     `mapstructure:"http"`
	Log     Log      `mapstructure:"log"`
	Refresh Refresh  `mapstructure:"refresh"`
	Leader  Leader   `mapstructure:"leader"`
	Sources []Source `mapstructure:"sources"`
	Keys    []Key    `mapstructure:"keys"`

	AccessLog AccessLog `mapstructure:"access_log"`
	Prewarm   Prewarm   `mapstructure:"prewarm"`

	// File is the path the config was read from (empty for an embedded one).
	File string `mapstructure:"-"`

	// specs and lease are what Validate built from the fields above, once:
	// the declarations and the resolved lease timing (nil and zero until a
	// Validate passed).
	specs []*warmer.Spec
	lease LeaseTiming
}

// Redis is the connection to the Redis that Hearth keeps warm.
type Redis struct {
	// Addrs: one address for a single node, several for a cluster, or the
	// sentinels when MasterName is set.
	Addrs        []string      `mapstructure:"addrs"`
	Username     string        `mapstructure:"username"`
	Password     string        `mapstructure:"password"`
	DB           int           `mapstructure:"db"`
	MasterName   string        `mapstructure:"master_name"`
	TLS          bool          `mapstructure:"tls"`
	PoolSize     int           `mapstructure:"pool_size"`
	DialTimeout  time.Duration `mapstructure:"dial_timeout"`
	ReadTimeout  time.Duration `mapstructure:"read_timeout"`
	WriteTimeout time.Duration `mapstructure:"write_timeout"`
	// Namespace prefixes Hearth's own keys (lease, epochs, markers), never the
	// application's.
	Namespace string `mapstructure:"namespace"`
}

// HTTP is Hearth's own listener: metrics, health and admin.
type HTTP struct {
	Listen string `mapstructure:"listen"`
	// ProbeListen, when set, is a second address that serves only /healthz
	// and /readyz, with an accept queue of its own: point the probes there.
	ProbeListen string `mapstructure:"probe_listen"`
	// Pprof serves Go's runtime profiles under /debug/pprof/ on the same
	// listener. Off by default: a profile is only for whoever can reach it.
	Pprof bool `mapstructure:"pprof"`
}

// Log configures zerolog.
type Log struct {
	// Level: debug, info, warn, error.
	Level string `mapstructure:"level"`
	// Format: auto (console on a terminal, JSON otherwise), json, console.
	Format string `mapstructure:"format"`
}

// Refresh holds the engine-wide bounds and the defaults keys inherit.
type Refresh struct {
	MaxConcurrentLoads int `mapstructure:"max_concurrent_loads"`
	// MaxInflightBytes bounds the payload bytes all loads hold at once.
	MaxInflightBytes int64         `mapstructure:"max_inflight_bytes"`
	BatchSize        int           `mapstructure:"batch_size"`
	LoadTimeout      time.Duration `mapstructure:"load_timeout"`
	// Spread is the fraction of a family's interval its batches are paced over.
	Spread float64 `mapstructure:"spread"`
	// ShutdownTimeout bounds the drain of in-flight writes on SIGTERM.
	ShutdownTimeout time.Duration `mapstructure:"shutdown_timeout"`
	Jitter          float64       `mapstructure:"jitter"`
	NegativeTTL     time.Duration `mapstructure:"negative_ttl"`
	MaxStale        time.Duration `mapstructure:"max_stale"`
	MaxValueBytes   int           `mapstructure:"max_value_bytes"`
	MaxMembers      int           `mapstructure:"max_members"`
}

// Source is a named origin.
type Source struct {
	Name string `mapstructure:"name"`
	// Type: postgres or http.
	Type string `mapstructure:"type"`

	// postgres
	DSN              string        `mapstructure:"dsn"`
	MaxConns         int           `mapstructure:"max_conns"`
	StatementTimeout time.Duration `mapstructure:"statement_timeout"`

	// http
	BaseURL      string            `mapstructure:"base_url"`
	Headers      map[string]string `mapstructure:"headers"`
	Timeout      time.Duration     `mapstructure:"timeout"`
	Concurrency  int               `mapstructure:"concurrency"`
	MaxBodyBytes int64             `mapstructure:"max_body_bytes"`
	HealthPath   string            `mapstructure:"health_path"`
	// Redirects: same-host (default: same scheme, host and port), none, or any
	// (configured headers are still never sent to another host).
	Redirects string `mapstructure:"redirects"`

	// Origin protection, both types (see Protection for the defaults).
	Protection `mapstructure:",squash"`
}

// Key is one declaration: a single key or a family.
type Key struct {
	Name   string `mapstructure:"name"`
	Key    string `mapstructure:"key"`
	Source string `mapstructure:"source"`

	TTL         time.Duration `mapstructure:"ttl"`
	Interval    time.Duration `mapstructure:"interval"`
	LoadTimeout time.Duration `mapstructure:"load_timeout"`
	Jitter      *float64      `mapstructure:"jitter"`

	Members      []string `mapstructure:"members"`
	MembersQuery string   `mapstructure:"members_query"`
	MaxMembers   int      `mapstructure:"max_members"`
	BatchSize    int      `mapstructure:"batch_size"`
	ParamPattern string   `mapstructure:"param_pattern"`
	MaxParamLen  int      `mapstructure:"max_param_len"`

	Query       string `mapstructure:"query"`
	Path        string `mapstructure:"path"`
	JSONPointer string `mapstructure:"json_pointer"`

	NegativeTTL   time.Duration  `mapstructure:"negative_ttl"`
	NegativeValue *string        `mapstructure:"negative_value"`
	MaxStale      *time.Duration `mapstructure:"max_stale"`
	MaxValueBytes int            `mapstructure:"max_value_bytes"`

	// MembersFrom adds members taken from traffic (see config/hotset.go).
	MembersFrom *MembersFrom `mapstructure:"members_from"`
	// VersionColumn names the query's last column, the row's version (see
	// docs/freshness.md); a postgres source only.
	VersionColumn string `mapstructure:"version_column"`
	// Notify subscribes the declaration to change notifications.
	Notify *Notify `mapstructure:"notify"`
}

// Default returns the configuration every file starts from.
func Default() Config {
	return Config{
		Redis: Redis{
			Addrs:        []string{"127.0.0.1:6379"},
			DialTimeout:  2 * time.Second,
			ReadTimeout:  2 * time.Second,
			WriteTimeout: 2 * time.Second,
			Namespace:    "hearth",
		},
		HTTP: HTTP{Listen: "127.0.0.1:9464"},
		Log:  Log{Level: "info", Format: "auto"},
		Refresh: Refresh{
			MaxConcurrentLoads: 8,
			MaxInflightBytes:   64 << 20,
			BatchSize:          500,
			LoadTimeout:        5 * time.Second,
			Spread:             0.5,
			ShutdownTimeout:    10 * time.Second,
			Jitter:             0.2,
			NegativeTTL:        10 * time.Second,
			MaxStale:           10 * time.Minute,
			MaxValueBytes:      1 << 20,
			MaxMembers:         1_000_000,
		},
		Leader:    Leader{Enabled: true, FailoverGrace: DefaultFailoverGrace},
		AccessLog: defaultAccessLog(),
		Prewarm:   defaultPrewarm(),
	}
}
