package keytmpl

import (
	"regexp/syntax"
	"unicode"
)

// memberClass is a param_pattern of the common shape "one ASCII character
// class, repeated": [0-9]{1,12}, [a-z0-9_-]+, [A-F0-9]{32}. Such a pattern is
// matched with a table lookup per byte instead of running the regexp, which is
// most of what classifying an access-log key costs. Any other pattern is left
// to the regexp.
type memberClass struct {
	in       [128]bool // the class: which ASCII bytes it holds
	min, max int       // repeats; max < 0: no bound
}

// match reports whether m is min to max bytes, each in the class. The class
// holds ASCII only, so a non-ASCII byte (any part of a multi-byte rune) is
// never in it, and runes and bytes count alike.
func (c *memberClass) match(m string) bool {
	if len(m) < c.min || c.max >= 0 && len(m) > c.max {
		return false
	}
	for i := 0; i < len(m); i++ {
		if b := m[i]; b >= 0x80 || !c.in[b] {
			return false
		}
	}
	return true
}

// compileMemberClass returns the table form of expr, the anchored pattern as
// regexp.Compile takes it, or nil when expr is not one ASCII class repeated.
func compileMemberClass(expr string) *memberClass {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return nil
	}
	re = unwrap(re)
	if re.Op != syntax.OpConcat || len(re.Sub) != 3 ||
		re.Sub[0].Op != syntax.OpBeginText || re.Sub[2].Op != syntax.OpEndText {
		return nil
	}
	body := unwrap(re.Sub[1])
	// Anchored at both ends, a repeat matches exactly the strings of min to
	// max characters of its class, greedy or not.
	c := &memberClass{min: 1, max: 1}
	switch body.Op {
	case syntax.OpRepeat:
		c.min, c.max = body.Min, body.Max
	case syntax.OpPlus:
		c.min, c.max = 1, -1
	case syntax.OpStar:
		c.min, c.max = 0, -1
	case syntax.OpQuest:
		c.min, c.max = 0, 1
	}
	switch body.Op {
	case syntax.OpRepeat, syntax.OpPlus, syntax.OpStar, syntax.OpQuest:
		if len(body.Sub) != 1 {
			return nil
		}
		body = unwrap(body.Sub[0])
	}
	var ranges []rune
	switch body.Op {
	case syntax.OpCharClass:
		ranges = body.Rune
	case syntax.OpLiteral:
		if len(body.Rune) != 1 || body.Flags&syntax.FoldCase != 0 {
			return nil
		}
		ranges = []rune{body.Rune[0], body.Rune[0]}
	default:
		return nil
	}
	for i := 0; i+1 < len(ranges); i += 2 {
		lo, hi := ranges[i], ranges[i+1]
		if lo < 0 || hi > unicode.MaxASCII || lo > hi {
			return nil
		}
		for r := lo; r <= hi; r++ {
			c.in[r] = true
		}
	}
	return c
}

// unwrap strips capture groups, which do not change what matches.
func unwrap(re *syntax.Regexp) *syntax.Regexp {
	for re.Op == syntax.OpCapture && len(re.Sub) == 1 {
		re = re.Sub[0]
	}
	return re
}
