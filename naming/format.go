package naming

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Kind is the Python type a template variable has when Composer formats it.
type Kind int

const (
	// KindString is a Python str (run_name).
	KindString Kind = iota
	// KindInt is a Python int (rank, batch, window, ...).
	KindInt
	// KindFloat is a Python float (the wall-clock variables, in seconds).
	KindFloat
)

func (k Kind) String() string {
	switch k {
	case KindString:
		return "str"
	case KindInt:
		return "int"
	default:
		return "float"
	}
}

// spec is a parsed Python format specification
// ([[fill]align][sign][z][#][0][width][grouping][.precision][type]).
type spec struct {
	fill      rune
	align     byte // 0, '<', '>', '=', '^'
	sign      byte // 0, '+', '-', ' '
	zeroCoerc bool // 'z'
	alt       bool // '#'
	width     int
	grouping  byte // 0, ',', '_'
	precision int  // -1 when absent
	typ       byte // 0 when absent
}

const maxWidth = 1024 // an object key is at most 1024 bytes, so is any field

// parseSpec parses spec text and checks it against the kind of value it formats,
// with the errors Python's str.format would raise.
func parseSpec(s string, k Kind) (spec, error) {
	sp := spec{fill: ' ', precision: -1}
	i := 0
	isAlign := func(b byte) bool { return b == '<' || b == '>' || b == '=' || b == '^' }
	if r, n := utf8.DecodeRuneInString(s); n > 0 && n < len(s) && isAlign(s[n]) {
		sp.fill, sp.align = r, s[n]
		i = n + 1
	} else if len(s) > 0 && isAlign(s[0]) {
		sp.align = s[0]
		i = 1
	}
	if i < len(s) && (s[i] == '+' || s[i] == '-' || s[i] == ' ') {
		sp.sign = s[i]
		i++
	}
	if i < len(s) && s[i] == 'z' {
		sp.zeroCoerc = true
		i++
	}
	if i < len(s) && s[i] == '#' {
		sp.alt = true
		i++
	}
	if i < len(s) && s[i] == '0' {
		if sp.align == 0 {
			sp.fill, sp.align = '0', '='
			if k == KindString {
				sp.align = '<'
			}
		}
		i++
	}
	start := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i > start {
		w, err := strconv.Atoi(s[start:i])
		if err != nil || w > maxWidth {
			return sp, fmt.Errorf("width %q is too large (at most %d)", s[start:i], maxWidth)
		}
		sp.width = w
	}
	if i < len(s) && (s[i] == ',' || s[i] == '_') {
		sp.grouping = s[i]
		i++
	}
	if i < len(s) && s[i] == '.' {
		i++
		start = i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == start {
			return sp, fmt.Errorf("format specifier missing precision")
		}
		p, err := strconv.Atoi(s[start:i])
		if err != nil || p > maxWidth {
			return sp, fmt.Errorf("precision %q is too large (at most %d)", s[start:i], maxWidth)
		}
		sp.precision = p
	}
	if i < len(s) {
		sp.typ = s[i]
		i++
	}
	if i < len(s) {
		return sp, fmt.Errorf("invalid format specifier %q", s)
	}
	return sp, sp.check(k)
}

func (sp spec) check(k Kind) error {
	switch k {
	case KindString:
		switch {
		case sp.typ != 0 && sp.typ != 's':
			return fmt.Errorf("unknown format code '%c' for object of type 'str'", sp.typ)
		case sp.align == '=':
			return fmt.Errorf("'=' alignment not allowed in string format specifier")
		case sp.sign != 0:
			return fmt.Errorf("sign not allowed in string format specifier")
		case sp.zeroCoerc:
			return fmt.Errorf("negative zero coercion (z) not allowed in string format specifier")
		case sp.alt:
			return fmt.Errorf("alternate form (#) not allowed in string format specifier")
		case sp.grouping != 0:
			return fmt.Errorf("cannot specify '%c' with 's'", sp.grouping)
		}
	case KindInt:
		switch sp.typ {
		case 0, 'd', 'n', 'b', 'o', 'x', 'X':
			if sp.precision >= 0 {
				return fmt.Errorf("precision not allowed in integer format specifier")
			}
			if sp.zeroCoerc {
				return fmt.Errorf("negative zero coercion (z) not allowed in integer format specifier")
			}
			if sp.grouping == ',' && sp.typ != 0 && sp.typ != 'd' {
				return fmt.Errorf("cannot specify ',' with '%c'", sp.typ)
			}
			if sp.grouping != 0 && sp.typ == 'n' {
				return fmt.Errorf("cannot specify '%c' with 'n'", sp.grouping)
			}
		case 'e', 'E', 'f', 'F', 'g', 'G', '%':
			return sp.check(KindFloat)
		case 'c':
			return fmt.Errorf("format code 'c' is not supported in names")
		default:
			return fmt.Errorf("unknown format code '%c' for object of type 'int'", sp.typ)
		}
	case KindFloat:
		switch sp.typ {
		case 0, 'e', 'E', 'f', 'F', 'g', 'G', 'n', '%':
			if sp.grouping != 0 && sp.typ == 'n' {
				return fmt.Errorf("cannot specify '%c' with 'n'", sp.grouping)
			}
			if sp.grouping == '_' || sp.grouping == ',' {
				// allowed for all other float types
			}
		default:
			return fmt.Errorf("unknown format code '%c' for object of type 'float'", sp.typ)
		}
	}
	return nil
}

// formatString applies sp to a str value as Python does.
func (sp spec) formatString(v string) string {
	if sp.precision >= 0 && utf8.RuneCountInString(v) > sp.precision {
		n := 0
		for i := range v {
			if n == sp.precision {
				v = v[:i]
				break
			}
			n++
		}
	}
	align := sp.align
	if align == 0 {
		align = '<'
	}
	return sp.pad("", v, align)
}

// formatInt applies sp to an int value as Python does.
func (sp spec) formatInt(v int64) string {
	switch sp.typ {
	case 'e', 'E', 'f', 'F', 'g', 'G', '%':
		return sp.formatFloat(float64(v))
	}
	neg := v < 0
	u := uint64(v)
	if neg {
		u = uint64(-v) // two's complement gives the magnitude, MinInt64 included
	}
	var digits, prefix string
	group := 3
	switch sp.typ {
	case 'b':
		digits, prefix, group = strconv.FormatUint(u, 2), "0b", 4
	case 'o':
		digits, prefix, group = strconv.FormatUint(u, 8), "0o", 4
	case 'x':
		digits, prefix, group = strconv.FormatUint(u, 16), "0x", 4
	case 'X':
		digits, prefix, group = strings.ToUpper(strconv.FormatUint(u, 16)), "0X", 4
	default:
		digits = strconv.FormatUint(u, 10)
	}
	if !sp.alt {
		prefix = ""
	}
	return sp.number(neg, prefix, digits, "", group)
}

// formatFloat applies sp to a float value as Python does.
func (sp spec) formatFloat(f float64) string {
	neg := math.Signbit(f)
	if math.IsNaN(f) {
		neg = false
	}
	a := math.Abs(f)
	var body string
	suffix := ""
	upper := sp.typ == 'E' || sp.typ == 'F' || sp.typ == 'G'
	switch {
	case math.IsInf(a, 0) || math.IsNaN(a):
		body = "inf"
		if math.IsNaN(a) {
			body = "nan"
		}
		if sp.typ == '%' {
			suffix = "%"
		}
	default:
		p := sp.precision
		switch sp.typ {
		case 'e', 'E':
			if p < 0 {
				p = 6
			}
			body = pyExp(a, p, sp.alt)
		case 'f', 'F':
			if p < 0 {
				p = 6
			}
			body = strconv.FormatFloat(a, 'f', p, 64)
			if sp.alt && p == 0 {
				body += "."
			}
		case '%':
			if p < 0 {
				p = 6
			}
			body = strconv.FormatFloat(a*100, 'f', p, 64)
			if sp.alt && p == 0 {
				body += "."
			}
			suffix = "%"
		case 'g', 'G', 'n':
			if p < 0 {
				p = 6
			}
			body = pyGeneral(a, p, sp.alt, false)
		default: // no type: repr, or 'g'-like with one digit past the point
			if p < 0 {
				body = pyRepr(a)
			} else {
				body = pyGeneral(a, p, sp.alt, true)
			}
		}
		if sp.zeroCoerc && neg && isZeroText(body) {
			neg = false
		}
	}
	if upper {
		body = strings.ToUpper(body)
	}
	intPart, rest := body, ""
	if i := strings.IndexAny(body, ".eE"); i >= 0 && !strings.HasPrefix(body, "inf") && !strings.HasPrefix(body, "nan") {
		intPart, rest = body[:i], body[i:]
	}
	return sp.number(neg, "", intPart, rest+suffix, 3)
}

func isZeroText(s string) bool {
	for _, c := range s {
		if c >= '1' && c <= '9' {
			return false
		}
	}
	return true
}

// number lays out sign, prefix, grouped integer digits and the rest with fill and alignment.
func (sp spec) number(neg bool, prefix, intDigits, rest string, group int) string {
	sign := ""
	switch {
	case neg:
		sign = "-"
	case sp.sign == '+':
		sign = "+"
	case sp.sign == ' ':
		sign = " "
	}
	align := sp.align
	if align == 0 {
		align = '>'
	}
	if sp.grouping != 0 && align == '=' && sp.fill == '0' {
		// Python pads zero-filled grouped numbers with grouped zeros.
		minDigits := sp.width - len(sign) - len(prefix) - len(rest)
		intDigits = groupDigits(intDigits, sp.grouping, group, minDigits)
		return sign + prefix + intDigits + rest
	}
	if sp.grouping != 0 {
		intDigits = groupDigits(intDigits, sp.grouping, group, 0)
	}
	if align == '=' {
		return sp.pad(sign+prefix, intDigits+rest, '=')
	}
	return sp.pad("", sign+prefix+intDigits+rest, align)
}

func groupDigits(d string, sep byte, every, minLen int) string {
	if d == "inf" || d == "nan" || d == "INF" || d == "NAN" {
		return d
	}
	for {
		var b strings.Builder
		n := len(d)
		for i := 0; i < n; i++ {
			if i > 0 && (n-i)%every == 0 {
				b.WriteByte(sep)
			}
			b.WriteByte(d[i])
		}
		out := b.String()
		if len(out) >= minLen {
			return out
		}
		d = "0" + d
	}
}

// pad fills to width; for '=' the fill goes between head (sign, prefix) and body.
func (sp spec) pad(head, body string, align byte) string {
	n := utf8.RuneCountInString(head) + utf8.RuneCountInString(body)
	if n >= sp.width {
		return head + body
	}
	fill := strings.Repeat(string(sp.fill), sp.width-n)
	switch align {
	case '<':
		return head + body + fill
	case '^':
		l := (sp.width - n) / 2
		f := []rune(fill)
		return string(f[:l]) + head + body + string(f[l:])
	case '=':
		return head + fill + body
	default:
		return fill + head + body
	}
}

// pyExp formats a non-negative finite float as Python's 'e' with p digits after the point.
func pyExp(a float64, p int, alt bool) string {
	s := strconv.FormatFloat(a, 'e', p, 64) // Go also writes at least two exponent digits
	if alt && p == 0 {
		i := strings.IndexByte(s, 'e')
		s = s[:i] + "." + s[i:]
	}
	return s
}

// decimalExp returns the decimal exponent of a rounded to p significant digits.
func decimalExp(a float64, p int) int {
	if a == 0 {
		return 0
	}
	s := strconv.FormatFloat(a, 'e', p-1, 64)
	e, _ := strconv.Atoi(s[strings.IndexByte(s, 'e')+1:])
	return e
}

// pyGeneral formats like Python's 'g' (or, with noType, like the empty type with a precision).
func pyGeneral(a float64, p int, alt, noType bool) string {
	if p == 0 {
		p = 1
	}
	exp := decimalExp(a, p)
	limit := p
	if noType {
		limit = p - 1
		if limit < 1 {
			limit = 1
		}
	}
	var s string
	if exp >= -4 && exp < limit {
		s = strconv.FormatFloat(a, 'f', p-1-exp, 64)
		if !alt {
			s = trimZeros(s)
		}
		if noType && !strings.Contains(s, ".") {
			s += ".0"
		}
		if alt && !strings.Contains(s, ".") {
			s += "."
		}
		return s
	}
	s = strconv.FormatFloat(a, 'e', p-1, 64)
	if !alt {
		i := strings.IndexByte(s, 'e')
		s = trimZeros(s[:i]) + s[i:]
	}
	return s
}

func trimZeros(s string) string {
	if !strings.Contains(s, ".") {
		return s
	}
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

// pyRepr formats a non-negative finite float as Python's repr does.
func pyRepr(a float64) string {
	if a == 0 {
		return "0.0"
	}
	s := strconv.FormatFloat(a, 'e', -1, 64) // shortest digits: d.ddde±XX
	i := strings.IndexByte(s, 'e')
	mant, exp := strings.Replace(s[:i], ".", "", 1), s[i+1:]
	e, _ := strconv.Atoi(exp)
	if e < -4 || e >= 16 {
		m := mant[:1]
		if len(mant) > 1 {
			m += "." + mant[1:]
		}
		es := strconv.Itoa(abs(e))
		if len(es) < 2 {
			es = "0" + es
		}
		sign := "+"
		if e < 0 {
			sign = "-"
		}
		return m + "e" + sign + es
	}
	if e < 0 {
		return "0." + strings.Repeat("0", -e-1) + mant
	}
	if len(mant) <= e+1 {
		return mant + strings.Repeat("0", e+1-len(mant)) + ".0"
	}
	return mant[:e+1] + "." + mant[e+1:]
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
