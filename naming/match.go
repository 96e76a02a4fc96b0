package naming

import (
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// Match reports whether name could have been rendered from the template and returns
// the integer and string variables it recovers (rank from "rank3.5.memory_snapshot.pickle",
// say). Integer fields formatted in decimal are recovered; other fields only have to
// match. A variable that appears twice must have the same value both times.
func (t *Template) Match(name string) (Vars, bool) {
	t.once.Do(t.compileMatcher)
	m := t.re.FindStringSubmatch(name)
	if m == nil {
		return nil, false
	}
	vars := Vars{}
	for i, g := range t.groups {
		if g.name == "" {
			continue
		}
		text := m[i+1]
		var v any
		switch g.kind {
		case KindInt:
			n, err := strconv.ParseInt(strings.NewReplacer(",", "", "_", "").Replace(strings.TrimSpace(text)), 10, 64)
			if err != nil {
				return nil, false
			}
			v = n
		case KindString:
			v = strings.TrimSpace(text)
		default:
			continue
		}
		if old, ok := vars[g.name]; ok && old != v {
			return nil, false
		}
		vars[g.name] = v
	}
	return vars, true
}

type group struct {
	name string // "" when the value is matched but not recovered
	kind Kind
}

type matcher struct {
	once   sync.Once
	re     *regexp.Regexp
	groups []group
}

func (t *Template) compileMatcher() {
	var b strings.Builder
	b.WriteString("^")
	for _, p := range t.parts {
		if p.name == "" {
			b.WriteString(regexp.QuoteMeta(p.lit))
			continue
		}
		decimal := p.spec.typ == 0 || p.spec.typ == 'd' || p.spec.typ == 'n'
		switch {
		case p.kind == KindInt && decimal && !p.spec.digitFill():
			b.WriteString(`( *[-+ ]?[0-9][0-9_,]*)`)
			t.groups = append(t.groups, group{p.name, KindInt})
		case p.kind == KindString:
			b.WriteString(`(.+?)`)
			t.groups = append(t.groups, group{p.name, KindString})
		default:
			b.WriteString(`(\S+?)`)
			t.groups = append(t.groups, group{"", p.kind})
		}
	}
	b.WriteString("$")
	t.re = regexp.MustCompile(b.String())
}

// digitFill reports whether padding with sp adds digits that are not leading zeros
// ("30000" for 3 with "<05"), so that an integer cannot be read back.
func (sp spec) digitFill() bool {
	if sp.fill < '0' || sp.fill > '9' {
		return false
	}
	return !(sp.fill == '0' && (sp.align == 0 || sp.align == '>' || sp.align == '='))
}
