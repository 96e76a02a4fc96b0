package snapshot

import (
	"fmt"
	"math"
	"sort"
)

// CheckReplay reports whether device dev's trace can be replayed backwards from the
// snapshot's segments, as memory viewers (PyTorch's memory_viz) do to draw the
// allocator's state at any moment: every segment's blocks tile it; undoing the
// trace from the end, each allocation undone finds its block allocated, inside a
// segment that exists then, and each free undone finds its address free; each
// segment_alloc undone finds its segment empty. A history that lost its oldest
// events still replays (blocks freed without an allocation were there before).
// Expandable segments (segment_map and segment_unmap) are checked for blocks only.
func (s *Snapshot) CheckReplay(dev int) error {
	segs, active, expandable, err := s.replayStart(dev)
	if err != nil {
		return err
	}
	inSeg := func(addr, size int64) bool {
		i := sort.Search(len(segs), func(i int) bool { return segs[i].addr+segs[i].size > addr })
		return i < len(segs) && segs[i].addr <= addr && addr+size <= segs[i].addr+segs[i].size
	}
	sortSegs := func() { sort.Slice(segs, func(i, j int) bool { return segs[i].addr < segs[j].addr }) }
	sortSegs()
	var tr []*TraceEntry
	if dev < len(s.DeviceTraces) {
		tr = s.DeviceTraces[dev]
	}
	for i := len(tr) - 1; i >= 0; i-- {
		e := tr[i]
		switch e.Action {
		case ActionSegmentMap, ActionSegmentUnmap:
			expandable = true
		case ActionAlloc:
			n, ok := active[e.Addr]
			switch {
			case !ok:
				return fmt.Errorf("event %d: the block allocated at %#x is not allocated after it", i, e.Addr)
			case e.Size > n: // the trace has the size asked for, the block may be rounded up
				return fmt.Errorf("event %d: %d bytes allocated at %#x, where the block afterwards holds %d", i, e.Size, e.Addr, n)
			case !expandable && !inSeg(e.Addr, n):
				return fmt.Errorf("event %d: the block allocated at %#x (%d bytes) lies outside every segment", i, e.Addr, e.Size)
			}
			delete(active, e.Addr)
		case ActionFreeCompleted:
			if _, ok := active[e.Addr]; ok {
				return fmt.Errorf("event %d: the block freed at %#x is allocated again after it with no allocation between", i, e.Addr)
			}
			if !expandable && !inSeg(e.Addr, e.Size) {
				return fmt.Errorf("event %d: the block freed at %#x (%d bytes) lies outside every segment", i, e.Addr, e.Size)
			}
			active[e.Addr] = e.Size
		case ActionSegmentAlloc:
			if expandable {
				continue
			}
			if segs, err = undoSegmentAlloc(segs, active, i, e); err != nil {
				return err
			}
		case ActionSegmentFree:
			if expandable {
				continue
			}
			if inSeg(e.Addr, 1) {
				return fmt.Errorf("event %d: the segment freed at %#x exists after it", i, e.Addr)
			}
			segs = append(segs, replaySeg{e.Addr, e.Size})
			sortSegs()
		}
	}
	return nil
}

// replaySeg is a segment's address range, as CheckReplay tracks it.
type replaySeg struct{ addr, size int64 }

// replayStart reads device dev's segments at the trace's end, checking that their
// blocks tile them: the segments, the active blocks' sizes by address, and
// whether any segment is expandable.
func (s *Snapshot) replayStart(dev int) ([]replaySeg, map[int64]int64, bool, error) {
	var segs []replaySeg
	active := map[int64]int64{}
	expandable := false
	for i, g := range s.Segments {
		if int(g.Device) != dev {
			continue
		}
		expandable = expandable || g.IsExpandable
		segs = append(segs, replaySeg{g.Address, g.TotalSize})
		at := g.Address
		for _, b := range g.Blocks {
			if b.Address != at && b.Has&BlockAddress != 0 {
				return nil, nil, false, fmt.Errorf("segment %d (%#x): a block at %#x, where %#x was expected (blocks must tile the segment)", i, g.Address, b.Address, at)
			}
			if b.State == BlockActiveAllocated || b.State == BlockActivePendingFree {
				active[at] = b.Size
			}
			at += b.Size
		}
		if len(g.Blocks) > 0 && at != g.Address+g.TotalSize {
			return nil, nil, false, fmt.Errorf("segment %d (%#x): blocks cover %d bytes of %d", i, g.Address, at-g.Address, g.TotalSize)
		}
	}
	return segs, active, expandable, nil
}

// undoSegmentAlloc undoes event i, a segment_alloc, removing its segment from segs;
// the segment must exist and hold no active block.
func undoSegmentAlloc(segs []replaySeg, active map[int64]int64, i int, e *TraceEntry) ([]replaySeg, error) {
	k := -1
	for j, g := range segs {
		if g.addr == e.Addr {
			k = j
		}
	}
	if k < 0 {
		return nil, fmt.Errorf("event %d: the segment allocated at %#x does not exist after it", i, e.Addr)
	}
	for a, n := range active {
		if a >= e.Addr && a+n <= e.Addr+segs[k].size {
			return nil, fmt.Errorf("event %d: the segment allocated at %#x holds the block at %#x before it", i, e.Addr, a)
		}
	}
	return append(segs[:k], segs[k+1:]...), nil
}

// SegmentsBefore returns device dev's segments as they were before the trace
// events tail (the events after a cut's end, in order), undoing them from segs
// (the segments at the trace's end): an allocation undone leaves its block
// inactive, a free undone makes its block active again (carved out of the free
// space holding it), a segment_alloc undone removes its segment and a
// segment_free undone brings it back. segs is not changed; segments the tail does
// not touch are returned as they are. Events that do not fit (a size out of
// range, a free inside a block in use, a segment over another) are left undone,
// as is expandable segments' mapping; a tail too large to undo in reasonable
// time (more than maxUndoWork block steps) leaves the end's segments.
func SegmentsBefore(segs []*Segment, tail []*TraceEntry) []*Segment {
	if len(tail) == 0 {
		return segs
	}
	blocks := 0
	for _, g := range segs {
		blocks += len(g.Blocks)
	}
	if int64(len(tail))*int64(blocks+len(segs)+1) > maxUndoWork {
		return segs
	}
	out := make([]*Segment, len(segs))
	copy(out, segs)
	sort.SliceStable(out, func(a, b int) bool { return out[a].Address < out[b].Address })
	owned := map[*Segment]bool{} // copies this call may change
	find := func(addr int64) int {
		i := sort.Search(len(out), func(i int) bool { return out[i].Address+out[i].TotalSize > addr })
		if i < len(out) && out[i].Address <= addr {
			return i
		}
		return -1
	}
	own := func(i int) *Segment {
		if !owned[out[i]] {
			out[i] = copySegment(out[i])
			owned[out[i]] = true
		}
		return out[i]
	}
	for i := len(tail) - 1; i >= 0; i-- {
		e := tail[i]
		if e.Size <= 0 || e.Size > maxUndoSize || e.Addr < 0 || e.Addr > math.MaxInt64-maxUndoSize {
			continue
		}
		switch e.Action {
		case ActionAlloc:
			k := find(e.Addr)
			if k < 0 {
				continue
			}
			undoAlloc(own(k), e)
		case ActionFreeCompleted:
			k := find(e.Addr)
			if k < 0 {
				continue
			}
			carve(own(k), e)
		case ActionSegmentAlloc:
			if k := find(e.Addr); k >= 0 && out[k].Address == e.Addr && !out[k].IsExpandable {
				out = append(out[:k], out[k+1:]...)
			}
		case ActionSegmentFree:
			// it must not overlap a segment that exists before it
			j := sort.Search(len(out), func(i int) bool { return out[i].Address+out[i].TotalSize > e.Addr })
			if j < len(out) && out[j].Address < e.Addr+e.Size {
				continue
			}
			g := freedSegment(segs, e)
			owned[g] = true
			out = append(out, nil)
			copy(out[j+1:], out[j:])
			out[j] = g
		}
	}
	return out
}

// copySegment copies a segment and its blocks for SegmentsBefore to change,
// giving each block its address where the snapshot left it out.
func copySegment(g *Segment) *Segment {
	c := *g
	c.Blocks = make([]*Block, len(g.Blocks))
	at := g.Address
	for j, b := range g.Blocks {
		nb := *b
		if nb.Has&BlockAddress == 0 { // older torch: a block's address is its place
			nb.Address, nb.Has = at, nb.Has|BlockAddress
		}
		at += nb.Size
		c.Blocks[j] = &nb
	}
	return &c
}

// undoAlloc makes the allocated block at e's address inactive again, as it was
// before the allocation e.
func undoAlloc(g *Segment, e *TraceEntry) {
	for _, b := range g.Blocks {
		if b.Address == e.Addr && b.State == BlockActiveAllocated {
			b.State, b.Frames, b.RequestedSize = blockInactive, nil, 0
			b.Has &^= BlockFrames | BlockRequestedSize
			g.AllocatedSize -= b.Size
			g.ActiveSize -= b.Size
			break
		}
	}
}

// freedSegment is the segment a segment_free e removed, brought back whole
// and inactive, on the device of segs.
func freedSegment(segs []*Segment, e *TraceEntry) *Segment {
	typ := "large"
	if e.Size < 1<<20 {
		typ = "small"
	}
	has := BlockAddress | BlockSize | BlockState
	return &Segment{Device: segDevice(segs), Address: e.Addr, TotalSize: e.Size, Stream: e.Stream, SegmentType: typ,
		Blocks: []*Block{{Address: e.Addr, Size: e.Size, State: blockInactive, Has: has}},
		Has:    SegDevice | SegAddress | SegTotalSize | SegAllocatedSize | SegActiveSize | SegStream | SegSegmentType | SegBlocks}
}

// Bounds of SegmentsBefore.
const (
	maxUndoWork = 400_000_000
	maxUndoSize = 1 << 50
)

const blockInactive = "inactive"

// carve makes the block a free undone names active again: out of the inactive
// block holding its address, merged with the free blocks after it as far as the
// block reaches (the allocator merges free neighbours), rounded up to 512 bytes.
func carve(g *Segment, e *TraceEntry) {
	j := sort.Search(len(g.Blocks), func(i int) bool { return g.Blocks[i].Address+g.Blocks[i].Size > e.Addr })
	if j == len(g.Blocks) || g.Blocks[j].Address > e.Addr || g.Blocks[j].State != blockInactive {
		return // not free space: the free does not fit
	}
	b := g.Blocks[j]
	want := e.Addr + (e.Size+511)&^511
	k := j + 1
	end := b.Address + b.Size
	for end < want && k < len(g.Blocks) && g.Blocks[k].State == blockInactive && g.Blocks[k].Address == end {
		end += g.Blocks[k].Size
		k++
	}
	n := min(want, end) - e.Addr
	free := b.Has&^(BlockFrames|BlockRequestedSize) | BlockAddress | BlockSize | BlockState
	var parts []*Block
	if e.Addr > b.Address {
		parts = append(parts, &Block{Address: b.Address, Size: e.Addr - b.Address, State: blockInactive, Has: free})
	}
	parts = append(parts, &Block{Address: e.Addr, Size: n, RequestedSize: e.Size, State: BlockActiveAllocated, Frames: e.Frames,
		Has: free | BlockRequestedSize | BlockFrames})
	if e.Addr+n < end {
		parts = append(parts, &Block{Address: e.Addr + n, Size: end - e.Addr - n, State: blockInactive, Has: free})
	}
	g.Blocks = append(g.Blocks[:j], append(parts, g.Blocks[k:]...)...)
	g.AllocatedSize += n
	g.ActiveSize += n
}

func segDevice(segs []*Segment) int64 {
	if len(segs) > 0 {
		return segs[0].Device
	}
	return 0
}
