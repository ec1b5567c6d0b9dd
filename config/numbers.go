package config

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"time"
)

// MaxDuration bounds every duration in the config (a year). Hearth multiplies
// and adds durations (ttl × (1 + jitter/2), interval + load_timeout, three rank
// intervals, now − retention); below this bound none of them can overflow
// int64 nanoseconds (292 years) or Redis's PX milliseconds, so a jittered TTL
// never wraps round to a negative or a 1 ms expiry.
const MaxDuration = 365 * 24 * time.Hour

var durationType = reflect.TypeFor[time.Duration]()

// checkNumbers walks the whole config, so that a field added later is covered
// too: every float must be finite (NaN compares false both ways and would slip
// through every range check; +Inf overflows whatever it multiplies), and every
// duration must be at most MaxDuration. A field flagged here gets no second
// problem from its own range check.
func (cfg *Config) checkNumbers(c *checker) {
	walkNumbers(c, "", reflect.ValueOf(*cfg))
}

func walkNumbers(c *checker, path string, v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			walkNumbers(c, path, v.Elem())
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
			switch {
			case name == "-":
				continue
			case opts == "squash":
				walkNumbers(c, path, v.Field(i))
				continue
			case name == "":
				name = strings.ToLower(f.Name)
			}
			if path != "" {
				name = path + "." + name
			}
			walkNumbers(c, name, v.Field(i))
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			walkNumbers(c, itemPath(path, i, v.Index(i)), v.Index(i))
		}
	case reflect.Float32, reflect.Float64:
		if x := v.Float(); math.IsNaN(x) || math.IsInf(x, 0) {
			c.flag(path, "must be a finite number (got %g)", x)
		}
	case reflect.Int64:
		if v.Type() == durationType {
			if d := time.Duration(v.Int()); d > MaxDuration {
				c.flag(path, "must be at most %s, a year (got %s)", MaxDuration, d)
			}
		}
	}
}

// itemPath names a list item as the rest of the validation does: by its name
// when it has a valid one (sources[db], keys[product]), else by its index.
func itemPath(path string, i int, v reflect.Value) string {
	if v.Kind() == reflect.Struct {
		if f := v.FieldByName("Name"); f.IsValid() && f.Kind() == reflect.String && nameRe.MatchString(f.String()) {
			return fmt.Sprintf("%s[%s]", path, f.String())
		}
	}
	return fmt.Sprintf("%s[%d]", path, i)
}
