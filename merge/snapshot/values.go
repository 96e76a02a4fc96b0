package snapshot

import "math"

type kind uint8

const (
	kNone kind = iota
	kBool
	kInt
	kFloat
	kStr
	kTuple
	kDict   // *Dict
	kList   // *List
	kTList  // *tlist: a list in a known position
	kFrames // *frameList
	kSnap   // *Snapshot
	kSeg    // *Segment
	kBlock  // *Block
	kEntry  // *TraceEntry
	kFrame  // *Frame
)

// val is one value on the decoder's stack or in its memo. o holds the string,
// Tuple or pointer the kind names; n holds an int, a bool, a float's bits, or a
// string's field id, so known keys are recognised once, when the string is read.
type val struct {
	o any
	n int64
	k kind
}

func (v *val) str() string { return v.o.(string) }

type schema uint8

const (
	schGeneric schema = iota
	schSegList
	schSeg
	schBlockList
	schBlock
	schTraces
	schTrace
	schEntry
	schFrames
	schFrame
)

// tlist is a list whose place in the snapshot is known (segments, blocks, traces).
// Its items live in a List so that every reference to it is the same *List.
type tlist struct {
	sch schema
	l   List
}

// frameList is a frames list; it turns generic if anything but a frame is appended.
type frameList struct {
	frames  []*Frame
	generic *List
}

// toGeneric turns the frames list into a plain List for good: every reference to it
// is then the same *List, and later appends land there.
func (fl *frameList) toGeneric() *List {
	if fl.generic == nil {
		items := make([]Value, len(fl.frames))
		for i, f := range fl.frames {
			items[i] = f
		}
		fl.generic = &List{Items: items}
		fl.frames = nil
	}
	return fl.generic
}

// container makes an empty dict or list, typed by where it will go: the parent
// container and key are read off the stack as CPython and torch lay them out. A
// wrong guess costs speed, never correctness: typed values that land somewhere
// else are converted or kept generic.
func (d *decoder) container(at int, op byte, isDict bool) (val, error) {
	if !d.top && len(d.stack) == 0 && isDict {
		d.top = true
		return val{k: kSnap, o: &Snapshot{}}, d.charge(at, op, sizeSnapshot)
	}
	sch := d.context()
	if isDict {
		switch sch {
		case schSeg:
			return val{k: kSeg, o: &Segment{}}, d.charge(at, op, sizeSegment)
		case schBlock:
			return val{k: kBlock, o: &Block{}}, d.charge(at, op, sizeBlock)
		case schEntry:
			e, err := d.newEntry(at, op)
			return val{k: kEntry, o: e}, err
		case schFrame:
			f, err := d.newFrame(at, op)
			return val{k: kFrame, o: f}, err
		}
		return val{k: kDict, o: &Dict{}}, d.charge(at, op, sizeSlice)
	}
	switch sch {
	case schSegList, schBlockList, schTraces, schTrace:
		return val{k: kTList, o: &tlist{sch: sch}}, d.charge(at, op, sizeSlice+8)
	case schFrames:
		fl, err := d.newFrameList(at, op)
		return val{k: kFrames, o: fl}, err
	}
	return val{k: kList, o: &List{}}, d.charge(at, op, sizeSlice)
}

// The slabs hand out entries, frames and frames lists from arrays allocated
// together, each array charged to the budget when it is made. A new array is
// cleared at once: fresh memory is then faulted in writable, a page at a time,
// instead of first read-only (mapping the zero page) and then again when written.

func (d *decoder) newEntry(at int, op byte) (*TraceEntry, error) {
	if len(d.entries) == 0 {
		if err := d.charge(at, op, int64(d.slab)*sizeEntry); err != nil {
			return nil, err
		}
		d.entries = nil
		if d.slab == slabMax {
			d.prefault()
			d.entries = take(d, d.pre.entries)
		}
		if d.entries == nil {
			d.entries = make([]TraceEntry, d.slab)
			clear(d.entries)
		}
		d.slab = min(d.slab*2, slabMax)
	}
	e := &d.entries[0]
	d.entries = d.entries[1:]
	return e, nil
}

func (d *decoder) newFrame(at int, op byte) (*Frame, error) {
	if len(d.frames) == 0 {
		n := min(d.slab, 256)
		if err := d.charge(at, op, int64(n)*sizeFrame); err != nil {
			return nil, err
		}
		d.frames = make([]Frame, n)
		clear(d.frames)
	}
	f := &d.frames[0]
	d.frames = d.frames[1:]
	return f, nil
}

func (d *decoder) newFrameList(at int, op byte) (*frameList, error) {
	if len(d.flists) == 0 {
		n := min(d.slab, slabMax)
		if err := d.charge(at, op, int64(n)*sizeFrameList); err != nil {
			return nil, err
		}
		d.flists = nil
		if n == slabMax {
			d.flists = take(d, d.pre.flists)
		}
		if d.flists == nil {
			d.flists = make([]frameList, n)
			clear(d.flists)
		}
	}
	fl := &d.flists[0]
	d.flists = d.flists[1:]
	return fl, nil
}

// framePtrs returns an empty slice with room for n frames, cut from a shared array
// when n is small; its capacity is exactly n, so appending past it copies.
func (d *decoder) framePtrs(at int, op byte, n int) ([]*Frame, error) {
	const chunk = fptrChunk
	if n > chunk/8 {
		if err := d.charge(at, op, int64(n)*8); err != nil {
			return nil, err
		}
		return make([]*Frame, 0, n), nil
	}
	if len(d.fptrs) < n {
		if err := d.charge(at, op, chunk*8); err != nil {
			return nil, err
		}
		if d.fptrs = take(d, d.pre.fptrs); d.fptrs == nil {
			d.fptrs = make([]*Frame, chunk)
		}
	}
	p := d.fptrs[:0:n]
	d.fptrs = d.fptrs[n:]
	return p, nil
}

func (d *decoder) context() schema {
	st := d.stack
	t := len(st) - 1
	m := -1
	if len(d.marks) > 0 {
		m = d.marks[len(d.marks)-1]
	}
	if m >= 1 {
		owner := st[m-1]
		n := len(st) - m
		switch {
		case owner.isDict():
			if n%2 == 1 {
				return childOf(owner, st[t])
			}
		case owner.isList():
			return childOf(owner, val{})
		}
	}
	if t >= 0 && t >= m {
		if st[t].k == kStr && t-1 >= 0 && t-1 >= m && st[t-1].isDict() {
			return childOf(st[t-1], st[t])
		}
		if st[t].isList() {
			return childOf(st[t], val{})
		}
	}
	return schGeneric
}

func (v *val) isDict() bool {
	switch v.k {
	case kDict, kSnap, kSeg, kBlock, kEntry, kFrame:
		return true
	}
	return false
}

func (v *val) isList() bool { return v.k == kList || v.k == kTList || v.k == kFrames }

func childOf(owner val, key val) schema {
	fid := -1
	if key.k == kStr {
		fid = int(key.n)
	}
	switch owner.k {
	case kSnap:
		switch fid {
		case fSegments:
			return schSegList
		case fDeviceTraces:
			return schTraces
		}
	case kSeg:
		switch fid {
		case fBlocks:
			return schBlockList
		case fFrames:
			return schFrames
		}
	case kBlock, kEntry:
		if fid == fFrames {
			return schFrames
		}
	case kTList:
		switch owner.o.(*tlist).sch {
		case schSegList:
			return schSeg
		case schBlockList:
			return schBlock
		case schTraces:
			return schTrace
		case schTrace:
			return schEntry
		}
	case kFrames:
		return schFrame
	}
	return schGeneric
}

func (v val) typeName() string {
	switch v.k {
	case kNone:
		return "None"
	case kBool:
		return "bool"
	case kInt:
		return "int"
	case kFloat:
		return "float"
	case kStr:
		return "str"
	case kTuple:
		return "tuple"
	case kList, kTList, kFrames:
		return "list"
	}
	return "dict"
}

// any converts a stack value to the model's generic form.
func (v val) any() Value {
	switch v.k {
	case kNone:
		return nil
	case kBool:
		return v.n != 0
	case kInt:
		return v.n
	case kFloat:
		return math.Float64frombits(uint64(v.n))
	case kTList:
		return &v.o.(*tlist).l
	case kFrames:
		return v.o.(*frameList).toGeneric()
	}
	return v.o
}

// valOf converts a generic value back to a stack value (for late conversions).
func valOf(x Value) val {
	switch t := x.(type) {
	case nil:
		return val{k: kNone}
	case bool:
		if t {
			return val{k: kBool, n: 1}
		}
		return val{k: kBool}
	case int64:
		return val{k: kInt, n: t}
	case float64:
		return val{k: kFloat, n: int64(math.Float64bits(t))}
	case string:
		return val{k: kStr, o: x, n: int64(fieldID(t))}
	case Tuple:
		return val{k: kTuple, o: t}
	case *Dict:
		return val{k: kDict, o: t}
	case *List:
		return val{k: kList, o: t}
	case *Snapshot:
		return val{k: kSnap, o: t}
	case *Segment:
		return val{k: kSeg, o: t}
	case *Block:
		return val{k: kBlock, o: t}
	case *TraceEntry:
		return val{k: kEntry, o: t}
	case *Frame:
		return val{k: kFrame, o: t}
	}
	return val{k: kNone}
}

// appendItems appends vs, in order, to the list owner.
func (d *decoder) appendItems(at int, op byte, owner val, vs []val) error {
	if len(vs) == 0 {
		return nil
	}
	var l *List
	switch owner.k {
	case kList:
		l = owner.o.(*List)
	case kTList:
		l = &owner.o.(*tlist).l
	case kFrames:
		fl := owner.o.(*frameList)
		if fl.generic == nil && allFrames(vs) {
			return d.appendFrames(at, op, fl, vs)
		}
		for i := range vs {
			if fl.generic == nil && vs[i].k == kFrame {
				if err := d.appendFrames(at, op, fl, vs[i:i+1]); err != nil {
					return err
				}
				continue
			}
			if fl.generic == nil {
				if err := d.charge(at, op, sizeSlice+sizeValue*int64(len(fl.frames))); err != nil {
					return err
				}
			}
			if err := d.appendGeneric(at, op, fl.toGeneric(), vs[i:i+1]); err != nil {
				return err
			}
		}
		return nil
	default:
		return d.fail(at, op, "appending to a %s", owner.typeName())
	}
	return d.appendGeneric(at, op, l, vs)
}

func (d *decoder) appendGeneric(at int, op byte, l *List, vs []val) error {
	var ok bool
	if l.Items, ok = grown(d, l.Items, len(vs), sizeValue); !ok {
		return d.overBudget(at, op)
	}
	for i := range vs {
		l.Items = append(l.Items, vs[i].any())
	}
	return nil
}

func (d *decoder) appendFrames(at int, op byte, fl *frameList, vs []val) error {
	if fl.frames == nil {
		p, err := d.framePtrs(at, op, len(vs))
		if err != nil {
			return err
		}
		fl.frames = p
	} else {
		var ok bool
		if fl.frames, ok = grown(d, fl.frames, len(vs), 8); !ok {
			return d.overBudget(at, op)
		}
	}
	for i := range vs {
		fl.frames = append(fl.frames, vs[i].o.(*Frame))
	}
	return nil
}

func allFrames(vs []val) bool {
	for i := range vs {
		if vs[i].k != kFrame {
			return false
		}
	}
	return true
}

func (d *decoder) setItem(at int, op byte, owner val, k, v *val) error {
	if k.k == kDict || k.k == kList || k.k == kTList || k.k == kFrames || k.isDict() {
		return d.fail(at, op, "unhashable %s used as a dict key", k.typeName())
	}
	switch owner.k {
	case kDict:
		dd := owner.o.(*Dict)
		var ok bool
		if dd.Items, ok = grown(d, dd.Items, 1, sizeItem); !ok {
			return d.overBudget(at, op)
		}
		dd.Items = append(dd.Items, Item{k.any(), v.any()})
	case kSnap:
		owner.o.(*Snapshot).set(d, k, v)
	case kSeg:
		owner.o.(*Segment).set(d, k, v)
	case kBlock:
		owner.o.(*Block).set(d, k, v)
	case kEntry:
		owner.o.(*TraceEntry).set(d, k, v)
	case kFrame:
		owner.o.(*Frame).set(d, k, v)
	default:
		return d.fail(at, op, "setting an item on a %s", owner.typeName())
	}
	return nil
}
