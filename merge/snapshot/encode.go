package snapshot

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
)

const (
	frameTarget = 64 << 10 // CPython's frame size target
	batchSize   = 1000     // items per APPENDS/SETITEMS, as CPython batches them
	maxDepth    = 512      // generic values nest no deeper than this
)

// Encode writes s as a protocol-4 pickle that CPython's pickle.load and memory_viz's
// JavaScript unpickler both read: strings are memoised by value and frames by
// identity (so files are smaller than torch's own), no protocol-5 opcode is used, and
// no integer needs more than 8 bytes. The output streams in 64 KiB frames.
func Encode(w io.Writer, s *Snapshot) error {
	bw := bufio.NewWriterSize(w, 256<<10)
	e := &encoder{out: bw, strs: map[string]uint32{}, frames: map[*Frame]uint32{}}
	e.buf = make([]byte, 0, frameTarget+4096)
	if _, err := bw.Write([]byte{opPROTO, 4}); err != nil {
		return err
	}
	e.snapshot(s)
	e.op(opSTOP)
	e.commit()
	if e.err != nil {
		return e.err
	}
	return bw.Flush()
}

// EncodeBytes is Encode into memory.
func EncodeBytes(s *Snapshot) ([]byte, error) {
	var b bytes.Buffer
	if err := Encode(&b, s); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

type encoder struct {
	out        *bufio.Writer
	buf        []byte // the current frame
	strs       map[string]uint32
	frames     map[*Frame]uint32
	objs       map[any]uint32  // generic containers already written, by identity
	lastFrames []*Frame        // the frames list written last, when it held no nil frame
	lastIDs    []uint32        // the memo ids of its frames
	keys       [nFields]uint32 // memo ids of known keys, plus one (0: not written yet)
	recent     [8]recentStr    // strings written last
	nextR      int             // where the next recent string goes
	next       uint32
	shift      int64 // added to every trace entry's time_us
	err        error
	// a typed object (entry, block, segment, snapshot) met as a generic value, inside
	// another's extra fields: memoNext is memoised as its dict opens (so one that
	// holds itself is written as a reference, and one shared is written once), and
	// nest is the depth its own extra fields are written at
	memoNext any
	nest     int
}

func (e *encoder) op(b byte) { e.buf = append(e.buf, b) }

// commit writes the current frame when it is big enough (or at the end).
func (e *encoder) maybeCommit() {
	if len(e.buf) >= frameTarget {
		e.commit()
	}
}

func (e *encoder) commit() {
	if len(e.buf) == 0 || e.err != nil {
		return
	}
	var hdr [9]byte
	hdr[0] = opFRAME
	binary.LittleEndian.PutUint64(hdr[1:], uint64(len(e.buf)))
	if _, err := e.out.Write(hdr[:]); err != nil {
		e.err = err
		return
	}
	if _, err := e.out.Write(e.buf); err != nil {
		e.err = err
	}
	e.buf = e.buf[:0]
}

func (e *encoder) memoize() uint32 {
	e.op(opMEMOIZE)
	id := e.next
	e.next++
	return id
}

func (e *encoder) get(id uint32) {
	if id < 256 {
		e.buf = append(e.buf, opBINGET, byte(id))
		return
	}
	e.buf = append(e.buf, opLONG_BINGET)
	e.buf = binary.LittleEndian.AppendUint32(e.buf, id)
}

// str writes a string, memoised by value; the strings written last are looked up
// in a small cache first (trace entries repeat a handful of action names).
func (e *encoder) str(s string) {
	for _, c := range &e.recent {
		if c.id != 0 && c.s == s {
			e.get(c.id - 1)
			return
		}
	}
	id, ok := e.strs[s]
	if ok {
		e.get(id)
	} else {
		if len(s) < 256 {
			e.buf = append(e.buf, opSHORT_BINUNICODE, byte(len(s)))
		} else {
			if uint64(len(s)) > math.MaxUint32 {
				e.err = fmt.Errorf("snapshot: a string of %d bytes is too long to encode", len(s))
				return
			}
			e.buf = append(e.buf, opBINUNICODE)
			e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(len(s)))
		}
		e.buf = append(e.buf, s...)
		id = e.memoize()
		e.strs[s] = id
	}
	e.recent[e.nextR] = recentStr{s, id + 1}
	e.nextR = (e.nextR + 1) % len(e.recent)
}

// recentStr is a string and its memo id plus one (0: an empty slot).
type recentStr struct {
	s  string
	id uint32
}

func (e *encoder) int(n int64) {
	switch {
	case n >= 0 && n < 256:
		e.buf = append(e.buf, opBININT1, byte(n))
	case n >= 0 && n < 65536:
		e.buf = append(e.buf, opBININT2, byte(n), byte(n>>8))
	case n >= math.MinInt32 && n <= math.MaxInt32:
		e.buf = append(e.buf, opBININT)
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(int32(n)))
	default:
		// LONG1 with the fewest two's-complement bytes (at most 8)
		var tmp [8]byte
		binary.LittleEndian.PutUint64(tmp[:], uint64(n))
		k := 8
		for k > 1 {
			top, next := tmp[k-1], tmp[k-2]
			if (top == 0 && next&0x80 == 0) || (top == 0xff && next&0x80 != 0) {
				k--
				continue
			}
			break
		}
		e.buf = append(e.buf, opLONG1, byte(k))
		e.buf = append(e.buf, tmp[:k]...)
	}
}

func (e *encoder) float(f float64) {
	e.buf = append(e.buf, opBINFLOAT)
	e.buf = binary.BigEndian.AppendUint64(e.buf, math.Float64bits(f))
}

func (e *encoder) bool(b bool) {
	if b {
		e.op(opNEWTRUE)
	} else {
		e.op(opNEWFALSE)
	}
}

// dict helpers: open writes EMPTY_DICT and, for n > 0 items, a MARK; key counts an
// item and splits batches; close ends the last batch.
type dictState struct{ n, inBatch int }

func (e *encoder) openDict(n int) dictState {
	e.op(opEMPTY_DICT)
	if e.memoNext != nil {
		e.remember(e.memoNext)
		e.memoNext = nil
	}
	if n > 0 {
		e.op(opMARK)
	}
	return dictState{n: n}
}

// key writes the key of a known field, memoised once per encoding.
func (e *encoder) key(st *dictState, f int) {
	if st.inBatch == batchSize {
		e.op(opSETITEMS)
		e.op(opMARK)
		st.inBatch = 0
	}
	st.inBatch++
	if id := e.keys[f]; id != 0 {
		e.get(id - 1)
		return
	}
	e.str(fieldNames[f])
	e.keys[f] = e.strs[fieldNames[f]] + 1
}

func (e *encoder) keyAny(st *dictState, k Value, depth int) {
	if st.inBatch == batchSize {
		e.op(opSETITEMS)
		e.op(opMARK)
		st.inBatch = 0
	}
	st.inBatch++
	e.value(k, depth)
}

func (e *encoder) closeDict(st dictState) {
	if st.n > 0 {
		e.op(opSETITEMS)
	}
}

func (e *encoder) extras(st *dictState, x []Item, depth int) {
	for _, it := range x {
		e.keyAny(st, it.Key, depth)
		e.value(it.Value, depth)
	}
}

// intField, strField and framesField write a known field's item when on says the
// value has it.
func (e *encoder) intField(st *dictState, on bool, k int, v int64) {
	if on {
		e.key(st, k)
		e.int(v)
	}
}

func (e *encoder) strField(st *dictState, on bool, k int, v string) {
	if on {
		e.key(st, k)
		e.str(v)
	}
}

func (e *encoder) framesField(st *dictState, on bool, fs []*Frame) {
	if on {
		e.key(st, fFrames)
		e.frameList(fs)
	}
}

// remember memoises the object just written (generic containers may be shared or
// even contain themselves; writing each once keeps the output linear).
func (e *encoder) remember(key any) {
	if e.objs == nil {
		e.objs = map[any]uint32{}
	}
	e.objs[key] = e.memoize()
}

// list writes n items with EMPTY_LIST and batched APPENDS.
func (e *encoder) list(n int, item func(i int)) { e.listMemo(nil, n, item) }

// listMemo is list, memoising the list under key when key is not nil.
func (e *encoder) listMemo(key any, n int, item func(i int)) {
	e.op(opEMPTY_LIST)
	if key != nil {
		e.remember(key)
	}
	for i := 0; i < n; i += batchSize {
		end := min(i+batchSize, n)
		if end-i == 1 {
			item(i)
			e.op(opAPPEND)
		} else {
			e.op(opMARK)
			for j := i; j < end; j++ {
				item(j)
				e.maybeCommit()
			}
			e.op(opAPPENDS)
		}
		e.maybeCommit()
	}
}

func (e *encoder) snapshot(s *Snapshot) {
	st := e.openDict(bits.OnesCount8(s.Has) + len(s.Extra))
	if s.Has&SnapSegments != 0 {
		e.key(&st, fSegments)
		e.list(len(s.Segments), func(i int) { e.segment(s.Segments[i]) })
	}
	if s.Has&SnapDeviceTraces != 0 {
		e.key(&st, fDeviceTraces)
		e.list(len(s.DeviceTraces), func(i int) {
			tr := s.DeviceTraces[i]
			e.list(len(tr), func(j int) { e.entry(tr[j]) })
		})
	}
	if s.Has&SnapAllocatorSettings != 0 {
		e.key(&st, fAllocatorSettings)
		e.value(s.AllocatorSettings, e.nest+1)
	}
	if s.Has&SnapExternalAnnotations != 0 {
		e.key(&st, fExternalAnnotations)
		e.value(s.ExternalAnnotations, e.nest+1)
	}
	e.extras(&st, s.Extra, e.nest+1)
	e.closeDict(st)
}

// frameList writes a frames list. Consecutive trace entries often hold the same
// frames (nine in ten, in a transformer's trace), so the list written last and its
// frames' memo ids are kept, and a list equal to it is written without looking
// its frames up again.
func (e *encoder) frameList(fs []*Frame) {
	if len(fs) > 0 && slices.Equal(fs, e.lastFrames) {
		ids := e.lastIDs
		e.list(len(fs), func(i int) { e.get(ids[i]) })
		return
	}
	e.lastIDs, e.lastFrames = e.lastIDs[:0], e.lastFrames[:0]
	whole := true
	e.list(len(fs), func(i int) {
		id, ok := e.frame(fs[i])
		e.lastIDs = append(e.lastIDs, id)
		whole = whole && ok
	})
	if whole {
		e.lastFrames = append(e.lastFrames, fs...)
	}
}

// frame writes a frame, memoised by identity, and returns its memo id; false for
// a nil frame, written as None.
func (e *encoder) frame(f *Frame) (uint32, bool) {
	if f == nil {
		e.op(opNONE)
		return 0, false
	}
	if id, ok := e.frames[f]; ok {
		e.get(id)
		return id, true
	}
	e.op(opEMPTY_DICT)
	id := e.memoize()
	e.frames[f] = id
	e.frameItems(f)
	return id, true
}

// frameItems writes the items of a frame being written for the first time.
func (e *encoder) frameItems(f *Frame) {
	n := bits.OnesCount8(f.Has) + len(f.Extra)
	st := dictState{n: n}
	if n > 0 {
		e.op(opMARK)
	}
	e.strField(&st, f.Has&FrameName != 0, fName, f.Name)
	e.strField(&st, f.Has&FrameFilename != 0, fFilename, f.Filename)
	e.intField(&st, f.Has&FrameLine != 0, fLine, f.Line)
	e.extras(&st, f.Extra, 2)
	e.closeDict(st)
}

func (e *encoder) entry(t *TraceEntry) {
	st := e.openDict(bits.OnesCount16(t.Has) + len(t.Extra))
	h := t.Has
	e.strField(&st, h&EntryAction != 0, fAction, t.Action)
	e.intField(&st, h&EntryAddr != 0, fAddr, t.Addr)
	e.intField(&st, h&EntryDeviceFree != 0, fDeviceFree, t.DeviceFree)
	e.intField(&st, h&EntrySize != 0, fSize, t.Size)
	e.intField(&st, h&EntryStream != 0, fStream, t.Stream)
	e.intField(&st, h&EntryTimeUS != 0, fTimeUS, t.TimeUS+e.shift)
	e.strField(&st, h&EntryCompileContext != 0, fCompileContext, t.CompileContext)
	e.strField(&st, h&EntryUserMetadata != 0, fUserMetadata, t.UserMetadata)
	e.framesField(&st, h&EntryFrames != 0, t.Frames)
	e.extras(&st, t.Extra, e.nest+2)
	e.closeDict(st)
}

func (e *encoder) block(b *Block) {
	st := e.openDict(bits.OnesCount8(b.Has) + len(b.Extra))
	e.intField(&st, b.Has&BlockAddress != 0, fAddress, b.Address)
	e.intField(&st, b.Has&BlockSize != 0, fSize, b.Size)
	e.intField(&st, b.Has&BlockRequestedSize != 0, fRequestedSize, b.RequestedSize)
	e.strField(&st, b.Has&BlockState != 0, fState, b.State)
	e.framesField(&st, b.Has&BlockFrames != 0, b.Frames)
	e.extras(&st, b.Extra, e.nest+2)
	e.closeDict(st)
}

func (e *encoder) segment(g *Segment) {
	st := e.openDict(bits.OnesCount16(g.Has) + len(g.Extra))
	h := g.Has
	ints := []struct {
		bit uint16
		k   int
		v   int64
	}{
		{SegDevice, fDevice, g.Device}, {SegAddress, fAddress, g.Address}, {SegTotalSize, fTotalSize, g.TotalSize},
		{SegAllocatedSize, fAllocatedSize, g.AllocatedSize}, {SegActiveSize, fActiveSize, g.ActiveSize},
		{SegRequestedSize, fRequestedSize, g.RequestedSize}, {SegStream, fStream, g.Stream},
	}
	for _, f := range ints {
		e.intField(&st, h&f.bit != 0, f.k, f.v)
	}
	e.strField(&st, h&SegSegmentType != 0, fSegmentType, g.SegmentType)
	if h&SegSegmentPoolID != 0 {
		e.key(&st, fSegmentPoolID)
		e.value(g.SegmentPoolID, e.nest+2)
	}
	if h&SegIsExpandable != 0 {
		e.key(&st, fIsExpandable)
		e.bool(g.IsExpandable)
	}
	e.framesField(&st, h&SegFrames != 0, g.Frames)
	if h&SegBlocks != 0 {
		e.key(&st, fBlocks)
		e.list(len(g.Blocks), func(i int) { e.block(g.Blocks[i]) })
	}
	e.extras(&st, g.Extra, e.nest+2)
	e.closeDict(st)
}

// value writes a generic value.
func (e *encoder) value(v Value, depth int) {
	if depth > maxDepth {
		if e.err == nil {
			e.err = fmt.Errorf("snapshot: values nest deeper than %d", maxDepth)
		}
		return
	}
	switch x := v.(type) {
	case nil:
		e.op(opNONE)
	case bool:
		e.bool(x)
	case int64:
		e.int(x)
	case int:
		e.int(int64(x))
	case float64:
		e.float(x)
	case string:
		e.str(x)
	case Tuple:
		e.tuple(x, depth)
	case *List:
		if id, ok := e.objs[x]; ok {
			e.get(id)
			return
		}
		e.listMemo(x, len(x.Items), func(i int) { e.value(x.Items[i], depth+1) })
	case *Dict:
		e.dict(x, depth)
	case *Frame:
		e.frame(x)
	case *TraceEntry, *Block, *Segment, *Snapshot:
		e.object(v, depth)
	default:
		if e.err == nil {
			e.err = fmt.Errorf("snapshot: cannot encode a %T", v)
		}
	}
}

// tuple writes a generic tuple at depth, memoised by its first item's address so
// a tuple shared between values is written once.
func (e *encoder) tuple(x Tuple, depth int) {
	if len(x) > 0 {
		if id, ok := e.objs[&x[0]]; ok {
			e.get(id)
			return
		}
	}
	switch len(x) {
	case 0:
		e.op(opEMPTY_TUPLE)
	case 1, 2, 3:
		for _, it := range x {
			e.value(it, depth+1)
		}
		e.op(opTUPLE1 + byte(len(x)-1))
	default:
		e.op(opMARK)
		for _, it := range x {
			e.value(it, depth+1)
		}
		e.op(opTUPLE)
	}
	if len(x) > 0 {
		e.remember(&x[0])
	}
}

// dict writes a generic dict at depth, memoised so a shared (or self-containing)
// dict is written once.
func (e *encoder) dict(x *Dict, depth int) {
	if id, ok := e.objs[x]; ok {
		e.get(id)
		return
	}
	e.op(opEMPTY_DICT)
	e.remember(x)
	st := dictState{n: len(x.Items)}
	if st.n > 0 {
		e.op(opMARK)
	}
	for _, it := range x.Items {
		e.keyAny(&st, it.Key, depth+1)
		e.value(it.Value, depth+1)
	}
	e.closeDict(st)
}

// object writes a trace entry, block, segment or snapshot met inside a generic
// value, memoised by identity and nested one level below depth.
func (e *encoder) object(v Value, depth int) {
	if id, ok := e.objs[v]; ok {
		e.get(id)
		return
	}
	saved := e.nest
	e.nest, e.memoNext = depth+1, v
	switch x := v.(type) {
	case *TraceEntry:
		e.entry(x)
	case *Block:
		e.block(x)
	case *Segment:
		e.segment(x)
	case *Snapshot:
		e.snapshot(x)
	}
	e.nest = saved
}

// Writer writes a snapshot pickle incrementally: device traces one at a time, then
// the segments and the rest, so a merge never holds more than one trace in memory.
// Frames are memoised by identity across all traces: callers that want frames
// shared between traces pass the same *Frame.
type Writer struct {
	e      *encoder
	bw     *bufio.Writer
	traces int
}

// NewWriter starts a snapshot pickle on w.
func NewWriter(w io.Writer) (*Writer, error) {
	bw := bufio.NewWriterSize(w, 256<<10)
	e := &encoder{out: bw, strs: map[string]uint32{}, frames: map[*Frame]uint32{}}
	e.buf = make([]byte, 0, frameTarget+4096)
	if _, err := bw.Write([]byte{opPROTO, 4}); err != nil {
		return nil, err
	}
	e.op(opEMPTY_DICT)
	e.op(opMARK)
	e.str("device_traces")
	e.op(opEMPTY_LIST)
	e.op(opMARK)
	return &Writer{e: e, bw: bw}, nil
}

// Trace appends the next device trace; shiftUS is added to every time_us.
func (w *Writer) Trace(tr []*TraceEntry, shiftUS int64) error {
	if w.traces > 0 && w.traces%batchSize == 0 {
		w.e.op(opAPPENDS)
		w.e.op(opMARK)
	}
	w.traces++
	w.e.shift = shiftUS
	w.e.list(len(tr), func(j int) { w.e.entry(tr[j]) })
	w.e.shift = 0
	w.e.maybeCommit()
	return w.e.err
}

// Finish writes the segments and the other top-level keys and ends the pickle.
func (w *Writer) Finish(segments []*Segment, allocatorSettings, externalAnnotations Value, extra []Item) error {
	e := w.e
	e.op(opAPPENDS)
	e.str("segments")
	e.list(len(segments), func(i int) { e.segment(segments[i]) })
	if allocatorSettings != nil {
		e.str("allocator_settings")
		e.value(allocatorSettings, 1)
	}
	if externalAnnotations != nil {
		e.str("external_annotations")
		e.value(externalAnnotations, 1)
	}
	for _, it := range extra {
		e.value(it.Key, 1)
		e.value(it.Value, 1)
	}
	e.op(opSETITEMS)
	e.op(opSTOP)
	e.commit()
	if e.err != nil {
		return e.err
	}
	return w.bw.Flush()
}
