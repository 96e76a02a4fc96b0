package snapshot

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
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
	Err    error // the cause, when there is one: ErrBudget, or the context's error
}

func (e *DecodeError) Error() string {
	if e.Op != "" {
		return fmt.Sprintf("snapshot: byte %d: %s: %s", e.Offset, e.Op, e.Reason)
	}
	return fmt.Sprintf("snapshot: byte %d: %s", e.Offset, e.Reason)
}

// Unwrap returns the cause, if any.
func (e *DecodeError) Unwrap() error { return e.Err }

// ErrNotSnapshot is wrapped when a well-formed pickle does not hold a memory snapshot.
var ErrNotSnapshot = errors.New("snapshot: not a torch memory snapshot")

// Limits bound what a decode may build; every bound is checked before allocating.
// The stack and the marks are bounded here, apart from the budget (budget.go): at
// most 4 MiB and 512 KiB. CPython writes at most 1000 items per APPENDS or
// SETITEMS, so a real pickle's stack stays far below.
const (
	maxStack = 1 << 17 // values on the stack at once (nesting depth is bounded by it)
	maxMarks = 1 << 16 // open MARKs

	// pollEvery is how many opcodes run between two looks at the context.
	pollEvery = 4096
)

// Decode decodes a pickled snapshot. It never runs code and never panics on bad
// input; a refused or broken pickle gives a *DecodeError with the byte offset.
// What it builds is bounded by Budget(len(data)) (with what a large decode's
// prefaulter holds ready, charged when it starts: prefault.go).
func Decode(data []byte) (*Snapshot, error) {
	return DecodeContext(context.Background(), data)
}

// DecodeContext is Decode that stops when ctx is done: it looks at ctx every few
// thousand opcodes and then fails with a *DecodeError wrapping ctx's error.
func DecodeContext(ctx context.Context, data []byte) (*Snapshot, error) {
	return decodeBudget(ctx, data, Budget(len(data)))
}

func decodeBudget(ctx context.Context, data []byte, budget int64) (*Snapshot, error) {
	d := newDecoder(ctx, data, budget)
	defer d.pre.stop() // started once the decode has built enough (prefault)
	return d.run()
}

func newDecoder(ctx context.Context, data []byte, budget int64) *decoder {
	d := &decoder{data: data, slab: 16, budget: budget, left: budget, tick: 1}
	if ctx.Done() != nil {
		d.ctx = ctx
	}
	d.stack = make([]val, 0, 64)
	return d
}

type decoder struct {
	data   []byte
	pos    int
	stack  []val
	marks  []int
	memo   [][]val // memoChunk values each, so growing never copies
	nmemo  int     // values in memo
	sparse map[uint64]val
	top    bool // the top-level dict was made

	entries []TraceEntry // slab
	frames  []Frame      // slab
	flists  []frameList  // slab
	fptrs   []*Frame     // slab for frames lists' items
	slab    int
	pre     prefaulter      // arrays made ready on another core, once started (prefault)
	preDone bool            // the prefaulter was started, or will not be
	taken   int             // arrays taken from pre
	preWait bool            // tests: wait for pre's arrays instead of making them
	conv    map[convKey]any // typed conversions of shared lists, done once each

	budget int64 // bytes the decode may build in all
	left   int64 // bytes of the budget not yet spent

	ctx  context.Context // nil when it can never be done
	tick int             // opcodes left before the next look at ctx
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

// arg reads an opcode's little-endian argument of n (1, 2, 4 or 8) bytes.
func (d *decoder) arg(at int, op byte, n int) (uint64, error) {
	if len(d.data)-d.pos < n {
		return 0, d.need(at, op, uint64(n))
	}
	p := d.pos
	d.pos += n
	switch n {
	case 1:
		return uint64(d.data[p]), nil
	case 4:
		return uint64(binary.LittleEndian.Uint32(d.data[p:])), nil
	}
	return d.argSlow(p, n), nil
}

func (d *decoder) argSlow(p, n int) uint64 {
	if n == 2 {
		return uint64(binary.LittleEndian.Uint16(d.data[p:]))
	}
	return binary.LittleEndian.Uint64(d.data[p:])
}

func (d *decoder) push(at int, op byte, v val) error {
	if len(d.stack) == cap(d.stack) {
		return d.pushGrow(at, op, v)
	}
	d.stack = append(d.stack, v)
	return nil
}

func (d *decoder) pushGrow(at int, op byte, v val) error {
	if len(d.stack) >= maxStack {
		return d.fail(at, op, "stack deeper than %d values", maxStack)
	}
	d.stack = regrow(d.stack, min(2*cap(d.stack), maxStack))
	d.stack = append(d.stack, v)
	return nil
}

// regrow copies s into a new array of capacity c. The decoder grows its slices by
// doubling them, so all the arrays one slice grows through add up to at most twice
// its final size (append grows large slices by a quarter, which adds up to five).
func regrow[T any](s []T, c int) []T {
	ns := make([]T, len(s), c)
	copy(ns, s)
	return ns
}

// grown returns s with room for n more items, charging a new array, of elem bytes
// per item, to the budget before it is made; false when the budget is spent.
func grown[T any](d *decoder, s []T, n int, elem int64) ([]T, bool) {
	if cap(s)-len(s) >= n {
		return s, true
	}
	c := max(len(s)+n, 2*cap(s))
	if d.left -= int64(c) * elem; d.left < 0 {
		return s, false
	}
	return regrow(s, c), true
}

// poll looks at the context; it runs every pollEvery opcodes.
func (d *decoder) poll(at int) error {
	d.tick = pollEvery
	if d.ctx == nil {
		return nil
	}
	if err := d.ctx.Err(); err != nil {
		return &DecodeError{Offset: at, Reason: "stopped: " + err.Error(), Err: err}
	}
	return nil
}

func (d *decoder) run() (*Snapshot, error) {
	if err := d.checkProto(); err != nil {
		return nil, err
	}
	for {
		if d.pos >= len(d.data) {
			return nil, d.fail(d.pos, 0, "truncated: the pickle ends without STOP")
		}
		at := d.pos
		op := d.data[at]
		d.pos++
		if d.tick--; d.tick <= 0 {
			if err := d.poll(at); err != nil {
				return nil, err
			}
		}
		var err error
		switch op {
		case opBINGET:
			err = d.opGet(at, op, 1)
		case opLONG_BINGET:
			err = d.opGet(at, op, 4)
		case opMEMOIZE:
			err = d.opMemoize(at, op)
		case opBINPUT:
			err = d.opPut(at, op, 1)
		case opLONG_BINPUT:
			err = d.opPut(at, op, 4)
		case opMARK:
			err = d.opMark(at, op)
		case opSHORT_BINUNICODE:
			err = d.opString(at, op, 1)
		case opBINUNICODE:
			err = d.opString(at, op, 4)
		case opBINUNICODE8:
			err = d.opString(at, op, 8)
		case opBININT1:
			err = d.opUint(at, op, 1)
		case opBININT2:
			err = d.opUint(at, op, 2)
		case opBININT:
			err = d.opBinInt(at, op)
		case opLONG1:
			err = d.opLong1(at, op)
		case opBINFLOAT:
			err = d.opFloat(at, op)
		case opNONE:
			err = d.push(at, op, val{k: kNone})
		case opNEWTRUE:
			err = d.push(at, op, val{k: kBool, n: 1})
		case opNEWFALSE:
			err = d.push(at, op, val{k: kBool})
		case opEMPTY_DICT, opEMPTY_LIST:
			err = d.opContainer(at, op)
		case opEMPTY_TUPLE, opTUPLE1, opTUPLE2, opTUPLE3, opTUPLE:
			err = d.opTuple(at, op)
		case opSETITEMS:
			err = d.opSetItems(at, op)
		case opSETITEM:
			err = d.opSetItem(at, op)
		case opAPPENDS:
			err = d.opAppends(at, op)
		case opAPPEND:
			err = d.opAppend(at, op)
		case opFRAME:
			err = d.opFrame(at, op)
		case opPROTO:
			err = d.opProto(at, op)
		case opSTOP:
			return d.stop(at, op)
		default:
			return nil, d.refuse(at, op)
		}
		if err != nil {
			return nil, err
		}
	}
}

// checkProto refuses input that does not start with PROTO, as every protocol 2-5
// pickle does, before run reads any opcode.
func (d *decoder) checkProto() error {
	if len(d.data) < 2 || d.data[0] != opPROTO {
		if len(d.data) == 0 {
			return d.fail(0, 0, "empty input")
		}
		return d.fail(0, d.data[0], "not a protocol 2-5 pickle (no PROTO opcode first)")
	}
	return nil
}

func (d *decoder) refuse(at int, op byte) error {
	if name, ok := refused[op]; ok {
		if codeOps[name] {
			return d.fail(at, op, "refused: it could import or run code")
		}
		return d.fail(at, op, "refused: torch does not write this opcode in memory snapshots")
	}
	return d.fail(at, op, "unknown opcode")
}

func (d *decoder) opGet(at int, op byte, n int) error {
	idx, err := d.arg(at, op, n)
	if err != nil {
		return err
	}
	if idx < uint64(d.nmemo) {
		return d.push(at, op, d.memo[idx/memoChunk][idx%memoChunk])
	}
	return d.getSparse(at, op, idx)
}

func (d *decoder) getSparse(at int, op byte, idx uint64) error {
	if v, ok := d.sparse[idx]; ok {
		return d.push(at, op, v)
	}
	return d.fail(at, op, "memo entry %d was never stored", idx)
}

func (d *decoder) opMemoize(at int, op byte) error {
	if len(d.stack) == 0 {
		return d.fail(at, op, "empty stack")
	}
	return d.memoAppend(at, op, d.stack[len(d.stack)-1])
}

func (d *decoder) opPut(at int, op byte, n int) error {
	idx, err := d.arg(at, op, n)
	if err != nil {
		return err
	}
	if len(d.stack) == 0 {
		return d.fail(at, op, "empty stack")
	}
	return d.put(at, op, idx, d.stack[len(d.stack)-1])
}

func (d *decoder) opMark(at int, op byte) error {
	if len(d.marks) >= maxMarks {
		return d.fail(at, op, "more than %d open marks", maxMarks)
	}
	if len(d.marks) == cap(d.marks) {
		d.marks = regrow(d.marks, min(max(2*cap(d.marks), 16), maxMarks))
	}
	d.marks = append(d.marks, len(d.stack))
	return nil
}

func (d *decoder) opString(at int, op byte, w int) error {
	n, err := d.arg(at, op, w)
	if err != nil {
		return err
	}
	if err := d.need(at, op, n); err != nil {
		return err
	}
	if err := d.charge(at, op, int64(n)+sizeString); err != nil {
		return err
	}
	s := string(d.data[d.pos : d.pos+int(n)])
	d.pos += int(n)
	return d.push(at, op, val{k: kStr, o: s, n: int64(fieldID(s))})
}

func (d *decoder) opUint(at int, op byte, w int) error {
	v, err := d.arg(at, op, w)
	if err != nil {
		return err
	}
	return d.push(at, op, val{k: kInt, n: int64(v)})
}

func (d *decoder) opBinInt(at int, op byte) error {
	v, err := d.arg(at, op, 4)
	if err != nil {
		return err
	}
	return d.push(at, op, val{k: kInt, n: int64(int32(uint32(v)))})
}

func (d *decoder) opLong1(at int, op byte) error {
	n, err := d.arg(at, op, 1)
	if err != nil {
		return err
	}
	if err := d.need(at, op, n); err != nil {
		return err
	}
	v, ok := long1(d.data[d.pos : d.pos+int(n)])
	if !ok {
		return d.fail(at, op, "integer of %d bytes does not fit in 64 bits", n)
	}
	d.pos += int(n)
	return d.push(at, op, val{k: kInt, n: v})
}

func (d *decoder) opFloat(at int, op byte) error {
	if err := d.need(at, op, 8); err != nil {
		return err
	}
	v := binary.BigEndian.Uint64(d.data[d.pos:])
	d.pos += 8
	return d.push(at, op, val{k: kFloat, n: int64(v)})
}

func (d *decoder) opContainer(at int, op byte) error {
	v, err := d.container(at, op, op == opEMPTY_DICT)
	if err != nil {
		return err
	}
	return d.push(at, op, v)
}

func (d *decoder) opTuple(at int, op byte) error {
	m := len(d.stack)
	switch op {
	case opEMPTY_TUPLE:
		return d.push(at, op, val{k: kTuple, o: Tuple{}})
	case opTUPLE:
		var err error
		if m, err = d.popMark(at, op); err != nil {
			return err
		}
	default:
		n := int(op-opTUPLE1) + 1
		if len(d.stack) < n || (len(d.marks) > 0 && d.marks[len(d.marks)-1] > len(d.stack)-n) {
			return d.fail(at, op, "needs %d values on the stack", n)
		}
		m -= n
	}
	if err := d.charge(at, op, sizeSlice+sizeValue*int64(len(d.stack)-m)); err != nil {
		return err
	}
	t := make(Tuple, len(d.stack)-m)
	for i := range t {
		t[i] = d.stack[m+i].any()
	}
	d.stack = d.stack[:m]
	return d.push(at, op, val{k: kTuple, o: t})
}

func (d *decoder) opSetItems(at int, op byte) error {
	m, err := d.popMark(at, op)
	if err != nil {
		return err
	}
	if m == 0 {
		return d.fail(at, op, "no dict below the mark")
	}
	if (len(d.stack)-m)%2 != 0 {
		return d.fail(at, op, "odd number of keys and values")
	}
	owner := d.stack[m-1]
	for i := m; i < len(d.stack); i += 2 {
		if err := d.setItem(at, op, owner, &d.stack[i], &d.stack[i+1]); err != nil {
			return err
		}
	}
	d.stack = d.stack[:m]
	return d.spent(at, op)
}

func (d *decoder) opSetItem(at int, op byte) error {
	n := len(d.stack)
	if n < 3 || (len(d.marks) > 0 && d.marks[len(d.marks)-1] > n-3) {
		return d.fail(at, op, "needs a dict, a key and a value on the stack")
	}
	if err := d.setItem(at, op, d.stack[n-3], &d.stack[n-2], &d.stack[n-1]); err != nil {
		return err
	}
	d.stack = d.stack[:n-2]
	return d.spent(at, op)
}

func (d *decoder) opAppends(at int, op byte) error {
	m, err := d.popMark(at, op)
	if err != nil {
		return err
	}
	if m == 0 {
		return d.fail(at, op, "no list below the mark")
	}
	if err := d.appendItems(at, op, d.stack[m-1], d.stack[m:]); err != nil {
		return err
	}
	d.stack = d.stack[:m]
	return nil
}

func (d *decoder) opAppend(at int, op byte) error {
	n := len(d.stack)
	if n < 2 || (len(d.marks) > 0 && d.marks[len(d.marks)-1] > n-2) {
		return d.fail(at, op, "needs a list and a value on the stack")
	}
	if err := d.appendItems(at, op, d.stack[n-2], d.stack[n-1:]); err != nil {
		return err
	}
	d.stack = d.stack[:n-1]
	return nil
}

func (d *decoder) opFrame(at int, op byte) error {
	n, err := d.arg(at, op, 8)
	if err != nil {
		return err
	}
	return d.need(at, op, n)
}

func (d *decoder) opProto(at int, op byte) error {
	if at != 0 {
		return d.fail(at, op, "PROTO after the start")
	}
	if err := d.need(at, op, 1); err != nil {
		return err
	}
	if v := d.data[d.pos]; v < 2 || v > 5 {
		return d.fail(at, op, "protocol %d is not supported (2 to 5 are)", v)
	}
	d.pos++
	return nil
}

func (d *decoder) stop(at int, op byte) (*Snapshot, error) {
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

// memoChunk is how many values one piece of the memo holds.
const memoChunk = 1024

func (d *decoder) memoAppend(at int, op byte, v val) error {
	i := d.nmemo % memoChunk
	if i == 0 {
		if err := d.charge(at, op, memoChunk*sizeVal); err != nil {
			return err
		}
		chunk := take(d, d.pre.memo)
		if chunk == nil {
			chunk = make([]val, memoChunk)
		}
		d.memo = append(d.memo, chunk)
	}
	d.memo[len(d.memo)-1][i] = v
	d.nmemo++
	return nil
}

// put stores a memo entry; indexes beyond the dense memo go to a map, so a huge
// index costs one entry, not a huge slice.
func (d *decoder) put(at int, op byte, idx uint64, v val) error {
	switch {
	case idx < uint64(d.nmemo):
		d.memo[idx/memoChunk][idx%memoChunk] = v
	case idx == uint64(d.nmemo):
		return d.memoAppend(at, op, v)
	default:
		if _, ok := d.sparse[idx]; !ok {
			if err := d.charge(at, op, sizeSparse); err != nil {
				return err
			}
		}
		if d.sparse == nil {
			d.sparse = map[uint64]val{}
		}
		d.sparse[idx] = v
	}
	return nil
}
