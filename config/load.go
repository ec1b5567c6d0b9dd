package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"
)

// EnvPrefix prefixes environment overrides: HEARTH_REDIS_PASSWORD sets redis.password.
const EnvPrefix = "HEARTH"

// Load reads, expands, decodes and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{File: path, Problems: []Problem{{Msg: fmt.Sprintf("cannot read: %v", errors.Unwrap(err))}}}
	}
	return Parse(path, data)
}

// Parse decodes and validates a config held in memory; name labels errors.
func Parse(name string, data []byte) (*Config, error) {
	cfg, err := decode(name, data)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

func decode(name string, data []byte) (*Config, error) {
	v := viper.NewWithOptions(
		viper.ExperimentalBindStruct(),
		viper.EnvKeyReplacer(strings.NewReplacer(".", "_")),
	)
	v.SetEnvPrefix(EnvPrefix)
	v.AutomaticEnv()
	v.SetConfigType("yaml")
	if err := v.ReadConfig(bytes.NewReader(data)); err != nil {
		return nil, &Error{File: name, Problems: []Problem{{Msg: "not valid YAML: " + firstLine(err.Error())}}}
	}
	cfg := Default()
	cfg.Sources, cfg.Keys = nil, nil
	var expandErrs []Problem
	hook := mapstructure.ComposeDecodeHookFunc(
		expandHook(&expandErrs),
		mapstructure.StringToTimeDurationHookFunc(),
		mapstructure.StringToSliceHookFunc(","),
	)
	if err := v.UnmarshalExact(&cfg, viper.DecodeHook(hook)); err != nil {
		return nil, &Error{File: name, Problems: decodeProblems(err)}
	}
	if len(expandErrs) > 0 {
		return nil, &Error{File: name, Problems: expandErrs}
	}
	cfg.File = name
	return &cfg, nil
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}`)

// expandHook replaces ${VAR} and ${VAR:-default} in string values. Only the braced
// form is expanded, so SQL placeholders such as $1 pass through untouched, and
// expansion happens after YAML parsing, so a value cannot inject structure.
func expandHook(problems *[]Problem) mapstructure.DecodeHookFuncType {
	return func(from, to reflect.Type, data any) (any, error) {
		s, ok := data.(string)
		if !ok || !strings.Contains(s, "${") {
			return data, nil
		}
		return envRef.ReplaceAllStringFunc(s, func(ref string) string {
			m := envRef.FindStringSubmatch(ref)
			if val, ok := os.LookupEnv(m[1]); ok {
				return val
			}
			if m[2] != "" {
				return m[3]
			}
			*problems = append(*problems, Problem{Msg: fmt.Sprintf("environment variable %s is not set (referenced as ${%s})", m[1], m[1])})
			return ""
		}), nil
	}
}

var (
	invalidKeys = regexp.MustCompile(`'([^']*)' has invalid keys: (.*)`)
	fieldErr    = regexp.MustCompile(`^'([^']*)' (.*)$`)
)

func decodeProblems(err error) []Problem {
	var out []Problem
	for _, line := range strings.Split(err.Error(), "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "*"))
		if line == "" || strings.HasPrefix(line, "decoding failed due to") || strings.HasSuffix(line, "error(s) decoding:") {
			continue
		}
		if m := invalidKeys.FindStringSubmatch(line); m != nil {
			out = append(out, Problem{Path: m[1], Msg: "unknown field(s): " + m[2]})
			continue
		}
		if m := fieldErr.FindStringSubmatch(line); m != nil {
			msg := strings.TrimPrefix(m[2], "time: ")
			if msg == "invalid duration" {
				msg = "invalid duration (write it like 500ms, 30s or 5m)"
			}
			out = append(out, Problem{Path: m[1], Msg: msg})
			continue
		}
		out = append(out, Problem{Msg: line})
	}
	if len(out) == 0 {
		out = append(out, Problem{Msg: err.Error()})
	}
	return out
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
