// Package naming renders rank-templated object names the way Composer's
// format_name_with_dist and format_name_with_dist_and_time do (Python str.format),
// parses s3:// URLs, and refuses names that would escape their prefix.
//
// A Template is parsed and checked once, up front: an unknown variable, an unclosed
// brace or a format spec that Python would refuse for that variable's type is an
// error at Parse time, never at export time. The package does no I/O.
//
// Format specs render as CPython 3.11 and later render them for str, int and float,
// with 'n' as in the C locale (Python's default). Parse also refuses a few specs
// Python accepts: format code 'c' for integers (a character is no part of a name),
// conversions (!r, !s, !a), nested fields, and widths or digit-setting precisions
// above MaxKeyLen, which make every name longer than a key may be (an infinite or
// NaN float would still render short with such a precision; that case is given up).
package naming

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// ErrUnknownVariable is wrapped by Parse when a template names a variable it does not know.
var ErrUnknownVariable = errors.New("naming: unknown variable")

// ErrMissingValue is wrapped by Render when a variable the template uses has no value.
var ErrMissingValue = errors.New("naming: missing value")

// Variables lists every variable a template may name, with its Python type.
// They are Composer's (format_name_with_dist_and_time) plus memsnap's own window id.
var Variables = map[string]Kind{
	"run_name":         KindString,
	"rank":             KindInt,
	"local_rank":       KindInt,
	"node_rank":        KindInt,
	"world_size":       KindInt,
	"local_world_size": KindInt,
	"epoch":            KindInt,
	"batch":            KindInt,
	"batch_in_epoch":   KindInt,
	"sample":           KindInt,
	"sample_in_epoch":  KindInt,
	"token":            KindInt,
	"token_in_epoch":   KindInt,
	"total_wct":        KindFloat,
	"epoch_wct":        KindFloat,
	"batch_wct":        KindFloat,
	"window":           KindInt,
}

// VariableNames returns the known variable names, sorted.
func VariableNames() []string {
	names := make([]string, 0, len(Variables))
	for n := range Variables {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Composer's MemorySnapshot defaults, and the other layouts memsnap reads.
const (
	// DefaultFolder is the local folder Composer's MemorySnapshot writes into.
	DefaultFolder = "{run_name}/torch_traces"
	// DefaultFilename is Composer's snapshot file name, without the .pickle extension.
	DefaultFilename = "rank{rank}.{batch}.memory_snapshot"
	// DefaultRemoteFileName is Composer's remote folder for snapshots.
	DefaultRemoteFileName = "{run_name}/torch_memory_traces"
	// ComposerSnapshotName is the full per-rank snapshot name as Composer writes it.
	ComposerSnapshotName = "rank{rank}.{batch}.memory_snapshot.pickle"
	// TorchtitanSnapshotName is torchtitan's per-rank snapshot name.
	TorchtitanSnapshotName = "{rank:06d}_step_{batch}.pickle"
)

// Vars holds the values a template is rendered with: string for run_name, int64 (or
// int) for the integer variables, float64 for the wall-clock ones.
type Vars map[string]any

// Template is a parsed, checked name template. It is immutable and safe for concurrent use.
type Template struct {
	src   string
	parts []part
	matcher
}

type part struct {
	lit  string // literal text (escapes resolved) when name == ""
	name string
	kind Kind
	spec spec
	raw  string // the spec text, for messages
}

// Parse parses and checks a template. Errors name the offending field and offset.
func Parse(src string) (*Template, error) {
	t := &Template{src: src}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, part{lit: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '{' && i+1 < len(src) && src[i+1] == '{':
			lit.WriteByte('{')
			i += 2
		case c == '}' && i+1 < len(src) && src[i+1] == '}':
			lit.WriteByte('}')
			i += 2
		case c == '}':
			return nil, fmt.Errorf("naming: template %q: single '}' at offset %d (write '}}' for a literal brace)", src, i)
		case c == '{':
			end := strings.IndexByte(src[i+1:], '}')
			if end < 0 {
				return nil, fmt.Errorf("naming: template %q: unclosed '{' at offset %d", src, i)
			}
			field := src[i+1 : i+1+end]
			if strings.ContainsRune(field, '{') {
				return nil, fmt.Errorf("naming: template %q: nested fields are not supported (offset %d)", src, i)
			}
			p, err := parseField(field)
			if err != nil {
				return nil, fmt.Errorf("naming: template %q: field {%s} at offset %d: %w", src, field, i, err)
			}
			flush()
			t.parts = append(t.parts, p)
			i += end + 2
		default:
			lit.WriteByte(c)
			i++
		}
	}
	flush()
	return t, nil
}

// MustParse is Parse for templates known to be valid; it panics otherwise.
func MustParse(src string) *Template {
	t, err := Parse(src)
	if err != nil {
		panic(err)
	}
	return t
}

func parseField(field string) (part, error) {
	name, specText, hasSpec := strings.Cut(field, ":")
	if strings.ContainsRune(name, '!') {
		return part{}, fmt.Errorf("conversions (!r, !s, !a) are not supported")
	}
	if name == "" {
		return part{}, fmt.Errorf("positional fields are not supported; name a variable (one of %s)", strings.Join(VariableNames(), ", "))
	}
	if strings.ContainsAny(name, ".[") {
		return part{}, fmt.Errorf("attribute and index access are not supported")
	}
	kind, ok := Variables[name]
	if !ok {
		return part{}, fmt.Errorf("%w %q (known: %s)", ErrUnknownVariable, name, strings.Join(VariableNames(), ", "))
	}
	p := part{name: name, kind: kind, raw: specText}
	if hasSpec {
		sp, err := parseSpec(specText, kind)
		if err != nil {
			return part{}, fmt.Errorf("format spec %q for %s %s: %w", specText, kind, name, err)
		}
		p.spec = sp
	} else {
		p.spec = defaultSpec
	}
	return p, nil
}

// String returns the template's source text.
func (t *Template) String() string { return t.src }

// Names returns the variables the template uses, in order of first use.
func (t *Template) Names() []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range t.parts {
		if p.name != "" && !seen[p.name] {
			seen[p.name] = true
			out = append(out, p.name)
		}
	}
	return out
}

// Uses reports whether the template names variable v.
func (t *Template) Uses(v string) bool {
	for _, p := range t.parts {
		if p.name == v {
			return true
		}
	}
	return false
}

// Render formats the template with vars as Python's str.format would. It does not
// check the result as an object name; see RenderKey.
func (t *Template) Render(vars Vars) (string, error) {
	var b strings.Builder
	for _, p := range t.parts {
		if p.name == "" {
			b.WriteString(p.lit)
			continue
		}
		v, ok := vars[p.name]
		if !ok {
			return "", fmt.Errorf("%w for {%s} in template %q", ErrMissingValue, p.name, t.src)
		}
		s, err := p.format(v)
		if err != nil {
			return "", fmt.Errorf("naming: template %q: {%s}: %w", t.src, p.name, err)
		}
		b.WriteString(s)
	}
	return b.String(), nil
}

// RenderKey renders the template and checks the result as an object key: the leading
// '/' is stripped as Composer does, and a key that escapes its prefix, holds control
// characters or is too long is refused.
func (t *Template) RenderKey(vars Vars) (string, error) {
	s, err := t.Render(vars)
	if err != nil {
		return "", err
	}
	return CleanKey(s)
}

func (p part) format(v any) (string, error) {
	switch p.kind {
	case KindString:
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("want a string, got %T", v)
		}
		return p.spec.formatString(s), nil
	case KindInt:
		var n int64
		switch x := v.(type) {
		case int64:
			n = x
		case int:
			n = int64(x)
		case int32:
			n = int64(x)
		case uint32:
			n = int64(x)
		default:
			return "", fmt.Errorf("want an integer, got %T", v)
		}
		return p.spec.formatInt(n), nil
	default:
		switch x := v.(type) {
		case float64:
			return p.spec.formatFloat(x), nil
		case int64:
			return p.spec.formatFloat(float64(x)), nil
		case int:
			return p.spec.formatFloat(float64(x)), nil
		}
		return "", fmt.Errorf("want a number, got %T", v)
	}
}

// ParseValue converts the text of a value (from a flag such as --var rank=3) to the
// type variable name has.
func ParseValue(name, text string) (any, error) {
	kind, ok := Variables[name]
	if !ok {
		return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknownVariable, name, strings.Join(VariableNames(), ", "))
	}
	switch kind {
	case KindString:
		return text, nil
	case KindInt:
		n, err := strconv.ParseInt(strings.TrimSpace(text), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("naming: %s must be an integer, got %q", name, text)
		}
		return n, nil
	default:
		f, err := strconv.ParseFloat(strings.TrimSpace(text), 64)
		if err != nil {
			return nil, fmt.Errorf("naming: %s must be a number (seconds), got %q", name, text)
		}
		return f, nil
	}
}
