package analysis

import (
	"slices"

	"github.com/memsnap/memsnap/merge/snapshot"
)

// Free is the allocator's free memory at one moment: what it reserved but had
// not allocated, and the largest free block in one segment (what the largest
// allocation it could serve without asking CUDA for more was).
type Free struct {
	ReservedBytes int64 `json:"reserved_bytes"`
	FreeBytes     int64 `json:"free_bytes"` // reserved, not allocated
	// LargestFreeBlockBytes is the largest gap between allocated blocks inside one
	// segment, nil when the snapshot's segments do not tell (no segments, or a
	// trace that does not replay back from them). Sizes undone from the trace are
	// its sizes rounded to 512 bytes, so a gap can be larger than the allocator's
	// by a block's rounding.
	LargestFreeBlockBytes *int64 `json:"largest_free_block_bytes,omitempty"`
}

// Text says f in a table's cell: "38.1 MiB (largest block 2.0 MiB)", or "—".
func (f *Free) Text() string {
	if f == nil {
		return "—"
	}
	if f.LargestFreeBlockBytes == nil {
		return HumanBytes(f.FreeBytes)
	}
	return HumanBytes(f.FreeBytes) + " (largest block " + HumanBytes(*f.LargestFreeBlockBytes) + ")"
}

// freeSegment is one reserved address range: a cudaMalloc'd segment, or a range
// of an expandable segment's mapped memory (which ranges next to each other join).
type freeSegment struct {
	addr, size int64
	expandable bool
}

// largestFree replays the trace backwards from the segments at its end (as
// memory viewers draw the allocator at any moment) and returns the largest free
// block after each event of at (-1: before the first event), in at's order;
// ok is false when the segments cannot tell: none, or an event undone that
// does not fit them.
func (r *RankData) largestFree(at []int) (largest []int64, ok bool) {
	if len(r.Segs) == 0 || len(at) == 0 {
		return nil, false
	}
	var segs []freeSegment
	blocks := map[int64]int64{} // allocated blocks: address -> size
	for _, g := range r.Segs {
		if g.TotalSize < 0 || !plausibleBytes(g.Address) || !plausibleBytes(g.TotalSize) {
			return nil, false // (a damaged snapshot: sums of these must not overflow)
		}
		segs = append(segs, freeSegment{g.Address, g.TotalSize, g.IsExpandable})
		addr := g.Address
		for _, b := range g.Blocks {
			if b.Has&snapshot.BlockAddress != 0 {
				addr = b.Address
			}
			if b.Size < 0 || !plausibleBytes(addr) || !plausibleBytes(b.Size) {
				return nil, false
			}
			if b.State == snapshot.BlockActiveAllocated || b.State == snapshot.BlockActivePendingFree {
				blocks[addr] = b.Size
			}
			addr += b.Size
		}
	}
	order := make([]int, len(at))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return at[b] - at[a] }) // the latest first
	largest = make([]int64, len(at))
	i := len(r.Trace) - 1
	for _, k := range order {
		for ; i > at[k]; i-- {
			if !undoFree(r.Trace[i], &segs, blocks) {
				return nil, false
			}
		}
		largest[k] = largestGap(segs, blocks)
	}
	return largest, true
}

// undoFree undoes one event on the segments and blocks; false when it does not
// fit them (the block it allocated is not there, the one it freed is).
func undoFree(e *snapshot.TraceEntry, segs *[]freeSegment, blocks map[int64]int64) bool {
	if e.Size < 0 || !plausibleBytes(e.Size) || !plausibleBytes(e.Addr) {
		return false
	}
	switch e.Action {
	case snapshot.ActionAlloc:
		if _, ok := blocks[e.Addr]; !ok {
			return false
		}
		delete(blocks, e.Addr)
	case snapshot.ActionFreeCompleted:
		if _, ok := blocks[e.Addr]; ok {
			return false
		}
		blocks[e.Addr] = (e.Size + 511) &^ 511
	case snapshot.ActionSegmentAlloc:
		k := slices.IndexFunc(*segs, func(g freeSegment) bool { return g.addr == e.Addr && !g.expandable })
		if k < 0 {
			return false
		}
		*segs = slices.Delete(*segs, k, k+1)
	case snapshot.ActionSegmentFree:
		*segs = append(*segs, freeSegment{e.Addr, e.Size, false})
	case snapshot.ActionSegmentMap:
		*segs = unmapRange(*segs, e.Addr, e.Size)
	case snapshot.ActionSegmentUnmap:
		*segs = append(*segs, freeSegment{e.Addr, e.Size, true})
	}
	return true
}

// unmapRange takes [addr, addr+size) out of the expandable ranges.
func unmapRange(segs []freeSegment, addr, size int64) []freeSegment {
	end := addr + size
	out := segs[:0:0]
	for _, g := range segs {
		gEnd := g.addr + g.size
		if !g.expandable || gEnd <= addr || g.addr >= end {
			out = append(out, g)
			continue
		}
		if g.addr < addr {
			out = append(out, freeSegment{g.addr, addr - g.addr, true})
		}
		if gEnd > end {
			out = append(out, freeSegment{end, gEnd - end, true})
		}
	}
	return out
}

// largestGap is the largest stretch of a segment that no allocated block covers;
// expandable ranges that touch count as one.
func largestGap(segs []freeSegment, blocks map[int64]int64) int64 {
	ss := slices.Clone(segs)
	slices.SortFunc(ss, func(a, b freeSegment) int {
		switch {
		case a.addr < b.addr:
			return -1
		case a.addr > b.addr:
			return 1
		}
		return 0
	})
	joined := ss[:0]
	for _, g := range ss {
		if n := len(joined); n > 0 && g.expandable && joined[n-1].expandable && joined[n-1].addr+joined[n-1].size == g.addr {
			joined[n-1].size += g.size
			continue
		}
		joined = append(joined, g)
	}
	addrs := make([]int64, 0, len(blocks))
	for a := range blocks {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	var best int64
	j := 0
	for _, g := range joined {
		end := g.addr + g.size
		for j < len(addrs) && addrs[j] < g.addr {
			j++
		}
		at := g.addr
		for ; j < len(addrs) && addrs[j] < end; j++ {
			best = max(best, addrs[j]-at)
			at = max(at, addrs[j]+blocks[addrs[j]])
		}
		best = max(best, end-at)
	}
	return best
}
