package snapshot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Opcodes of the subset the decoder accepts.
const (
	opPROTO            = 0x80
	opFRAME            = 0x95
	opSTOP             = '.'
	opEMPTY_DICT       = '}'
	opEMPTY_LIST       = ']'
	opEMPTY_TUPLE      = ')'
	opMARK             = '('
	opSETITEM          = 's'
	opSETITEMS         = 'u'
	opAPPEND           = 'a'
	opAPPENDS          = 'e'
	opSHORT_BINUNICODE = 0x8c
	opBINUNICODE       = 'X'
	opBINUNICODE8      = 0x8d
	opMEMOIZE          = 0x94
	opBINPUT           = 'q'
	opLONG_BINPUT      = 'r'
	opBINGET           = 'h'
	opLONG_BINGET      = 'j'
	opBININT           = 'J'
	opBININT1          = 'K'
	opBININT2          = 'M'
	opLONG1            = 0x8a
	opBINFLOAT         = 'G'
	opTUPLE            = 't'
	opTUPLE1           = 0x85
	opTUPLE2           = 0x86
	opTUPLE3           = 0x87
	opNONE             = 'N'
	opNEWTRUE          = 0x88
	opNEWFALSE         = 0x89
)

// refused names every opcode the decoder will not run, with why.
var refused = map[byte]string{
	'c': "GLOBAL", 0x93: "STACK_GLOBAL", 'R': "REDUCE", 'b': "BUILD", 'i': "INST", 'o': "OBJ",
	0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 'P': "PERSID", 'Q': "BINPERSID", 0x82: "EXT1", 0x83: "EXT2",
	0x84: "EXT4", 'I': "INT", 'L': "LONG", 'S': "STRING", 'T': "BINSTRING", 'U': "SHORT_BINSTRING",
	'V': "UNICODE", 'F': "FLOAT", 'd': "DICT", 'l': "LIST", '0': "POP", '1': "POP_MARK", '2': "DUP",
	'g': "GET", 'p': "PUT", 0x8b: "LONG4", 'B': "BINBYTES", 'C': "SHORT_BINBYTES", 0x8e: "BINBYTES8",
	0x96: "BYTEARRAY8", 0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER", 0x8f: "EMPTY_SET",
	0x90: "ADDITEMS", 0x91: "FROZENSET",
}

var codeOps = map[string]bool{"GLOBAL": true, "STACK_GLOBAL": true, "REDUCE": true, "BUILD": true, "INST": true,
	"OBJ": true, "NEWOBJ": true, "NEWOBJ_EX": true, "PERSID": true, "BINPERSID": true, "EXT1": true, "EXT2": true, "EXT4": true}

// DecodeError reports why and where a pickle was refused.
type DecodeError struct {
	Offset int    // byte offset of the opcode (or of the end, for truncation)
	Op     string // the opcode's name, "" when none applies
	Reason string
}

func (e *DecodeError) Error() string {
	if e.Op != "" {
		return fmt.Sprintf("snapshot: byte %d: %s: %s", e.Offset, e.Op, e.Reason)
	}
	return fmt.Sprintf("snapshot: byte %d: %s", e.Offset, e.Reason)
}

// ErrNotSnapshot is wrapped when a well-formed pickle does not hold a memory snapshot.
var ErrNotSnapshot = errors.New("snapshot: not a torch memory snapshot")

// Limits bound what a decode may build; every bound is checked before allocating.
const (
	maxStack = 1 << 20 // values on the stack at once (nesting depth is bounded by it)
	maxMarks = 1 << 16 // open MARKs
)

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

// val is one value on the decoder's stack or in its memo. For strings, n holds the
// string's field id so known keys are recognised once, when the string is read.
type val struct {
	k kind
	n int64 // int, bool, float bits, or field id
	s string
	o any
}

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

type decoder struct {
	data   []byte
	pos    int
	stack  []val
	marks  []int
	memo   []val
	sparse map[uint64]val
	top    bool // the top-level dict was made

	entries []TraceEntry // slab
	frames  []Frame      // slab
	slab    int
	conv    map[*List]any // typed conversions of shared lists, done once each
}

// Decode decodes a pickled snapshot. It never runs code and never panics on bad
// input; a refused or broken pickle gives a *DecodeError with the byte offset.
func Decode(data []byte) (*Snapshot, error) {
	d := decoder{data: data, slab: 16}
	d.stack = make([]val, 0, 64)
	d.memo = make([]val, 0, min(len(data)/8+1, 1<<16))
	return d.run()
}

func (d *decoder) fail(at int, op byte, reason string, args ...any) error {
	name := ""
	if op != 0 {
		name = opName(op)
	}
	return &DecodeError{Offset: at, Op: name, Reason: fmt.Sprintf(reason, args...)}
}

func opName(op byte) string {
	if n, ok := refused[op]; ok {
		return n
	}
	if n, ok := accepted[op]; ok {
		return n
	}
	return fmt.Sprintf("opcode 0x%02x", op)
}

var accepted = map[byte]string{
	opPROTO: "PROTO", opFRAME: "FRAME", opSTOP: "STOP", opEMPTY_DICT: "EMPTY_DICT", opEMPTY_LIST: "EMPTY_LIST",
	opEMPTY_TUPLE: "EMPTY_TUPLE", opMARK: "MARK", opSETITEM: "SETITEM", opSETITEMS: "SETITEMS", opAPPEND: "APPEND",
	opAPPENDS: "APPENDS", opSHORT_BINUNICODE: "SHORT_BINUNICODE", opBINUNICODE: "BINUNICODE",
	opBINUNICODE8: "BINUNICODE8", opMEMOIZE: "MEMOIZE", opBINPUT: "BINPUT", opLONG_BINPUT: "LONG_BINPUT",
	opBINGET: "BINGET", opLONG_BINGET: "LONG_BINGET", opBININT: "BININT", opBININT1: "BININT1",
	opBININT2: "BININT2", opLONG1: "LONG1", opBINFLOAT: "BINFLOAT", opTUPLE: "TUPLE", opTUPLE1: "TUPLE1",
	opTUPLE2: "TUPLE2", opTUPLE3: "TUPLE3", opNONE: "NONE", opNEWTRUE: "NEWTRUE", opNEWFALSE: "NEWFALSE",
}

func (d *decoder) need(at int, op byte, n uint64) error {
	if uint64(len(d.data)-d.pos) < n {
		return d.fail(at, op, "truncated: needs %d more bytes, %d left", n, len(d.data)-d.pos)
	}
	return nil
}

func (d *decoder) push(at int, op byte, v val) error {
	if len(d.stack) >= maxStack {
		return d.fail(at, op, "stack deeper than %d values", maxStack)
	}
	d.stack = append(d.stack, v)
	return nil
}

func (d *decoder) run() (*Snapshot, error) {
	if len(d.data) < 2 || d.data[0] != opPROTO {
		if len(d.data) == 0 {
			return nil, d.fail(0, 0, "empty input")
		}
		return nil, d.fail(0, d.data[0], "not a protocol 2-5 pickle (no PROTO opcode first)")
	}
	for {
		if d.pos >= len(d.data) {
			return nil, d.fail(d.pos, 0, "truncated: the pickle ends without STOP")
		}
		at := d.pos
		op := d.data[at]
		d.pos++
		switch op {
		case opBINGET:
			if err := d.need(at, op, 1); err != nil {
				return nil, err
			}
			idx := uint64(d.data[d.pos])
			d.pos++
			if err := d.get(at, op, idx); err != nil {
				return nil, err
			}
		case opLONG_BINGET:
			if err := d.need(at, op, 4); err != nil {
				return nil, err
			}
			idx := uint64(binary.LittleEndian.Uint32(d.data[d.pos:]))
			d.pos += 4
			if err := d.get(at, op, idx); err != nil {
				return nil, err
			}
		case opMEMOIZE:
			if len(d.stack) == 0 {
				return nil, d.fail(at, op, "empty stack")
			}
			d.memo = append(d.memo, d.stack[len(d.stack)-1])
		case opBINPUT, opLONG_BINPUT:
			var idx uint64
			if op == opBINPUT {
				if err := d.need(at, op, 1); err != nil {
					return nil, err
				}
				idx = uint64(d.data[d.pos])
				d.pos++
			} else {
				if err := d.need(at, op, 4); err != nil {
					return nil, err
				}
				idx = uint64(binary.LittleEndian.Uint32(d.data[d.pos:]))
				d.pos += 4
			}
			if len(d.stack) == 0 {
				return nil, d.fail(at, op, "empty stack")
			}
			d.put(idx, d.stack[len(d.stack)-1])
		case opMARK:
			if len(d.marks) >= maxMarks {
				return nil, d.fail(at, op, "more than %d open marks", maxMarks)
			}
			d.marks = append(d.marks, len(d.stack))
		case opSHORT_BINUNICODE, opBINUNICODE, opBINUNICODE8:
			var n uint64
			switch op {
			case opSHORT_BINUNICODE:
				if err := d.need(at, op, 1); err != nil {
					return nil, err
				}
				n = uint64(d.data[d.pos])
				d.pos++
			case opBINUNICODE:
				if err := d.need(at, op, 4); err != nil {
					return nil, err
				}
				n = uint64(binary.LittleEndian.Uint32(d.data[d.pos:]))
				d.pos += 4
			default:
				if err := d.need(at, op, 8); err != nil {
					return nil, err
				}
				n = binary.LittleEndian.Uint64(d.data[d.pos:])
				d.pos += 8
			}
			if err := d.need(at, op, n); err != nil {
				return nil, err
			}
			s := string(d.data[d.pos : d.pos+int(n)])
			d.pos += int(n)
			if err := d.push(at, op, val{k: kStr, s: s, n: int64(fieldID(s))}); err != nil {
				return nil, err
			}
		case opBININT1:
			if err := d.need(at, op, 1); err != nil {
				return nil, err
			}
			v := int64(d.data[d.pos])
			d.pos++
			if err := d.push(at, op, val{k: kInt, n: v}); err != nil {
				return nil, err
			}
		case opBININT2:
			if err := d.need(at, op, 2); err != nil {
				return nil, err
			}
			v := int64(binary.LittleEndian.Uint16(d.data[d.pos:]))
			d.pos += 2
			if err := d.push(at, op, val{k: kInt, n: v}); err != nil {
				return nil, err
			}
		case opBININT:
			if err := d.need(at, op, 4); err != nil {
				return nil, err
			}
			v := int64(int32(binary.LittleEndian.Uint32(d.data[d.pos:])))
			d.pos += 4
			if err := d.push(at, op, val{k: kInt, n: v}); err != nil {
				return nil, err
			}
		case opLONG1:
			if err := d.need(at, op, 1); err != nil {
				return nil, err
			}
			n := int(d.data[d.pos])
			d.pos++
			if err := d.need(at, op, uint64(n)); err != nil {
				return nil, err
			}
			v, ok := long1(d.data[d.pos : d.pos+n])
			if !ok {
				return nil, d.fail(at, op, "integer of %d bytes does not fit in 64 bits", n)
			}
			d.pos += n
			if err := d.push(at, op, val{k: kInt, n: v}); err != nil {
				return nil, err
			}
		case opBINFLOAT:
			if err := d.need(at, op, 8); err != nil {
				return nil, err
			}
			v := binary.BigEndian.Uint64(d.data[d.pos:])
			d.pos += 8
			if err := d.push(at, op, val{k: kFloat, n: int64(v)}); err != nil {
				return nil, err
			}
		case opNONE:
			if err := d.push(at, op, val{k: kNone}); err != nil {
				return nil, err
			}
		case opNEWTRUE, opNEWFALSE:
			b := int64(0)
			if op == opNEWTRUE {
				b = 1
			}
			if err := d.push(at, op, val{k: kBool, n: b}); err != nil {
				return nil, err
			}
		case opEMPTY_DICT, opEMPTY_LIST:
			if err := d.push(at, op, d.container(op == opEMPTY_DICT)); err != nil {
				return nil, err
			}
		case opEMPTY_TUPLE:
			if err := d.push(at, op, val{k: kTuple, o: Tuple{}}); err != nil {
				return nil, err
			}
		case opTUPLE1, opTUPLE2, opTUPLE3:
			n := int(op-opTUPLE1) + 1
			if len(d.stack) < n || (len(d.marks) > 0 && d.marks[len(d.marks)-1] > len(d.stack)-n) {
				return nil, d.fail(at, op, "needs %d values on the stack", n)
			}
			t := make(Tuple, n)
			for i := 0; i < n; i++ {
				t[i] = d.stack[len(d.stack)-n+i].any()
			}
			d.stack = d.stack[:len(d.stack)-n]
			d.stack = append(d.stack, val{k: kTuple, o: t})
		case opTUPLE:
			m, err := d.popMark(at, op)
			if err != nil {
				return nil, err
			}
			t := make(Tuple, len(d.stack)-m)
			for i := range t {
				t[i] = d.stack[m+i].any()
			}
			d.stack = d.stack[:m]
			d.stack = append(d.stack, val{k: kTuple, o: t})
		case opSETITEMS:
			m, err := d.popMark(at, op)
			if err != nil {
				return nil, err
			}
			if m == 0 {
				return nil, d.fail(at, op, "no dict below the mark")
			}
			if (len(d.stack)-m)%2 != 0 {
				return nil, d.fail(at, op, "odd number of keys and values")
			}
			owner := d.stack[m-1]
			for i := m; i < len(d.stack); i += 2 {
				if err := d.setItem(at, op, owner, &d.stack[i], &d.stack[i+1]); err != nil {
					return nil, err
				}
			}
			d.stack = d.stack[:m]
		case opSETITEM:
			n := len(d.stack)
			if n < 3 || (len(d.marks) > 0 && d.marks[len(d.marks)-1] > n-3) {
				return nil, d.fail(at, op, "needs a dict, a key and a value on the stack")
			}
			if err := d.setItem(at, op, d.stack[n-3], &d.stack[n-2], &d.stack[n-1]); err != nil {
				return nil, err
			}
			d.stack = d.stack[:n-2]
		case opAPPENDS:
			m, err := d.popMark(at, op)
			if err != nil {
				return nil, err
			}
			if m == 0 {
				return nil, d.fail(at, op, "no list below the mark")
			}
			owner := d.stack[m-1]
			for i := m; i < len(d.stack); i++ {
				if err := d.appendItem(at, op, owner, &d.stack[i]); err != nil {
					return nil, err
				}
			}
			d.stack = d.stack[:m]
		case opAPPEND:
			n := len(d.stack)
			if n < 2 || (len(d.marks) > 0 && d.marks[len(d.marks)-1] > n-2) {
				return nil, d.fail(at, op, "needs a list and a value on the stack")
			}
			if err := d.appendItem(at, op, d.stack[n-2], &d.stack[n-1]); err != nil {
				return nil, err
			}
			d.stack = d.stack[:n-1]
		case opFRAME:
			if err := d.need(at, op, 8); err != nil {
				return nil, err
			}
			n := binary.LittleEndian.Uint64(d.data[d.pos:])
			d.pos += 8
			if err := d.need(at, op, n); err != nil {
				return nil, err
			}
		case opPROTO:
			if at != 0 {
				return nil, d.fail(at, op, "PROTO after the start")
			}
			if err := d.need(at, op, 1); err != nil {
				return nil, err
			}
			if v := d.data[d.pos]; v < 2 || v > 5 {
				return nil, d.fail(at, op, "protocol %d is not supported (2 to 5 are)", v)
			}
			d.pos++
		case opSTOP:
			if len(d.stack) != 1 || len(d.marks) != 0 {
				return nil, d.fail(at, op, "%d values and %d marks left at STOP, want one value", len(d.stack), len(d.marks))
			}
			v := d.stack[0]
			if v.k != kSnap {
				return nil, fmt.Errorf("%w: the pickle holds a %s, not a dict with segments and device_traces", ErrNotSnapshot, v.typeName())
			}
			s := v.o.(*Snapshot)
			if s.Has&(SnapSegments|SnapDeviceTraces) == 0 {
				return nil, fmt.Errorf("%w: the dict has neither a segments nor a device_traces list", ErrNotSnapshot)
			}
			if n := s.references(len(d.data)); n > len(d.data) {
				return nil, d.fail(at, op, "the snapshot references %d entries, blocks and frames in %d bytes: its lists are shared, which torch never writes", n, len(d.data))
			}
			return s, nil
		default:
			if name, ok := refused[op]; ok {
				if codeOps[name] {
					return nil, d.fail(at, op, "refused: it could import or run code")
				}
				return nil, d.fail(at, op, "refused: torch does not write this opcode in memory snapshots")
			}
			return nil, d.fail(at, op, "unknown opcode")
		}
	}
}

func long1(b []byte) (int64, bool) {
	n := len(b)
	if n == 0 {
		return 0, true
	}
	neg := b[n-1]&0x80 != 0
	if n > 8 {
		ext := byte(0)
		if neg {
			ext = 0xff
		}
		for _, c := range b[8:] {
			if c != ext {
				return 0, false
			}
		}
		if (b[7]&0x80 != 0) != neg {
			return 0, false
		}
		b = b[:8]
		n = 8
	}
	var u uint64
	for i := n - 1; i >= 0; i-- {
		u = u<<8 | uint64(b[i])
	}
	if neg && n < 8 {
		u |= ^uint64(0) << (8 * uint(n))
	}
	return int64(u), true
}

func (d *decoder) popMark(at int, op byte) (int, error) {
	if len(d.marks) == 0 {
		return 0, d.fail(at, op, "no MARK to pop")
	}
	m := d.marks[len(d.marks)-1]
	d.marks = d.marks[:len(d.marks)-1]
	if m > len(d.stack) {
		return 0, d.fail(at, op, "mark above the stack")
	}
	return m, nil
}

func (d *decoder) get(at int, op byte, idx uint64) error {
	if idx < uint64(len(d.memo)) {
		return d.push(at, op, d.memo[idx])
	}
	if v, ok := d.sparse[idx]; ok {
		return d.push(at, op, v)
	}
	return d.fail(at, op, "memo entry %d was never stored", idx)
}

// put stores a memo entry; indexes beyond the dense memo go to a map, so a huge
// index costs one entry, not a huge slice.
func (d *decoder) put(idx uint64, v val) {
	switch {
	case idx < uint64(len(d.memo)):
		d.memo[idx] = v
	case idx == uint64(len(d.memo)):
		d.memo = append(d.memo, v)
	default:
		if d.sparse == nil {
			d.sparse = map[uint64]val{}
		}
		d.sparse[idx] = v
	}
}

// container makes an empty dict or list, typed by where it will go: the parent
// container and key are read off the stack as CPython and torch lay them out. A
// wrong guess costs speed, never correctness: typed values that land somewhere
// else are converted or kept generic.
func (d *decoder) container(isDict bool) val {
	if !d.top && len(d.stack) == 0 && isDict {
		d.top = true
		return val{k: kSnap, o: &Snapshot{}}
	}
	sch := d.context()
	if isDict {
		switch sch {
		case schSeg:
			return val{k: kSeg, o: &Segment{}}
		case schBlock:
			return val{k: kBlock, o: &Block{}}
		case schEntry:
			return val{k: kEntry, o: d.newEntry()}
		case schFrame:
			return val{k: kFrame, o: d.newFrame()}
		}
		return val{k: kDict, o: &Dict{}}
	}
	switch sch {
	case schSegList, schBlockList, schTraces, schTrace:
		return val{k: kTList, o: &tlist{sch: sch}}
	case schFrames:
		return val{k: kFrames, o: &frameList{}}
	}
	return val{k: kList, o: &List{}}
}

func (d *decoder) newEntry() *TraceEntry {
	if len(d.entries) == 0 {
		d.entries = make([]TraceEntry, d.slab)
		d.slab = min(d.slab*2, 1024)
	}
	e := &d.entries[0]
	d.entries = d.entries[1:]
	return e
}

func (d *decoder) newFrame() *Frame {
	if len(d.frames) == 0 {
		d.frames = make([]Frame, min(d.slab, 256))
	}
	f := &d.frames[0]
	d.frames = d.frames[1:]
	return f
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
	case kStr:
		return v.s
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
		return val{k: kStr, s: t, n: int64(fieldID(t))}
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

func (d *decoder) appendItem(at int, op byte, owner val, v *val) error {
	switch owner.k {
	case kList:
		l := owner.o.(*List)
		l.Items = append(l.Items, v.any())
	case kTList:
		l := owner.o.(*tlist)
		l.l.Items = append(l.l.Items, v.any())
	case kFrames:
		fl := owner.o.(*frameList)
		if fl.generic == nil && v.k == kFrame {
			fl.frames = append(fl.frames, v.o.(*Frame))
			return nil
		}
		g := fl.toGeneric()
		g.Items = append(g.Items, v.any())
	default:
		return d.fail(at, op, "appending to a %s", owner.typeName())
	}
	return nil
}

func (d *decoder) setItem(at int, op byte, owner val, k, v *val) error {
	if k.k == kDict || k.k == kList || k.k == kTList || k.k == kFrames || k.isDict() {
		return d.fail(at, op, "unhashable %s used as a dict key", k.typeName())
	}
	switch owner.k {
	case kDict:
		dd := owner.o.(*Dict)
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
