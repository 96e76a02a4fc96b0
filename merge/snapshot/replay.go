package snapshot

import (
	"fmt"
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
	type seg struct{ addr, size int64 }
	var segs []seg
	active := map[int64]int64{}
	expandable := false
	for i, g := range s.Segments {
		if int(g.Device) != dev {
			continue
		}
		expandable = expandable || g.IsExpandable
		segs = append(segs, seg{g.Address, g.TotalSize})
		at := g.Address
		for _, b := range g.Blocks {
			if b.Address != at && b.Has&BlockAddress != 0 {
				return fmt.Errorf("segment %d (%#x): a block at %#x, where %#x was expected (blocks must tile the segment)", i, g.Address, b.Address, at)
			}
			if b.State == BlockActiveAllocated || b.State == "active_pending_free" {
				active[at] = b.Size
			}
			at += b.Size
		}
		if len(g.Blocks) > 0 && at != g.Address+g.TotalSize {
			return fmt.Errorf("segment %d (%#x): blocks cover %d bytes of %d", i, g.Address, at-g.Address, g.TotalSize)
		}
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
			k := -1
			for j, g := range segs {
				if g.addr == e.Addr {
					k = j
				}
			}
			if k < 0 {
				return fmt.Errorf("event %d: the segment allocated at %#x does not exist after it", i, e.Addr)
			}
			for a, n := range active {
				if a >= e.Addr && a+n <= e.Addr+segs[k].size {
					return fmt.Errorf("event %d: the segment allocated at %#x holds the block at %#x before it", i, e.Addr, a)
				}
			}
			segs = append(segs[:k], segs[k+1:]...)
		case ActionSegmentFree:
			if expandable {
				continue
			}
			if inSeg(e.Addr, 1) {
				return fmt.Errorf("event %d: the segment freed at %#x exists after it", i, e.Addr)
			}
			segs = append(segs, seg{e.Addr, e.Size})
			sortSegs()
		}
	}
	return nil
}
