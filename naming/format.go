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
// ([[fill]align][sign][z][#][0][width][grouping][.precision][type]), with the
// defaults CPython fills in resolved: fill and align as the '0' option sets them.
type spec struct {
	fill      rune
	align     byte // 0 (the kind's default: '<' for str, '>' for numbers), '<', '>', '=', '^'
	sign      byte // 0, '+', '-', ' '
	zeroCoerc bool // 'z'
	alt       bool // '#'
	width     int  // 0 when absent
	grouping  byte // 0, ',', '_'
	precision int  // -1 when absent
	typ       byte // 0 when absent
}

// defaultSpec is the spec of a field written without one.
var defaultSpec = spec{fill: ' ', precision: -1}

// Limits on widths and precisions. A width above MaxKeyLen, or a precision above it
// where the precision sets the number of digits (fixed and exponent notation, the
// alternate form), makes every field longer than a name may be, so Parse refuses
// such a spec although Python would take it. Where a float's precision only bounds its
// digits ('g' and the empty type), precisions above maxPrecision give the same text
// as maxPrecision: a double has at most 767 significant digits and a decimal exponent
// below 309.
const (
	maxWidth          = MaxKeyLen
	maxPrecision      = MaxKeyLen
	pyMaxPrecisionInt = math.MaxInt32 // CPython's limit on a float's precision
)

func isAlign(b byte) bool { return b == '<' || b == '>' || b == '=' || b == '^' }

// parseSpec parses spec text as CPython's format-spec parser does and checks it
// against the kind of value it formats, refusing what Python's str.format would refuse.
func parseSpec(s string, k Kind) (spec, error) {
	if !utf8.ValidString(s) {
		return spec{}, fmt.Errorf("format specifier %q is not valid UTF-8", s)
	}
	sp := defaultSpec
	i := sp.parseFlags(s, k)
	i, err := sp.parseSizes(s, i)
	if err != nil {
		return sp, err
	}
	if rest := s[i:]; utf8.RuneCountInString(rest) > 1 {
		return sp, fmt.Errorf("invalid format specifier %q for object of type '%s'", s, k)
	} else if rest != "" {
		switch {
		case rest == "\x00" && k == KindFloat:
			// CPython reads a NUL type as none, which for float is the default.
		case len(rest) > 1 || rest[0] == 0:
			return sp, fmt.Errorf("unknown format code %q for object of type '%s'", rest, k)
		default:
			sp.typ = rest[0]
		}
	}
	if err := sp.checkGrouping(k); err != nil {
		return sp, err
	}
	return sp, sp.check(k)
}

// parseFlags reads [[fill]align][sign][z][#][0] and returns where it stopped.
func (sp *spec) parseFlags(s string, k Kind) int {
	i := 0
	fillGiven := false
	if r, n := utf8.DecodeRuneInString(s); n > 0 && n < len(s) && isAlign(s[n]) {
		sp.fill, sp.align, fillGiven = r, s[n], true
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
	if !fillGiven && i < len(s) && s[i] == '0' {
		// The '0' option sets the fill whatever the alignment; it makes numbers
		// (never strings) align with '=' when no alignment is given. After an
		// explicit fill the '0' is read as part of the width.
		sp.fill = '0'
		if sp.align == 0 && k != KindString {
			sp.align = '='
		}
		i++
	}
	return i
}

// parseSizes reads [width][grouping][.precision] from s[i:] and returns where it stopped.
func (sp *spec) parseSizes(s string, i int) (int, error) {
	digits, i := scanDigits(s, i)
	if digits != "" {
		w, err := strconv.ParseInt(digits, 10, 64)
		if err != nil {
			return i, fmt.Errorf("too many decimal digits in format string")
		}
		if w > maxWidth {
			return i, fmt.Errorf("width %d is too large: the field alone would exceed the %d bytes a name may have", w, MaxKeyLen)
		}
		sp.width = int(w)
	}
	if i < len(s) && (s[i] == ',' || s[i] == '_') {
		sp.grouping = s[i]
		i++
		if i < len(s) && (s[i] == ',' || s[i] == '_') && s[i] != sp.grouping {
			return i, fmt.Errorf("cannot specify both ',' and '_'")
		}
	}
	if i < len(s) && s[i] == '.' {
		digits, i = scanDigits(s, i+1)
		if digits == "" {
			return i, fmt.Errorf("format specifier missing precision")
		}
		p, err := strconv.ParseInt(digits, 10, 64)
		if err != nil {
			return i, fmt.Errorf("too many decimal digits in format string")
		}
		sp.precision = int(min(p, math.MaxInt))
	}
	return i, nil
}

func scanDigits(s string, i int) (string, int) {
	start := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[start:i], i
}

// checkGrouping refuses a grouping option the presentation type does not take
// (with the type a kind defaults to: 's' for str, 'd' for int).
func (sp spec) checkGrouping(k Kind) error {
	if sp.grouping == 0 {
		return nil
	}
	typ := sp.typ
	if typ == 0 {
		switch k {
		case KindString:
			typ = 's'
		case KindInt:
			typ = 'd'
		}
	}
	switch typ {
	case 0, 'd', 'e', 'E', 'f', 'F', 'g', 'G', '%':
		return nil
	case 'b', 'o', 'x', 'X':
		if sp.grouping == '_' {
			return nil
		}
	}
	return fmt.Errorf("cannot specify '%c' with '%c'", sp.grouping, typ)
}

// check refuses what CPython refuses once a spec is parsed, for a value of kind k,
// and what names do not take (format code 'c', precisions that are too long).
func (sp spec) check(k Kind) error {
	switch k {
	case KindString:
		switch {
		case sp.typ != 0 && sp.typ != 's':
			return fmt.Errorf("unknown format code '%c' for object of type 'str'", sp.typ)
		case sp.sign != 0:
			return fmt.Errorf("sign not allowed in string format specifier")
		case sp.zeroCoerc:
			return fmt.Errorf("negative zero coercion (z) not allowed in string format specifier")
		case sp.alt:
			return fmt.Errorf("alternate form (#) not allowed in string format specifier")
		case sp.align == '=':
			return fmt.Errorf("'=' alignment not allowed in string format specifier")
		}
		return nil
	case KindInt:
		switch sp.typ {
		case 0, 'd', 'n', 'b', 'o', 'x', 'X', 'c':
			if sp.precision >= 0 {
				return fmt.Errorf("precision not allowed in integer format specifier")
			}
			if sp.zeroCoerc {
				return fmt.Errorf("negative zero coercion (z) not allowed in integer format specifier")
			}
			if sp.typ == 'c' {
				// Python writes the character with that code point; a rank or a
				// batch as a character is never a useful name.
				return fmt.Errorf("format code 'c' is not supported in names")
			}
			return nil
		case 'e', 'E', 'f', 'F', 'g', 'G', '%':
			return sp.check(KindFloat)
		}
		return fmt.Errorf("unknown format code '%c' for object of type 'int'", sp.typ)
	default:
		switch sp.typ {
		case 0, 'e', 'E', 'f', 'F', 'g', 'G', 'n', '%':
		default:
			return fmt.Errorf("unknown format code '%c' for object of type 'float'", sp.typ)
		}
		if sp.precision > pyMaxPrecisionInt {
			return fmt.Errorf("precision too big")
		}
		if sp.precision > maxPrecision && sp.precisionSetsLength() {
			return fmt.Errorf("precision %d is too large: every finite value would exceed the %d bytes a name may have", sp.precision, MaxKeyLen)
		}
		return nil
	}
}

// precisionSetsLength reports whether a float formatted with sp has at least
// precision digits: fixed and exponent notation, and the alternate form of the others,
// which keeps trailing zeros.
func (sp spec) precisionSetsLength() bool {
	switch sp.typ {
	case 'e', 'E', 'f', 'F', '%':
		return true
	}
	return sp.alt
}

// formatString applies sp to a str value as Python does.
func (sp spec) formatString(v string) string {
	if sp.precision >= 0 && sp.precision < len(v) {
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
	n := utf8.RuneCountInString(v)
	if n >= sp.width {
		return v
	}
	var b strings.Builder
	left := 0
	switch align {
	case '>':
		left = sp.width - n
	case '^':
		left = (sp.width - n) / 2
	}
	sp.writeFill(&b, left)
	b.WriteString(v)
	sp.writeFill(&b, sp.width-n-left)
	return b.String()
}

func (sp spec) writeFill(b *strings.Builder, n int) {
	for ; n > 0; n-- {
		b.WriteRune(sp.fill)
	}
}

// formatInt applies sp to an int value as Python does.
func (sp spec) formatInt(v int64) string {
	switch sp.typ {
	case 'e', 'E', 'f', 'F', 'g', 'G', '%':
		return sp.formatFloat(float64(v)) // Python converts to float, rounding to nearest
	}
	u := uint64(v)
	if v < 0 {
		u = -u // the magnitude, MinInt64's included
	}
	var digits, prefix string
	switch sp.typ {
	case 'b':
		digits, prefix = strconv.FormatUint(u, 2), "0b"
	case 'o':
		digits, prefix = strconv.FormatUint(u, 8), "0o"
	case 'x':
		digits, prefix = strconv.FormatUint(u, 16), "0x"
	case 'X':
		digits, prefix = strings.ToUpper(strconv.FormatUint(u, 16)), "0X"
	default:
		digits = strconv.FormatUint(u, 10)
	}
	if !sp.alt {
		prefix = ""
	}
	return sp.number(v < 0, prefix, digits, "")
}

// formatFloat applies sp to a float value as Python does.
func (sp spec) formatFloat(f float64) string {
	if sp.typ == '%' {
		f *= 100 // before anything else: a finite value can become infinite
	}
	neg := math.Signbit(f) && !math.IsNaN(f) // Python never writes nan's sign
	a := math.Abs(f)
	var body string
	switch {
	case math.IsInf(a, 0):
		body = "inf"
	case math.IsNaN(a):
		body = "nan"
	default:
		body = sp.floatDigits(a)
		if sp.zeroCoerc && neg && isZeroText(body) {
			neg = false
		}
	}
	switch sp.typ {
	case 'E', 'F', 'G':
		body = strings.ToUpper(body)
	case '%':
		body += "%"
	}
	n := 0
	for n < len(body) && body[n] >= '0' && body[n] <= '9' {
		n++
	}
	return sp.number(neg, "", body[:n], body[n:])
}

// floatDigits formats a non-negative finite float without its sign, as CPython's
// PyOS_double_to_string does for sp's type and precision.
func (sp spec) floatDigits(a float64) string {
	p := sp.precision
	switch sp.typ {
	case 'e', 'E':
		if p < 0 {
			p = 6
		}
		s := strconv.FormatFloat(a, 'e', p, 64) // like C, at least two exponent digits
		if sp.alt && p == 0 {
			i := strings.IndexByte(s, 'e')
			s = s[:i] + "." + s[i:]
		}
		return s
	case 'f', 'F', '%':
		if p < 0 {
			p = 6
		}
		s := strconv.FormatFloat(a, 'f', p, 64)
		if sp.alt && p == 0 {
			s += "."
		}
		return s
	case 'g', 'G', 'n':
		if p < 0 {
			p = 6
		}
		return pyShortFloat(a, 'g', min(max(p, 1), maxPrecision), sp.alt, false)
	default: // no type: repr, or with a precision 'g' that keeps a ".0"
		if p < 0 {
			return pyShortFloat(a, 'r', 0, sp.alt, true)
		}
		return pyShortFloat(a, 'g', min(max(p, 1), maxPrecision), sp.alt, true)
	}
}

// isZeroText reports whether the digits of a formatted magnitude, up to any exponent,
// are all zero (what 'z' looks at).
func isZeroText(s string) bool {
	for _, c := range s {
		if c >= '1' && c <= '9' {
			return false
		}
		if c == 'e' {
			return true
		}
	}
	return true
}

// pyShortFloat formats a non-negative finite float as CPython's format_float_short
// does for code 'g' (p significant digits, p >= 1) or 'r' (the shortest repr);
// addDot0 is Python's flag for the empty presentation type: an integral result in
// fixed notation keeps a ".0", and the switch to exponent notation comes one digit
// earlier.
func pyShortFloat(a float64, code byte, p int, alt, addDot0 bool) string {
	prec := p - 1
	if code == 'r' {
		prec = -1
	}
	s := strconv.FormatFloat(a, 'e', prec, 64)
	e := strings.IndexByte(s, 'e')
	exp, _ := strconv.Atoi(s[e+1:])
	digits := strings.TrimRight(strings.Replace(s[:e], ".", "", 1), "0")
	decpt := exp + 1
	if digits == "" {
		digits, decpt = "0", 1
	}
	useExp := false
	vEnd := len(digits)
	if code == 'g' {
		limit := p
		if addDot0 {
			limit = p - 1
		}
		useExp = decpt <= -4 || decpt > limit
		if alt {
			vEnd = p
		}
	} else {
		useExp = decpt <= -4 || decpt > 16
	}
	if useExp {
		exp, decpt = decpt-1, 1
	}
	vStart := 0
	if decpt <= 0 {
		vStart = decpt - 1
	}
	if !useExp && addDot0 {
		vEnd = max(vEnd, decpt+1)
	} else {
		vEnd = max(vEnd, decpt)
	}
	var b strings.Builder
	if decpt <= 0 {
		b.WriteString(strings.Repeat("0", decpt-vStart))
		b.WriteByte('.')
		b.WriteString(strings.Repeat("0", -decpt))
	}
	if 0 < decpt && decpt <= len(digits) {
		b.WriteString(digits[:decpt])
		b.WriteByte('.')
		b.WriteString(digits[decpt:])
	} else {
		b.WriteString(digits)
	}
	if len(digits) < decpt {
		b.WriteString(strings.Repeat("0", decpt-len(digits)))
		b.WriteByte('.')
		b.WriteString(strings.Repeat("0", vEnd-decpt))
	} else {
		b.WriteString(strings.Repeat("0", vEnd-len(digits)))
	}
	out := b.String()
	if !alt {
		out = strings.TrimSuffix(out, ".")
	}
	if useExp {
		sign := byte('+')
		if exp < 0 {
			sign, exp = '-', -exp
		}
		out += "e" + string(sign)
		if exp < 10 {
			out += "0"
		}
		out += strconv.Itoa(exp)
	}
	return out
}

// number lays out a formatted number as CPython's calc_number_widths and fill_number
// do: [padding][sign][prefix][padding][grouped digits][rest][padding], where rest is
// whatever follows the leading digits (decimal point, fraction, exponent, '%', or all
// of "inf" and "nan").
func (sp spec) number(neg bool, prefix, digits, rest string) string {
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
	nonDigits := len(sign) + len(prefix) + len(rest)
	minWidth := 0
	if sp.fill == '0' && align == '=' {
		minWidth = sp.width - nonDigits
	}
	if digits != "" {
		every := 0
		switch {
		case sp.grouping == 0 || sp.typ == 'n':
		case sp.typ == 'b' || sp.typ == 'o' || sp.typ == 'x' || sp.typ == 'X':
			every = 4
		default:
			every = 3
		}
		digits = groupDigits(digits, sp.grouping, every, minWidth)
	}
	var b strings.Builder
	pad := sp.width - nonDigits - len(digits)
	left, mid := 0, 0
	switch align {
	case '>':
		left = pad
	case '^':
		left = pad / 2
	case '=':
		mid = pad
	}
	sp.writeFill(&b, left)
	b.WriteString(sign)
	b.WriteString(prefix)
	sp.writeFill(&b, mid)
	b.WriteString(digits)
	b.WriteString(rest)
	sp.writeFill(&b, pad-left-mid)
	return b.String()
}

// groupDigits inserts sep between groups of every digits (none when every is 0) and
// pads with zeros on the left to at least minWidth characters, as CPython's
// _PyUnicode_InsertThousandsGrouping does: a group is completed with zeros rather
// than starting the number with a separator.
func groupDigits(d string, sep byte, every, minWidth int) string {
	minWidth = max(minWidth, 0)
	remaining := len(d)
	var groups []string // from the right
	if every == 0 {
		n := max(remaining, minWidth, 1)
		return strings.Repeat("0", n-remaining) + d
	}
	for {
		n := min(every, max(remaining, minWidth, 1))
		chars := min(remaining, n)
		groups = append(groups, strings.Repeat("0", n-chars)+d[remaining-chars:remaining])
		remaining -= chars
		minWidth -= n
		if remaining <= 0 && minWidth <= 0 {
			break
		}
		minWidth-- // the separator
	}
	var b strings.Builder
	for i := len(groups) - 1; i >= 0; i-- {
		b.WriteString(groups[i])
		if i > 0 {
			b.WriteByte(sep)
		}
	}
	return b.String()
}
