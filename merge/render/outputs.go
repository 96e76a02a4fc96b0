// Package render writes a merge's outputs from its ranks' analyses and decoded
// traces: the HTML report, the Perfetto trace, the merged torch pickles and the
// protobuf timeline (and reads that timeline back).
package render

import (
	"bufio"
	"encoding/hex"
	"hash"
	"io"
	"os"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// OutFile is one output being written, hashed as it goes so publishing need not
// read it again.
type OutFile struct {
	F *os.File
	H hash.Hash
	n int64 // bytes written
}

func (o *OutFile) Write(p []byte) (int, error) {
	n, err := o.F.Write(p)
	o.H.Write(p[:n])
	o.n += int64(n)
	return n, err
}

// Sum is the SHA-256 of what was written, in hex.
func (o *OutFile) Sum() string { return hex.EncodeToString(o.H.Sum(nil)) }

// frameKey identifies a frame by value, for sharing frames across ranks.
type frameKey struct {
	name, file string
	line       int64
	has        uint8
}

// Interner shares frames (by value) and strings across all ranks of a merge.
type Interner struct {
	seen     map[*snapshot.Frame]*snapshot.Frame // decoded frame -> canonical frame
	frames   map[frameKey]*snapshot.Frame
	frameIDs map[*snapshot.Frame]uint32
	pbFrames []*pb.Frame
	strs     map[string]uint32
	strList  []string
}

// NewInterner returns an interner that knows nothing yet.
func NewInterner() *Interner {
	return &Interner{seen: map[*snapshot.Frame]*snapshot.Frame{}, frames: map[frameKey]*snapshot.Frame{}, frameIDs: map[*snapshot.Frame]uint32{}, strs: map[string]uint32{"": 0}, strList: []string{""}}
}

func (in *Interner) frame(f *snapshot.Frame) *snapshot.Frame {
	if f == nil || len(f.Extra) > 0 {
		return f
	}
	if c, ok := in.seen[f]; ok { // decoded frames are shared, so most lookups end here
		return c
	}
	k := frameKey{f.Name, f.Filename, f.Line, f.Has}
	c, ok := in.frames[k]
	if !ok {
		in.frames[k], c = f, f
	}
	in.seen[f] = c
	return c
}

// Forget drops what the interner knows of the decoded frames of the rank just
// merged (their canonical frames stay), so those can be collected.
func (in *Interner) Forget() { clear(in.seen) }

// FrameList interns a list of frames in place.
func (in *Interner) FrameList(fs []*snapshot.Frame) {
	for i, f := range fs {
		fs[i] = in.frame(f)
	}
}

func (in *Interner) str(s string) uint32 {
	if id, ok := in.strs[s]; ok {
		return id
	}
	id := uint32(len(in.strList))
	in.strs[s] = id
	in.strList = append(in.strList, s)
	return id
}

func (in *Interner) frameID(f *snapshot.Frame) uint32 {
	if id, ok := in.frameIDs[f]; ok {
		return id
	}
	id := uint32(len(in.pbFrames))
	in.frameIDs[f] = id
	pf := &pb.Frame{}
	if f != nil {
		pf.Name, pf.Filename, pf.Line = in.str(f.Name), in.str(f.Filename), f.Line
	}
	in.pbFrames = append(in.pbFrames, pf)
	return id
}

// TraceWriter streams merged.trace.json (Chrome/Perfetto trace events).
type TraceWriter struct {
	w     *bufio.Writer
	first bool
	buf   []byte
}

// Perfetto treats pid 0 specially, so rank r is process r+1 (pidOf); the trace's
// otherData and every process's labels say so.
func NewTraceWriter(w io.Writer) *TraceWriter {
	t := &TraceWriter{w: bufio.NewWriterSize(w, 256<<10), first: true}
	t.w.WriteString(`{"displayTimeUnit":"ms","otherData":{"producer":"memsnap","pid":"rank + 1"},"traceEvents":[`)
	return t
}

// pidOf is rank r's process id in the trace.
func pidOf(rank int) int64 { return int64(rank) + 1 }

func (t *TraceWriter) event(b []byte) {
	if !t.first {
		t.w.WriteString(",\n")
	}
	t.first = false
	t.w.Write(b)
}

// Process names rank's process in the trace.
func (t *TraceWriter) Process(rank int) {
	b := t.buf[:0]
	b = append(b, `{"name":"process_name","ph":"M","pid":`...)
	b = strconv.AppendInt(b, pidOf(rank), 10)
	b = append(b, `,"tid":0,"args":{"name":"rank `...)
	b = strconv.AppendInt(b, int64(rank), 10)
	b = append(b, `","rank":`...)
	b = strconv.AppendInt(b, int64(rank), 10)
	b = append(b, `}}`...)
	t.event(b)
	b = b[:0]
	b = append(b, `{"name":"process_labels","ph":"M","pid":`...)
	b = strconv.AppendInt(b, pidOf(rank), 10)
	b = append(b, `,"tid":0,"args":{"labels":"pid = rank + 1"}}`...)
	t.event(b)
	b = b[:0]
	b = append(b, `{"name":"process_sort_index","ph":"M","pid":`...)
	b = strconv.AppendInt(b, pidOf(rank), 10)
	b = append(b, `,"tid":0,"args":{"sort_index":`...)
	b = strconv.AppendInt(b, int64(rank), 10)
	b = append(b, `}}`...)
	t.event(b)
	for tid, name := range []string{"events", "batches"} {
		b = b[:0]
		b = append(b, `{"name":"thread_name","ph":"M","pid":`...)
		b = strconv.AppendInt(b, pidOf(rank), 10)
		b = append(b, `,"tid":`...)
		b = strconv.AppendInt(b, int64(tid), 10)
		b = append(b, `,"args":{"name":"`...)
		b = append(b, name...)
		b = append(b, `"}}`...)
		t.event(b)
	}
	t.buf = b
}

// Counter writes one point of rank's counter name at ts.
func (t *TraceWriter) Counter(rank int, name string, ts, v int64) {
	b := t.buf[:0]
	b = append(b, `{"name":"`...)
	b = append(b, name...)
	b = append(b, `","ph":"C","pid":`...)
	b = strconv.AppendInt(b, pidOf(rank), 10)
	b = append(b, `,"ts":`...)
	b = strconv.AppendInt(b, ts, 10)
	b = append(b, `,"args":{"bytes":`...)
	b = strconv.AppendInt(b, v, 10)
	b = append(b, `}}`...)
	t.event(b)
	t.buf = b
}

// OOM writes one of rank's out-of-memory events.
func (t *TraceWriter) OOM(rank int, o analysis.OOM) {
	b := t.buf[:0]
	b = append(b, `{"name":"OOM","ph":"i","s":"p","pid":`...)
	b = strconv.AppendInt(b, pidOf(rank), 10)
	b = append(b, `,"tid":0,"ts":`...)
	b = strconv.AppendInt(b, o.TimeUS, 10)
	b = append(b, `,"args":{"size":`...)
	b = strconv.AppendInt(b, o.Size, 10)
	b = append(b, `,"device_free":`...)
	b = strconv.AppendInt(b, o.DeviceFreeB, 10)
	b = append(b, `,"allocated":`...)
	b = strconv.AppendInt(b, o.AllocatedThen, 10)
	b = append(b, `}}`...)
	t.event(b)
	t.buf = b
}

// Batch writes one of rank's batches, its times shifted by shift.
func (t *TraceWriter) Batch(rank int, m sidecar.BatchMark, shift int64) {
	b := t.buf[:0]
	b = append(b, `{"name":"batch `...)
	b = strconv.AppendInt(b, m.Batch, 10)
	b = append(b, `","cat":"batch","ph":"X","pid":`...)
	b = strconv.AppendInt(b, pidOf(rank), 10)
	b = append(b, `,"tid":1,"ts":`...)
	b = strconv.AppendInt(b, m.StartUS+shift, 10)
	b = append(b, `,"dur":`...)
	b = strconv.AppendInt(b, m.EndUS-m.StartUS, 10)
	b = append(b, `,"args":{"batch":`...)
	b = strconv.AppendInt(b, m.Batch, 10)
	b = append(b, `}}`...)
	t.event(b)
	t.buf = b
}

// Finish ends the trace and flushes it.
func (t *TraceWriter) Finish() error {
	t.w.WriteString("]}\n")
	return t.w.Flush()
}

// PBWriter streams merged.memsnap.pb: each rank is written as one occurrence of the
// repeated Timeline.ranks field as soon as it is merged; the interned strings and
// frames follow at the end. Concatenated fields form one valid Timeline message.
type PBWriter struct {
	w   *bufio.Writer
	in  *Interner
	err error
	buf []byte // a rank's bytes, kept for the next rank
}

// NewPBWriter returns a writer of a timeline into w, its frames interned by in.
func NewPBWriter(w io.Writer, in *Interner) *PBWriter {
	return &PBWriter{w: bufio.NewWriterSize(w, 256<<10), in: in}
}

// actionCode is a trace entry's action as a timeline codes it: the Action whose
// lower-case name it is ("free_requested" is FREE_REQUESTED), else OTHER (its
// name then goes among the timeline's strings).
func actionCode(a string) pb.Action {
	if c, ok := pb.ParseLower[pb.Action](a); ok && c != pb.Action_ACTION_UNSPECIFIED {
		return c
	}
	return pb.Action_OTHER
}

func (p *PBWriter) field(num protowire.Number, m proto.Message) {
	if p.err != nil {
		return
	}
	b, err := proto.MarshalOptions{}.Marshal(m)
	if err != nil {
		p.err = err
		return
	}
	var hdr []byte
	hdr = protowire.AppendTag(hdr, num, protowire.BytesType)
	hdr = protowire.AppendVarint(hdr, uint64(len(b)))
	p.w.Write(hdr)
	p.w.Write(b)
	p.buf = b
}

// Header writes the timeline's header: its alignment, world size and missing
// ranks.
func (p *PBWriter) Header(align string, world int, missing []int) {
	m := &pb.Timeline{Version: 1, Align: align, WorldSize: int32(world)}
	for _, r := range missing {
		m.MissingRanks = append(m.MissingRanks, int32(r))
	}
	b, err := proto.Marshal(m)
	if err != nil {
		p.err = err
		return
	}
	p.w.Write(b)
}

// Rank writes one RankTimeline. Events are encoded by hand with protowire (field
// numbers as in memsnap.proto): a merge writes millions of them.
func (p *PBWriter) Rank(r *analysis.RankData, trace []*snapshot.TraceEntry, s analysis.RankSummary) {
	if p.err != nil {
		return
	}
	b := p.buf[:0]
	i64 := func(b []byte, num protowire.Number, v int64) []byte {
		if v == 0 {
			return b
		}
		b = protowire.AppendTag(b, num, protowire.VarintType)
		return protowire.AppendVarint(b, uint64(v))
	}
	b = i64(b, 1, int64(r.Rank))
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, r.Source)
	b = i64(b, 3, -r.ShiftUS)
	b = i64(b, 4, int64(r.Device))
	var fr []byte
	size := func(num protowire.Number, v int64) int {
		if v == 0 {
			return 0
		}
		return protowire.SizeTag(num) + protowire.SizeVarint(uint64(v))
	}
	for _, e := range trace { // each event's size first, then its fields straight into b
		code := actionCode(e.Action)
		devFree := int64(0)
		if e.Has&snapshot.EntryDeviceFree != 0 {
			devFree = e.DeviceFree
		}
		fr = fr[:0]
		for _, f := range e.Frames {
			fr = protowire.AppendVarint(fr, uint64(p.in.frameID(f)))
		}
		var other int64
		if code == pb.Action_OTHER { // after the frames: the strings are numbered as they are met
			other = int64(p.in.str(e.Action))
		}
		n := size(1, int64(code)) + size(2, e.Addr) + size(3, e.Size) + size(4, e.Stream) + size(5, e.TimeUS) + size(6, devFree) + size(8, other)
		if len(e.Frames) > 0 {
			n += protowire.SizeTag(7) + protowire.SizeBytes(len(fr))
		}
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(n))
		b = i64(b, 1, int64(code))
		b = i64(b, 2, e.Addr)
		b = i64(b, 3, e.Size)
		b = i64(b, 4, e.Stream)
		b = i64(b, 5, e.TimeUS)
		b = i64(b, 6, devFree)
		if len(e.Frames) > 0 {
			b = protowire.AppendTag(b, 7, protowire.BytesType)
			b = protowire.AppendBytes(b, fr)
		}
		b = i64(b, 8, other)
	}
	tail, err := proto.Marshal(rankRest(r, s))
	if err != nil {
		p.err = err
		return
	}
	b = append(b, tail...)
	var hdr []byte
	hdr = protowire.AppendTag(hdr, 5, protowire.BytesType) // Timeline.ranks
	hdr = protowire.AppendVarint(hdr, uint64(len(b)))
	p.w.Write(hdr)
	p.w.Write(b)
	p.buf = b
}

// rankRest is what Rank leaves to proto.Marshal, after the events it encodes by
// hand: the rank's figures, its segments, batches and memory samples.
func rankRest(r *analysis.RankData, s analysis.RankSummary) *pb.RankTimeline {
	rest := &pb.RankTimeline{
		StartAllocatedBytes: s.StartAllocatedBytes, PeakAllocatedBytes: s.PeakAllocatedBytes,
		EndAllocatedBytes: s.EndAllocatedBytes, EndReservedBytes: s.EndReservedBytes,
	}
	for _, g := range r.Segs {
		var act int64
		for _, bl := range g.Blocks {
			if bl.State == snapshot.BlockActiveAllocated {
				act += bl.Size
			}
		}
		rest.Segments = append(rest.Segments, &pb.Segment{Address: g.Address, TotalSize: g.TotalSize, AllocatedSize: g.AllocatedSize,
			Stream: g.Stream, SegmentType: g.SegmentType, IsExpandable: g.IsExpandable, ActiveAllocatedBytes: act})
	}
	if r.Meta != nil {
		for _, bm := range r.Meta.Batches {
			rest.Batches = append(rest.Batches, &pb.BatchMark{Batch: bm.Batch, StartUs: bm.StartUS, EndUs: bm.EndUS})
		}
		for _, m := range r.Meta.Samples {
			rest.Samples = append(rest.Samples, &pb.MemorySample{TimeUs: m.TimeUS, DeviceUsedBytes: m.DeviceUsedBytes, ProcessUsedBytes: m.ProcessUsedBytes})
		}
	}
	return rest
}

// Finish writes the interned strings and frames and flushes the timeline.
func (p *PBWriter) Finish() error {
	if p.err != nil {
		return p.err
	}
	var b []byte
	for _, s := range p.in.strList {
		b = protowire.AppendTag(b[:0], 6, protowire.BytesType)
		b = protowire.AppendString(b, s)
		p.w.Write(b)
	}
	for _, f := range p.in.pbFrames {
		p.field(7, f)
	}
	if p.err != nil {
		return p.err
	}
	return p.w.Flush()
}
