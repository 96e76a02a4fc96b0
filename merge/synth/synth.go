// Package synth builds large, realistic snapshots for benchmarks and scale tests by
// repeating a real recorded trace: the frames stay the real ones (shared, as torch
// shares them), times are shifted so every repetition is distinct, and the result
// is a snapshot a memory viewer can replay (snapshot.CheckReplay).
package synth

import (
	"sort"

	"github.com/memsnap/memsnap/merge/snapshot"
)

// skewBlocks is how many rankSkew bytes a rank's own block holds per unit of skew.
const skewBlocks = 256

// Grow returns a snapshot whose device 0 trace holds at least events entries: base's
// first trace, then its allocation cycles repeated (each block allocated and freed
// inside the trace, at an address that lies in a segment at the trace's end and
// overlaps no block alive then, with its free request), so every repetition
// replays against the snapshot's segments as the original does. Segments are
// base's; with rankSkew > 0 the snapshot also holds, from before its trace, one
// block of rankSkew*256 bytes in a segment of its own, so ranks' peaks differ.
func Grow(base *snapshot.Snapshot, events int, rankSkew int64) *snapshot.Snapshot {
	src := base.DeviceTraces[0]
	if len(src) == 0 {
		return base
	}
	cycle := cycles(base, src)
	span := src[len(src)-1].TimeUS - src[0].TimeUS + 1000
	out := make([]*snapshot.TraceEntry, 0, events+len(src))
	out = append(out, src...)
	if len(cycle) > 0 {
		entries := make([]snapshot.TraceEntry, max(events-len(src), 0)+len(cycle))
		for rep, k := int64(1), 0; len(out) < events; rep++ {
			for _, e := range cycle {
				c := &entries[k]
				k++
				*c = *e
				c.TimeUS = e.TimeUS + rep*span
				out = append(out, c)
			}
		}
	}
	s := *base
	s.DeviceTraces = append([][]*snapshot.TraceEntry{out}, base.DeviceTraces[1:]...)
	if rankSkew > 0 {
		s.Segments = append(append([]*snapshot.Segment(nil), base.Segments...), ownBlock(rankSkew*skewBlocks))
	}
	return &s
}

// cycles picks the events of src that can repeat: each allocation freed later in
// src (with the free's request and completion), when its block lies inside one of
// base's segments and overlaps no block alive at base's end.
func cycles(base *snapshot.Snapshot, src []*snapshot.TraceEntry) []*snapshot.TraceEntry {
	type span struct{ addr, end int64 }
	var segs, alive []span
	for _, g := range base.Segments {
		if g.Device != 0 {
			continue
		}
		segs = append(segs, span{g.Address, g.Address + g.TotalSize})
		at := g.Address
		for _, b := range g.Blocks {
			if b.State == snapshot.BlockActiveAllocated || b.State == snapshot.BlockActivePendingFree {
				alive = append(alive, span{at, at + b.Size})
			}
			at += b.Size
		}
	}
	sort.Slice(alive, func(i, j int) bool { return alive[i].addr < alive[j].addr })
	fits := func(addr, size int64) bool {
		end := addr + (size+511)&^511
		in := false
		for _, g := range segs {
			in = in || (g.addr <= addr && end <= g.end)
		}
		if !in {
			return false
		}
		i := sort.Search(len(alive), func(i int) bool { return alive[i].end > addr })
		return i == len(alive) || alive[i].addr >= end
	}
	// pair each allocation with the free that ends it
	open := map[int64]int{} // address -> index of its allocation in src
	keep := make([]bool, len(src))
	requested := map[int64][]int{} // address -> its free requests since the allocation
	for i, e := range src {
		switch e.Action {
		case snapshot.ActionAlloc:
			open[e.Addr] = i
			delete(requested, e.Addr)
		case snapshot.ActionFreeRequested:
			if _, ok := open[e.Addr]; ok {
				requested[e.Addr] = append(requested[e.Addr], i)
			}
		case snapshot.ActionFreeCompleted:
			a, ok := open[e.Addr]
			if !ok {
				continue
			}
			delete(open, e.Addr)
			if !fits(e.Addr, max(src[a].Size, e.Size)) {
				continue
			}
			keep[a], keep[i] = true, true
			for _, r := range requested[e.Addr] {
				keep[r] = true
			}
			delete(requested, e.Addr)
		}
	}
	var out []*snapshot.TraceEntry
	for i, e := range src {
		if keep[i] {
			out = append(out, e)
		}
	}
	return out
}

// ownBlock is a segment of its own holding one allocated block of size bytes
// (rounded up to the allocator's 512), allocated before any trace.
func ownBlock(size int64) *snapshot.Segment {
	size = (size + 511) &^ 511
	total := (size + 2<<20 - 1) &^ (2<<20 - 1)
	const addr = 0x7d0000000000
	has := snapshot.BlockAddress | snapshot.BlockSize | snapshot.BlockState
	blocks := []*snapshot.Block{{Address: addr, Size: size, State: snapshot.BlockActiveAllocated, Has: has}}
	if total > size {
		blocks = append(blocks, &snapshot.Block{Address: addr + size, Size: total - size, State: "inactive", Has: has})
	}
	return &snapshot.Segment{Address: addr, TotalSize: total, AllocatedSize: size, ActiveSize: size, SegmentType: "large", Blocks: blocks,
		Has: snapshot.SegDevice | snapshot.SegAddress | snapshot.SegTotalSize | snapshot.SegAllocatedSize | snapshot.SegActiveSize |
			snapshot.SegStream | snapshot.SegSegmentType | snapshot.SegBlocks}
}
