package pb

import (
	"strings"
	"sync"

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

func word(name, prefix string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, prefix)), "_", " ")
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
