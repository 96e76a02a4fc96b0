package snapshot

// Field ids of the keys the model knows; fieldID maps a key to its id once, when
// the key string is read, so setting a field is a switch on a small int.
const (
	fNone = iota
	fSegments
	fDeviceTraces
	fAllocatorSettings
	fExternalAnnotations
	fDevice
	fAddress
	fTotalSize
	fAllocatedSize
	fActiveSize
	fRequestedSize
	fStream
	fSegmentType
	fSegmentPoolID
	fIsExpandable
	fFrames
	fBlocks
	fSize
	fState
	fAction
	fAddr
	fTimeUS
	fDeviceFree
	fCompileContext
	fUserMetadata
	fName
	fFilename
	fLine
	nFields
)

// fieldNames names each field id.
var fieldNames = [nFields]string{
	fSegments: "segments", fDeviceTraces: "device_traces", fAllocatorSettings: "allocator_settings",
	fExternalAnnotations: "external_annotations", fDevice: "device", fAddress: "address",
	fTotalSize: "total_size", fAllocatedSize: "allocated_size", fActiveSize: "active_size",
	fRequestedSize: "requested_size", fStream: "stream", fSegmentType: "segment_type",
	fSegmentPoolID: "segment_pool_id", fIsExpandable: "is_expandable", fFrames: "frames",
	fBlocks: "blocks", fSize: "size", fState: "state", fAction: "action", fAddr: "addr",
	fTimeUS: "time_us", fDeviceFree: "device_free", fCompileContext: "compile_context",
	fUserMetadata: "user_metadata", fName: "name", fFilename: "filename", fLine: "line",
}

func fieldID(s string) int {
	switch s {
	case "segments":
		return fSegments
	case "device_traces":
		return fDeviceTraces
	case "allocator_settings":
		return fAllocatorSettings
	case "external_annotations":
		return fExternalAnnotations
	case "device":
		return fDevice
	case "address":
		return fAddress
	case "total_size":
		return fTotalSize
	case "allocated_size":
		return fAllocatedSize
	case "active_size":
		return fActiveSize
	case "requested_size":
		return fRequestedSize
	case "stream":
		return fStream
	case "segment_type":
		return fSegmentType
	case "segment_pool_id":
		return fSegmentPoolID
	case "is_expandable":
		return fIsExpandable
	case "frames":
		return fFrames
	case "blocks":
		return fBlocks
	case "size":
		return fSize
	case "state":
		return fState
	case "action":
		return fAction
	case "addr":
		return fAddr
	case "time_us":
		return fTimeUS
	case "device_free":
		return fDeviceFree
	case "compile_context":
		return fCompileContext
	case "user_metadata":
		return fUserMetadata
	case "name":
		return fName
	case "filename":
		return fFilename
	case "line":
		return fLine
	}
	return fNone
}

func fid(k *val) int {
	if k.k != kStr {
		return fNone
	}
	return int(k.n)
}

// extra keeps an item the model has no field for. Past the budget it drops it: the
// opcode's handler then refuses the pickle.
func (d *decoder) extra(x []Item, k, v *val) []Item {
	x, ok := grown(d, x, 1, sizeItem)
	if !ok {
		return x
	}
	return append(x, Item{k.any(), v.any()})
}

func (s *Snapshot) set(d *decoder, k, v *val) {
	switch fid(k) {
	case fSegments:
		if segs, ok := d.asSegments(v); ok {
			s.Segments, s.Has = segs, s.Has|SnapSegments
			return
		}
	case fDeviceTraces:
		if tr, ok := d.asTraces(v); ok {
			s.DeviceTraces, s.Has = tr, s.Has|SnapDeviceTraces
			return
		}
	case fAllocatorSettings:
		s.AllocatorSettings, s.Has = v.any(), s.Has|SnapAllocatorSettings
		return
	case fExternalAnnotations:
		s.ExternalAnnotations, s.Has = v.any(), s.Has|SnapExternalAnnotations
		return
	}
	s.Extra = d.extra(s.Extra, k, v)
}

func (g *Segment) set(d *decoder, k, v *val) {
	switch fid(k) {
	case fDevice:
		if v.k == kInt {
			g.Device, g.Has = v.n, g.Has|SegDevice
			return
		}
	case fAddress:
		if v.k == kInt {
			g.Address, g.Has = v.n, g.Has|SegAddress
			return
		}
	case fTotalSize:
		if v.k == kInt {
			g.TotalSize, g.Has = v.n, g.Has|SegTotalSize
			return
		}
	case fAllocatedSize:
		if v.k == kInt {
			g.AllocatedSize, g.Has = v.n, g.Has|SegAllocatedSize
			return
		}
	case fActiveSize:
		if v.k == kInt {
			g.ActiveSize, g.Has = v.n, g.Has|SegActiveSize
			return
		}
	case fRequestedSize:
		if v.k == kInt {
			g.RequestedSize, g.Has = v.n, g.Has|SegRequestedSize
			return
		}
	case fStream:
		if v.k == kInt {
			g.Stream, g.Has = v.n, g.Has|SegStream
			return
		}
	case fSegmentType:
		if v.k == kStr {
			g.SegmentType, g.Has = v.str(), g.Has|SegSegmentType
			return
		}
	case fSegmentPoolID:
		g.SegmentPoolID, g.Has = v.any(), g.Has|SegSegmentPoolID
		return
	case fIsExpandable:
		if v.k == kBool {
			g.IsExpandable, g.Has = v.n != 0, g.Has|SegIsExpandable
			return
		}
	case fFrames:
		if fr, ok := d.asFrames(v); ok {
			g.Frames, g.Has = fr, g.Has|SegFrames
			return
		}
	case fBlocks:
		if bl, ok := d.asBlocks(v); ok {
			g.Blocks, g.Has = bl, g.Has|SegBlocks
			return
		}
	}
	g.Extra = d.extra(g.Extra, k, v)
}

func (b *Block) set(d *decoder, k, v *val) {
	switch fid(k) {
	case fAddress:
		if v.k == kInt {
			b.Address, b.Has = v.n, b.Has|BlockAddress
			return
		}
	case fSize:
		if v.k == kInt {
			b.Size, b.Has = v.n, b.Has|BlockSize
			return
		}
	case fRequestedSize:
		if v.k == kInt {
			b.RequestedSize, b.Has = v.n, b.Has|BlockRequestedSize
			return
		}
	case fState:
		if v.k == kStr {
			b.State, b.Has = v.str(), b.Has|BlockState
			return
		}
	case fFrames:
		if fr, ok := d.asFrames(v); ok {
			b.Frames, b.Has = fr, b.Has|BlockFrames
			return
		}
	}
	b.Extra = d.extra(b.Extra, k, v)
}

func (e *TraceEntry) set(d *decoder, k, v *val) {
	switch fid(k) {
	case fAction:
		if v.k == kStr {
			e.Action, e.Has = v.str(), e.Has|EntryAction
			return
		}
	case fAddr:
		if v.k == kInt {
			e.Addr, e.Has = v.n, e.Has|EntryAddr
			return
		}
	case fSize:
		if v.k == kInt {
			e.Size, e.Has = v.n, e.Has|EntrySize
			return
		}
	case fStream:
		if v.k == kInt {
			e.Stream, e.Has = v.n, e.Has|EntryStream
			return
		}
	case fTimeUS:
		if v.k == kInt {
			e.TimeUS, e.Has = v.n, e.Has|EntryTimeUS
			return
		}
	case fDeviceFree:
		if v.k == kInt {
			e.DeviceFree, e.Has = v.n, e.Has|EntryDeviceFree
			return
		}
	case fCompileContext:
		if v.k == kStr {
			e.CompileContext, e.Has = v.str(), e.Has|EntryCompileContext
			return
		}
	case fUserMetadata:
		if v.k == kStr {
			e.UserMetadata, e.Has = v.str(), e.Has|EntryUserMetadata
			return
		}
	case fFrames:
		if fr, ok := d.asFrames(v); ok {
			e.Frames, e.Has = fr, e.Has|EntryFrames
			return
		}
	}
	e.Extra = d.extra(e.Extra, k, v)
}

func (f *Frame) set(d *decoder, k, v *val) {
	switch fid(k) {
	case fName:
		if v.k == kStr {
			f.Name, f.Has = v.str(), f.Has|FrameName
			return
		}
	case fFilename:
		if v.k == kStr {
			f.Filename, f.Has = v.str(), f.Has|FrameFilename
			return
		}
	case fLine:
		if v.k == kInt {
			f.Line, f.Has = v.n, f.Has|FrameLine
			return
		}
	}
	f.Extra = d.extra(f.Extra, k, v)
}

// The as* methods take a list value for a typed field; a list that is not all of
// the expected shape is refused (false) and the caller keeps it as Extra. A list
// referenced many times (through the memo) is converted once: conversions are
// cached per *List and target, so no input can make the decoder copy one list per
// reference.

func listOf(v *val) (*List, bool) {
	switch v.k {
	case kList:
		return v.o.(*List), true
	case kTList:
		return &v.o.(*tlist).l, true
	case kFrames:
		if g := v.o.(*frameList).generic; g != nil {
			return g, true
		}
	}
	return nil, false
}

// convKey names one conversion: a list, and what it is converted to (one list may
// be asked for as frames in one place and as blocks in another).
type convKey struct {
	l  *List
	as schema
}

// convert runs f on l's items once per *List and target.
func (d *decoder) convert(l *List, as schema, f func([]Value) (any, bool)) (any, bool) {
	k := convKey{l, as}
	if c, ok := d.conv[k]; ok {
		return c, c != nil
	}
	d.spend(sizeSparse + 8*int64(len(l.Items)))
	out, ok := f(l.Items)
	if d.conv == nil {
		d.conv = map[convKey]any{}
	}
	if !ok {
		out = nil
	}
	d.conv[k] = out
	return out, ok
}

func (d *decoder) dictFields(x *Dict, set func(k, v *val)) {
	for _, kv := range x.Items {
		k, vv := valOf(kv.Key), valOf(kv.Value)
		set(&k, &vv)
	}
}

// record is what a list of a snapshot's dicts becomes: a *Frame, *Segment,
// *Block or *TraceEntry, each dict's fields set on a new one.
type record[T any] interface {
	*T
	set(d *decoder, k, v *val)
}

// asRecords converts l's items to records (once per list and schema): a record
// as it is, a dict as a new record of size bytes with its fields set; any other
// item fails the list.
func asRecords[T any, P record[T]](d *decoder, l *List, as schema, size int64) ([]P, bool) {
	c, ok := d.convert(l, as, func(items []Value) (any, bool) {
		out := make([]P, len(items))
		for i, it := range items {
			switch x := it.(type) {
			case P:
				out[i] = x
			case *Dict:
				d.spend(size)
				r := P(new(T))
				d.dictFields(x, func(k, v *val) { r.set(d, k, v) })
				out[i] = r
			default:
				return nil, false
			}
		}
		return out, true
	})
	if !ok {
		return nil, false
	}
	return c.([]P), true
}

func (d *decoder) asFrames(v *val) ([]*Frame, bool) {
	if v.k == kFrames && v.o.(*frameList).generic == nil {
		return v.o.(*frameList).frames, true
	}
	l, ok := listOf(v)
	if !ok {
		return nil, false
	}
	return asRecords[Frame](d, l, schFrames, sizeFrame)
}

func (d *decoder) asSegments(v *val) ([]*Segment, bool) {
	l, ok := listOf(v)
	if !ok {
		return nil, false
	}
	return asRecords[Segment](d, l, schSegList, sizeSegment)
}

func (d *decoder) asBlocks(v *val) ([]*Block, bool) {
	l, ok := listOf(v)
	if !ok {
		return nil, false
	}
	return asRecords[Block](d, l, schBlockList, sizeBlock)
}

func (d *decoder) asEntries(l *List) ([]*TraceEntry, bool) {
	return asRecords[TraceEntry](d, l, schTrace, sizeEntry)
}

func (d *decoder) asTraces(v *val) ([][]*TraceEntry, bool) {
	l, ok := listOf(v)
	if !ok {
		return nil, false
	}
	c, ok := d.convert(l, schTraces, func(items []Value) (any, bool) {
		out := make([][]*TraceEntry, len(items))
		for i, it := range items {
			il, ok := it.(*List)
			if !ok {
				return nil, false
			}
			if out[i], ok = d.asEntries(il); !ok {
				return nil, false
			}
		}
		return out, true
	})
	if !ok {
		return nil, false
	}
	return c.([][]*TraceEntry), true
}

// references counts the entries, segments, blocks and frame references the
// snapshot holds, each shared one as often as it is referenced; it stops counting
// past limit.
func (s *Snapshot) references(limit int) int {
	n := len(s.Segments)
	for _, g := range s.Segments {
		n += len(g.Frames) + len(g.Blocks)
		for _, b := range g.Blocks {
			n += len(b.Frames)
		}
		if n > limit {
			return n
		}
	}
	for _, tr := range s.DeviceTraces {
		n += len(tr)
		if n > limit {
			return n
		}
		for _, e := range tr {
			n += len(e.Frames)
		}
		if n > limit {
			return n
		}
	}
	return n
}
