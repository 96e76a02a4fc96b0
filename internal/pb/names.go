package pb

import (
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// memsnap's one vocabulary for its enums, built on the generated names: a value
// as people read it is its generated name less the prefix its enum's values share,
// in lower case, words apart ("STEP_UPLOADED" is "uploaded", "ACK_STALE_TERM" is
// "stale term", "WINDOW_KIND_OOM" is "oom").

// Name is e as people read it.
func Name(e protoreflect.Enum) string {
	v := e.Descriptor().Values().ByNumber(e.Number())
	if v == nil {
		return "unknown"
	}
	return word(string(v.Name()), prefixOf(e.Descriptor()))
}

// Parse is the value of enum type E whose Name is name; ok is false when there is
// none.
func Parse[E interface {
	~int32
	protoreflect.Enum
}](name string) (e E, ok bool) {
	d := e.Descriptor()
	values, pre := d.Values(), prefixOf(d)
	for i := 0; i < values.Len(); i++ {
		if v := values.Get(i); word(string(v.Name()), pre) == name {
			return E(v.Number()), true
		}
	}
	return e, false
}

// Lower is e as data memsnap reads spells it (a torch snapshot's actions): its
// generated name less the prefix its enum's values share, in lower case, the
// underscores kept ("FREE_REQUESTED" is "free_requested"); "" for a number its
// enum does not name.
func Lower(e protoreflect.Enum) string {
	l, n := lowersOf(e.Descriptor()), e.Number()
	for i, v := range l.numbers {
		if v == n {
			return l.names[i]
		}
	}
	return ""
}

// ParseLower is the value of enum type E whose Lower is s; ok is false when there
// is none.
func ParseLower[E interface {
	~int32
	protoreflect.Enum
}](s string) (e E, ok bool) {
	l := lowersOf(e.Descriptor())
	for i, name := range l.names {
		if name == s {
			return E(l.numbers[i]), true
		}
	}
	return e, false
}

func word(name, prefix string) string {
	return strings.ReplaceAll(lower(name, prefix), "_", " ")
}

func lower(name, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(name, prefix))
}

// lowers is an enum's values and their Lower names, in the order it declares
// them (a merge looks up every event's action: a short scan, no map, no lock).
type lowers struct {
	d       protoreflect.EnumDescriptor
	numbers []protoreflect.EnumNumber
	names   []string
}

var lowerCache atomic.Pointer[[]*lowers] // replaced whole when an enum is added

// lowersOf is d's Lower names, made once.
func lowersOf(d protoreflect.EnumDescriptor) *lowers {
	old := lowerCache.Load()
	if old != nil {
		for _, l := range *old {
			if l.d == d {
				return l
			}
		}
	}
	values, pre := d.Values(), prefixOf(d)
	l := &lowers{d: d}
	for i := 0; i < values.Len(); i++ {
		v := values.Get(i)
		l.numbers, l.names = append(l.numbers, v.Number()), append(l.names, lower(string(v.Name()), pre))
	}
	var all []*lowers
	if old != nil {
		all = append(all, *old...)
	}
	all = append(all, l)
	lowerCache.CompareAndSwap(old, &all) // a racing caller's may win: this one is made again next time
	return l
}

var prefixes sync.Map // protoreflect.FullName -> string

// prefixOf is the longest prefix, ending in '_', that every value of d shares.
func prefixOf(d protoreflect.EnumDescriptor) string {
	if p, ok := prefixes.Load(d.FullName()); ok {
		return p.(string)
	}
	values := d.Values()
	pre := ""
	if values.Len() > 0 {
		pre = string(values.Get(0).Name())
		for i := 1; i < values.Len(); i++ {
			n := string(values.Get(i).Name())
			for !strings.HasPrefix(n, pre) {
				pre = pre[:len(pre)-1]
			}
		}
		if i := strings.LastIndexByte(pre, '_'); i >= 0 {
			pre = pre[:i+1]
		} else {
			pre = ""
		}
	}
	prefixes.Store(d.FullName(), pre)
	return pre
}
