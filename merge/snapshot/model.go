// Package snapshot is memsnap's typed model of a PyTorch CUDA memory snapshot (what
// torch.cuda.memory._snapshot() returns) with a strict pickle decoder and a
// protocol-4 encoder.
//
// The decoder reads exactly the opcode subset torch and CPython emit for these
// files (protocols 2 to 5) and refuses everything that could run code (GLOBAL,
// STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, PERSID, ...) with the opcode and its
// byte offset. It decodes straight into the model: frames are shared pointers, not
// copies, and keys the model does not know are kept (Extra) so nothing is lost.
package snapshot

// Value is a generic pickled value the model keeps as is: nil (None), bool, int64,
// float64, string, *Dict, *List, Tuple, or one of the model's own types.
type Value = any

// Item is one key/value pair of a Dict.
type Item struct {
	Key   Value
	Value Value
}

// Dict is a pickled dict whose shape the model does not know, in insertion order.
type Dict struct {
	Items []Item
}

// Get returns the value stored under a string key.
func (d *Dict) Get(key string) (Value, bool) {
	if d == nil {
		return nil, false
	}
	for _, it := range d.Items {
		if k, ok := it.Key.(string); ok && k == key {
			return it.Value, true
		}
	}
	return nil, false
}

// Set replaces or appends a string-keyed value.
func (d *Dict) Set(key string, v Value) {
	for i, it := range d.Items {
		if k, ok := it.Key.(string); ok && k == key {
			d.Items[i].Value = v
			return
		}
	}
	d.Items = append(d.Items, Item{key, v})
}

// List is a pickled list whose shape the model does not know.
type List struct {
	Items []Value
}

// Tuple is a pickled tuple.
type Tuple []Value

// Frame is one Python (or C++) stack frame. Frames are shared: the decoder gives
// every reference to the same pickled frame the same *Frame.
type Frame struct {
	Name     string
	Filename string
	Line     int64
	Has      uint8 // which of FrameName, FrameFilename, FrameLine the pickle held
	Extra    []Item
}

// Presence bits of Frame.Has.
const (
	FrameName uint8 = 1 << iota
	FrameFilename
	FrameLine
)

// Action names of trace entries, as torch writes them.
const (
	ActionAlloc         = "alloc"
	ActionFreeRequested = "free_requested"
	ActionFreeCompleted = "free_completed"
	ActionSegmentAlloc  = "segment_alloc"
	ActionSegmentFree   = "segment_free"
	ActionSegmentMap    = "segment_map"
	ActionSegmentUnmap  = "segment_unmap"
	ActionSnapshot      = "snapshot"
	ActionOOM           = "oom"
	ActionAnnotate      = "annotate"
)

// TraceEntry is one event of a device trace. Which fields the pickle held is in Has;
// an oom entry holds DeviceFree instead of Addr.
type TraceEntry struct {
	Action         string
	Addr           int64
	Size           int64
	Stream         int64
	TimeUS         int64
	DeviceFree     int64
	CompileContext string
	UserMetadata   string
	Frames         []*Frame
	Has            uint16
	Extra          []Item
}

// Presence bits of TraceEntry.Has.
const (
	EntryAction uint16 = 1 << iota
	EntryAddr
	EntrySize
	EntryStream
	EntryTimeUS
	EntryDeviceFree
	EntryCompileContext
	EntryUserMetadata
	EntryFrames
)

// Block is one block of a segment at snapshot time.
type Block struct {
	Address       int64
	Size          int64
	RequestedSize int64
	State         string
	Frames        []*Frame
	Has           uint8
	Extra         []Item
}

// Presence bits of Block.Has.
const (
	BlockAddress uint8 = 1 << iota
	BlockSize
	BlockRequestedSize
	BlockState
	BlockFrames
)

// BlockActiveAllocated is the state of a block that is allocated at snapshot time.
const BlockActiveAllocated = "active_allocated"

// Segment is one cudaMalloc'd (or mapped, for expandable segments) region.
type Segment struct {
	Device        int64
	Address       int64
	TotalSize     int64
	AllocatedSize int64
	ActiveSize    int64
	RequestedSize int64
	Stream        int64
	SegmentType   string
	SegmentPoolID Value // a tuple (int, int) in torch 2.x
	IsExpandable  bool
	Frames        []*Frame
	Blocks        []*Block
	Has           uint16
	Extra         []Item
}

// Presence bits of Segment.Has.
const (
	SegDevice uint16 = 1 << iota
	SegAddress
	SegTotalSize
	SegAllocatedSize
	SegActiveSize
	SegRequestedSize
	SegStream
	SegSegmentType
	SegSegmentPoolID
	SegIsExpandable
	SegFrames
	SegBlocks
)

// Snapshot is one torch memory snapshot: device_traces[i] is device i's trace.
type Snapshot struct {
	Segments            []*Segment
	DeviceTraces        [][]*TraceEntry
	AllocatorSettings   Value // a dict in torch 2.x
	ExternalAnnotations Value // a list in torch 2.x
	Has                 uint8
	Extra               []Item // host_segments, host_traces and whatever newer torch adds
}

// Presence bits of Snapshot.Has.
const (
	SnapSegments uint8 = 1 << iota
	SnapDeviceTraces
	SnapAllocatorSettings
	SnapExternalAnnotations
)
