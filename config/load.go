package config

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"
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
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			fromEnv(ce)
		}
		return nil, err
	}
	return cfg, nil
}

// fromEnv says which problems come from a HEARTH_… override rather than the
// file, since the file then shows a different value, or none: the variable
// wins over the file (viper's order).
func fromEnv(e *Error) {
	for i, p := range e.Problems {
		// redis.addrs[1] comes from HEARTH_REDIS_ADDRS; an item of sources
		// or keys cannot be overridden from the environment.
		path := listItem.ReplaceAllString(p.Path, "")
		if path == "" || p.Line > 0 || strings.ContainsAny(path, "[]") {
			continue
		}
		name := EnvVar(path)
		if v, ok := os.LookupEnv(name); ok && v != "" {
			e.Problems[i].Msg += " (from environment variable " + name + ")"
		}
	}
}

// EnvVar returns the environment variable that overrides a field:
// refresh.jitter is HEARTH_REFRESH_JITTER.
func EnvVar(path string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(path, ".", "_"))
}

func decode(name string, data []byte) (*Config, error) {
	v := viper.NewWithOptions(
		viper.ExperimentalBindStruct(),
		viper.EnvKeyReplacer(strings.NewReplacer(".", "_")),
	)
	v.SetEnvPrefix(EnvPrefix)
	v.AutomaticEnv()
	v.SetConfigType("yaml")
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &Error{File: name, Problems: []Problem{{Msg: "not valid YAML: " + firstLine(err.Error())}}}
	}
	if dups := duplicateKeys(&doc, "", nil); len(dups) > 0 {
		return nil, &Error{File: name, Problems: dups}
	}
	if err := v.ReadConfig(bytes.NewReader(data)); err != nil {
		return nil, &Error{File: name, Problems: []Problem{{Msg: "not valid YAML: " + firstLine(err.Error())}}}
	}
	cfg := Default()
	cfg.Sources, cfg.Keys = nil, nil
	var expandErrs []Problem
	hook := mapstructure.ComposeDecodeHookFunc(
		expandHook(&expandErrs),
		unitHook,
		numberHook,
		durationHook,
		mapstructure.StringToSliceHookFunc(","),
	)
	if err := v.UnmarshalExact(&cfg, viper.DecodeHook(hook)); err != nil {
		return nil, &Error{File: name, Problems: locate(&doc, decodeProblems(&doc, err))}
	}
	if len(expandErrs) > 0 {
		return nil, &Error{File: name, Problems: expandErrs}
	}
	cfg.File = name
	return &cfg, nil
}

// errNoUnit is the message of a duration written without a unit.
const errNoUnit = "a duration needs a unit"

// unitHook refuses a duration written as a bare number (1, 1.5, "1"): the
// decoder would read it as nanoseconds, so that interval: 1 meant 1 ns, while
// the same value from the environment failed to parse. Only 0 may stand
// bare: it is the same in every unit.
func unitHook(from, to reflect.Type, data any) (any, error) {
	if to != durationType {
		return data, nil
	}
	var x float64
	switch v := data.(type) {
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		x = reflect.ValueOf(v).Convert(reflect.TypeFor[float64]()).Float()
	case float32, float64:
		x = reflect.ValueOf(v).Float()
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return data, nil // a duration with a unit, or not a number at all
		}
		x = f
	default:
		return data, nil
	}
	if x == 0 {
		return time.Duration(0), nil
	}
	suggest := strconv.FormatFloat(x, 'g', -1, 64) + "s"
	if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
		suggest = "1s"
	}
	return nil, fmt.Errorf("%s, e.g. %q (got %v)", errNoUnit, suggest, data)
}

// durationHook parses a duration written with a unit, naming the value when
// it is not one: the decoder's own hook says only "unknown unit" or
// `invalid duration "`, without the value ("1s ", "0x10s", "1e3s"). A
// boolean is refused too (the decoder read true as 1ns).
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != durationType {
		return data, nil
	}
	switch v := data.(type) {
	case bool:
		return nil, fmt.Errorf("must be a duration with a unit, e.g. \"1s\" (got %v)", v)
	case string:
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("invalid duration %q (write it like 500ms, 30s or 5m)", v)
		}
		return d, nil
	}
	return data, nil
}

// numberHook refuses what the weakly typed decoder would otherwise turn into
// a different number without a word: a fraction in a whole-number field
// (batch_size: 1.5 was 1, max_concurrent_loads: 0.9 was 0 and then refused
// as "got 0"), and a boolean in any number field (true was 1). The same
// values from the environment were refused already, as strings.
func numberHook(from, to reflect.Type, data any) (any, error) {
	if to == durationType {
		return data, nil
	}
	switch to.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		switch v := data.(type) {
		case bool:
			return nil, fmt.Errorf("must be a whole number (got %v)", v)
		case float32, float64:
			x := reflect.ValueOf(v).Float()
			if x != math.Trunc(x) || math.IsInf(x, 0) || math.IsNaN(x) {
				return nil, fmt.Errorf("must be a whole number (got %v)", v)
			}
		}
	case reflect.Float32, reflect.Float64:
		if v, ok := data.(bool); ok {
			return nil, fmt.Errorf("must be a number (got %v)", v)
		}
	}
	return data, nil
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

var listItem = regexp.MustCompile(`\[[0-9]+\]$`)

// decodeProblems turns the decoder's errors into problems, one per failed
// field, from its typed errors (mapstructure.DecodeError names the field) rather
// than their text. A struct the file gives unknown keys is reported as
// unknown field(s), named from the file's own nodes (knownFields).
func decodeProblems(doc *yaml.Node, err error) []Problem {
	var out []Problem
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range e.Unwrap() {
				walk(x)
			}
			return
		case *mapstructure.DecodeError:
			if inner := errors.Unwrap(e); inner != nil {
				var de *mapstructure.DecodeError
				if errors.As(inner, &de) {
					walk(inner)
					return
				}
				if unknown := unknownFields(doc, e.Name()); len(unknown) > 0 {
					out = append(out, Problem{Path: e.Name(), Msg: "unknown field(s): " + strings.Join(unknown, ", ")})
					return
				}
				out = append(out, Problem{Path: e.Name(), Msg: strings.TrimPrefix(inner.Error(), "time: ")})
				return
			}
		}
		if inner := errors.Unwrap(err); inner != nil {
			walk(inner)
			return
		}
		out = append(out, Problem{Msg: err.Error()})
	}
	walk(err)
	if len(out) == 0 {
		out = append(out, Problem{Msg: err.Error()})
	}
	return out
}

// unknownFields names the keys the file gives the struct at path (a decoder
// path: keys[0].members_from) that the struct does not have, lower-cased as
// the decoder compares them and sorted; none when path is not a struct.
func unknownFields(doc *yaml.Node, path string) []string {
	t := reflect.TypeFor[Config]()
	n := doc
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = resolve(n.Content[0])
	}
	if path != "" {
		for _, seg := range strings.Split(path, ".") {
			m := pathSegment.FindStringSubmatch(seg)
			if m == nil {
				return nil
			}
			f, ok := fieldOf(t, m[1])
			if !ok {
				return nil
			}
			t = f
			_, n = lookup(resolve(n), m[1])
			n = resolve(n)
			if m[2] != "" {
				idx, _ := strconv.Atoi(m[2])
				if n == nil || t.Kind() != reflect.Slice {
					return nil
				}
				switch {
				case n.Kind == yaml.SequenceNode && idx < len(n.Content):
					n = resolve(n.Content[idx])
				case n.Kind != yaml.SequenceNode && idx == 0:
					// The decoder reads a lone value as a list of one.
				default:
					return nil
				}
				t = t.Elem()
			}
			for t.Kind() == reflect.Pointer {
				t = t.Elem()
			}
		}
	}
	if n == nil || n.Kind != yaml.MappingNode || t.Kind() != reflect.Struct {
		return nil
	}
	var out []string
	var keys func(n *yaml.Node)
	keys = func(n *yaml.Node) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], resolve(n.Content[i+1])
			if k.Kind != yaml.ScalarNode {
				continue
			}
			if k.Tag == "!!merge" {
				// <<: *base, or <<: [*a, *b]: their keys are this mapping's.
				for _, m := range append([]*yaml.Node{v}, v.Content...) {
					if m = resolve(m); m.Kind == yaml.MappingNode {
						keys(m)
					}
				}
				continue
			}
			// A dotted key is a path to the decoder: only its first part is
			// this struct's.
			name, _, _ := strings.Cut(k.Value, ".")
			if _, ok := fieldOf(t, name); !ok {
				out = append(out, strings.ToLower(name))
			}
		}
	}
	keys(n)
	sort.Strings(out)
	return slices.Compact(out)
}

// resolve follows an alias to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// fieldOf finds the field a key decodes into, ignoring case and looking
// through squashed structs, as the decoder does.
func fieldOf(t reflect.Type, key string) (reflect.Type, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil, false
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
		switch {
		case !f.IsExported() || name == "-":
		case opts == "squash":
			if ft, ok := fieldOf(f.Type, key); ok {
				return ft, true
			}
		case strings.EqualFold(name, key) || (name == "" && strings.EqualFold(f.Name, key)):
			return f.Type, true
		}
	}
	return nil, false
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// duplicateKeys finds the mapping keys written twice, which the decoder would
// report without a line ("yaml: unmarshal errors:"), or, for two spellings of
// one key (ttl, TTL), silently resolve. Keys compare as viper does, ignoring
// case; merge keys (<<) and aliases are left to the decoder.
func duplicateKeys(n *yaml.Node, path string, out []Problem) []Problem {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			out = duplicateKeys(c, path, out)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			out = duplicateKeys(c, nodeItemPath(path, i, c), out)
		}
	case yaml.MappingNode:
		first := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
				continue
			}
			name := strings.ToLower(k.Value)
			if line, dup := first[name]; dup {
				out = append(out, Problem{Line: k.Line, Path: path, Msg: fmt.Sprintf("duplicate key %q (first at line %d)", k.Value, line)})
				continue
			}
			first[name] = k.Line
			sub := name
			if path != "" {
				sub = path + "." + name
			}
			out = duplicateKeys(v, sub, out)
		}
	}
	return out
}

// nodeItemPath is itemPath of a list item's name field in the file, if it has one.
func nodeItemPath(path string, i int, n *yaml.Node) string {
	if n.Kind == yaml.MappingNode {
		for j := 0; j+1 < len(n.Content); j += 2 {
			if k, v := n.Content[j], n.Content[j+1]; k.Value == "name" && v.Kind == yaml.ScalarNode && nameRe.MatchString(v.Value) {
				return itemPath(path, i, v.Value)
			}
		}
	}
	return itemPath(path, i, "")
}

var pathSegment = regexp.MustCompile(`^([^\[]+)(?:\[([0-9]+)\])?$`)

// locate names the list items of the decoder's paths as validation does
// (keys[0].ttl becomes keys[p].ttl) and adds the line of the value in the
// file, when the file holds it and no HEARTH_… variable overrides it.
func locate(doc *yaml.Node, ps []Problem) []Problem {
	for i, p := range ps {
		if p.Path == "" || doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
			continue
		}
		n := doc.Content[0]
		var named []string
		line := 0
		for _, seg := range strings.Split(p.Path, ".") {
			m := pathSegment.FindStringSubmatch(seg)
			if m == nil || n == nil {
				named, n = nil, nil
				break
			}
			var key *yaml.Node
			key, n = lookup(n, m[1])
			if key != nil {
				line = key.Line
			}
			name := m[1]
			if m[2] != "" && n != nil && n.Kind == yaml.SequenceNode {
				idx, _ := strconv.Atoi(m[2])
				if idx < len(n.Content) {
					name = nodeItemPath(name, idx, n.Content[idx])
					n = n.Content[idx]
					line = n.Line
				} else {
					n = nil
				}
			} else if m[2] != "" {
				name += "[" + m[2] + "]"
			}
			named = append(named, name)
		}
		if n == nil {
			continue
		}
		ps[i].Path = strings.Join(named, ".")
		if v, ok := os.LookupEnv(EnvVar(p.Path)); !ok || v == "" {
			ps[i].Line = line
		}
	}
	return ps
}

// lookup finds a mapping's key, ignoring case as viper does.
func lookup(n *yaml.Node, name string) (key, value *yaml.Node) {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil, nil
	}
	for j := 0; j+1 < len(n.Content); j += 2 {
		if strings.EqualFold(n.Content[j].Value, name) {
			return n.Content[j], n.Content[j+1]
		}
	}
	return nil, nil
}

// envOthers are the HEARTH_… variables that set no config field on purpose:
// the admin API's token, and what the tests and benchmarks read.
var envOthers = []string{"HEARTH_ADMIN_TOKEN", "HEARTH_TEST_", "HEARTH_BENCH_", "HEARTH_BIN", "HEARTH_PROPERTY_SEED", "HEARTH_UPDATE_DOCS"}

// envFields is every HEARTH_… variable that overrides a field: each field
// outside the lists sources and keys (whose items cannot be overridden).
var envFields = func() map[string]bool {
	m := map[string]bool{}
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		if t.Kind() == reflect.Struct && t != durationType {
			for i := range t.NumField() {
				f := t.Field(i)
				name, opts, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
				switch {
				case !f.IsExported() || name == "-":
				case opts == "squash":
					walk(f.Type, path)
				default:
					walk(f.Type, join(path, name))
				}
			}
			return
		}
		if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct {
			return // sources, keys: not from the environment
		}
		m[EnvVar(path)] = true
	}
	walk(reflect.TypeFor[Config](), "")
	return m
}()

// envWarnings names the HEARTH_… variables set in the environment that
// override nothing: a typo (HEARTH_REFRESH_BATCHSIZE) or an item of a list
// (HEARTH_KEYS_0_TTL) was ignored without a word, the file's value kept.
func envWarnings() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix+"_") || envFields[name] {
			continue
		}
		other := false
		for _, o := range envOthers {
			other = other || name == o || (strings.HasSuffix(o, "_") && strings.HasPrefix(name, o))
		}
		if !other {
			out = append(out, fmt.Sprintf("environment variable %s overrides no field and is ignored (a list item, such as keys[0].ttl, cannot be set from the environment; names are the field's path in upper case, e.g. HEARTH_REFRESH_BATCH_SIZE)", name))
		}
	}
	sort.Strings(out)
	return out
}
