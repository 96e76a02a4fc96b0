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
)

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

func extra(x []Item, k, v *val) []Item { return append(x, Item{k.any(), v.any()}) }

func (s *Snapshot) set(k, v *val) {
	switch fid(k) {
	case fSegments:
		if segs, ok := asSegments(v); ok {
			s.Segments, s.Has = segs, s.Has|SnapSegments
			return
		}
	case fDeviceTraces:
		if tr, ok := asTraces(v); ok {
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
	s.Extra = extra(s.Extra, k, v)
}

func (g *Segment) set(k, v *val) {
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
			g.SegmentType, g.Has = v.s, g.Has|SegSegmentType
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
		if fr, ok := asFrames(v); ok {
			g.Frames, g.Has = fr, g.Has|SegFrames
			return
		}
	case fBlocks:
		if bl, ok := asBlocks(v); ok {
			g.Blocks, g.Has = bl, g.Has|SegBlocks
			return
		}
	}
	g.Extra = extra(g.Extra, k, v)
}

func (b *Block) set(k, v *val) {
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
			b.State, b.Has = v.s, b.Has|BlockState
			return
		}
	case fFrames:
		if fr, ok := asFrames(v); ok {
			b.Frames, b.Has = fr, b.Has|BlockFrames
			return
		}
	}
	b.Extra = extra(b.Extra, k, v)
}

func (e *TraceEntry) set(k, v *val) {
	switch fid(k) {
	case fAction:
		if v.k == kStr {
			e.Action, e.Has = v.s, e.Has|EntryAction
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
			e.CompileContext, e.Has = v.s, e.Has|EntryCompileContext
			return
		}
	case fUserMetadata:
		if v.k == kStr {
			e.UserMetadata, e.Has = v.s, e.Has|EntryUserMetadata
			return
		}
	case fFrames:
		if fr, ok := asFrames(v); ok {
			e.Frames, e.Has = fr, e.Has|EntryFrames
			return
		}
	}
	e.Extra = extra(e.Extra, k, v)
}

func (f *Frame) set(k, v *val) {
	switch fid(k) {
	case fName:
		if v.k == kStr {
			f.Name, f.Has = v.s, f.Has|FrameName
			return
		}
	case fFilename:
		if v.k == kStr {
			f.Filename, f.Has = v.s, f.Has|FrameFilename
			return
		}
	case fLine:
		if v.k == kInt {
			f.Line, f.Has = v.n, f.Has|FrameLine
			return
		}
	}
	f.Extra = extra(f.Extra, k, v)
}

// The as* functions take a list value for a typed field; a list that is not all of
// the expected shape is refused (false) and the caller keeps it as Extra.

func listItems(v *val) ([]Value, bool) {
	switch v.k {
	case kList:
		return v.o.(*List).Items, true
	case kTList:
		return v.o.(*tlist).items, true
	case kFrames:
		fl := v.o.(*frameList)
		if fl.generic != nil {
			return fl.generic.Items, true
		}
	}
	return nil, false
}

func asFrames(v *val) ([]*Frame, bool) {
	if v.k == kFrames && v.o.(*frameList).generic == nil {
		return v.o.(*frameList).frames, true
	}
	items, ok := listItems(v)
	if !ok {
		return nil, false
	}
	out := make([]*Frame, len(items))
	for i, it := range items {
		switch x := it.(type) {
		case *Frame:
			out[i] = x
		case *Dict:
			f := &Frame{}
			for _, kv := range x.Items {
				k, vv := valOf(kv.Key), valOf(kv.Value)
				f.set(&k, &vv)
			}
			out[i] = f
		default:
			return nil, false
		}
	}
	return out, true
}

func asSegments(v *val) ([]*Segment, bool) {
	items, ok := listItems(v)
	if !ok {
		return nil, false
	}
	out := make([]*Segment, len(items))
	for i, it := range items {
		switch x := it.(type) {
		case *Segment:
			out[i] = x
		case *Dict:
			g := &Segment{}
			for _, kv := range x.Items {
				k, vv := valOf(kv.Key), valOf(kv.Value)
				g.set(&k, &vv)
			}
			out[i] = g
		default:
			return nil, false
		}
	}
	return out, true
}

func asBlocks(v *val) ([]*Block, bool) {
	items, ok := listItems(v)
	if !ok {
		return nil, false
	}
	out := make([]*Block, len(items))
	for i, it := range items {
		switch x := it.(type) {
		case *Block:
			out[i] = x
		case *Dict:
			b := &Block{}
			for _, kv := range x.Items {
				k, vv := valOf(kv.Key), valOf(kv.Value)
				b.set(&k, &vv)
			}
			out[i] = b
		default:
			return nil, false
		}
	}
	return out, true
}

func asEntries(items []Value) ([]*TraceEntry, bool) {
	out := make([]*TraceEntry, len(items))
	for i, it := range items {
		switch x := it.(type) {
		case *TraceEntry:
			out[i] = x
		case *Dict:
			e := &TraceEntry{}
			for _, kv := range x.Items {
				k, vv := valOf(kv.Key), valOf(kv.Value)
				e.set(&k, &vv)
			}
			out[i] = e
		default:
			return nil, false
		}
	}
	return out, true
}

func asTraces(v *val) ([][]*TraceEntry, bool) {
	items, ok := listItems(v)
	if !ok {
		return nil, false
	}
	out := make([][]*TraceEntry, len(items))
	for i, it := range items {
		l, ok := it.(*List)
		if !ok {
			return nil, false
		}
		if out[i], ok = asEntries(l.Items); !ok {
			return nil, false
		}
	}
	return out, true
}
