package analysis

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// ev is a trace event at time i+1 of a synthetic trace.
func ev(action string, addr, size int64) *snapshot.TraceEntry {
	has := snapshot.EntryAction | snapshot.EntryAddr | snapshot.EntrySize | snapshot.EntryTimeUS
	if action == snapshot.ActionOOM {
		has = snapshot.EntryAction | snapshot.EntrySize | snapshot.EntryTimeUS | snapshot.EntryDeviceFree
	}
	return &snapshot.TraceEntry{Action: action, Addr: addr, Size: size, Has: has}
}

// synthetic is a one-device snapshot of trace, ending with the segment seg.
func synthetic(seg *snapshot.Segment, trace ...*snapshot.TraceEntry) *snapshot.Snapshot {
	for i, e := range trace {
		e.TimeUS = int64(i + 1)
	}
	return &snapshot.Snapshot{Segments: []*snapshot.Segment{seg}, DeviceTraces: [][]*snapshot.TraceEntry{trace},
		Has: snapshot.SnapSegments | snapshot.SnapDeviceTraces}
}

// blocks tiles a segment at addr with blocks of the sizes given, the allocated
// ones marked.
func blocks(addr int64, sizes []int64, allocated ...bool) []*snapshot.Block {
	var out []*snapshot.Block
	for i, n := range sizes {
		st := "inactive"
		if allocated[i] {
			st = snapshot.BlockActiveAllocated
		}
		out = append(out, &snapshot.Block{Address: addr, Size: n, State: st,
			Has: snapshot.BlockAddress | snapshot.BlockSize | snapshot.BlockState})
		addr += n
	}
	return out
}

// TestLargestFreeBlock: the free memory at the peak and at an OOM is that of the
// allocator then, replayed back from the segments at the end, not theirs.
func TestLargestFreeBlock(t *testing.T) {
	const seg = int64(0x7f0000000000)
	t.Run("fragmented", func(t *testing.T) {
		// ten 10 MiB blocks fill a 100 MiB segment (the peak: nothing free); every
		// other one is freed; an OOM asks for 30 MiB with 50 MiB free in 10 MiB
		// pieces; then blocks 0 and 2 go too, which joins 40 MiB at the end
		tr := []*snapshot.TraceEntry{ev(snapshot.ActionSegmentAlloc, seg, 100*mib)}
		for i := range int64(10) {
			tr = append(tr, ev(snapshot.ActionAlloc, seg+i*10*mib, 10*mib))
		}
		for _, i := range []int64{1, 3, 5, 7, 9} {
			tr = append(tr, ev(snapshot.ActionFreeCompleted, seg+i*10*mib, 10*mib))
		}
		tr = append(tr, ev(snapshot.ActionOOM, 0, 30*mib), ev(snapshot.ActionFreeCompleted, seg, 10*mib), ev(snapshot.ActionFreeCompleted, seg+20*mib, 10*mib))
		g := &snapshot.Segment{Address: seg, TotalSize: 100 * mib, Has: snapshot.SegAddress | snapshot.SegTotalSize | snapshot.SegBlocks,
			Blocks: blocks(seg, []int64{40 * mib, 10 * mib, 10 * mib, 10 * mib, 10 * mib, 10 * mib, 10 * mib}, false, true, false, true, false, true, false)}
		a := analyze(t, synthetic(g, tr...))
		if f := a.FreeAtPeak; f == nil || f.ReservedBytes != 100*mib || f.FreeBytes != 0 || f.LargestFreeBlockBytes == nil || *f.LargestFreeBlockBytes != 0 {
			t.Fatalf("free at the peak: %+v", a.FreeAtPeak)
		}
		if len(a.OOMs) != 1 || a.OOMs[0].LargestFreeBlock == nil || *a.OOMs[0].LargestFreeBlock != 10*mib || !a.OOMs[0].Fragmented() {
			t.Fatalf("the OOM: %+v", a.OOMs)
		}
		s := &Summary{Ranks: []RankSummary{{Rank: 3, OOMs: a.OOMs}}}
		want := "rank 3 ran out of memory asking for 30.0 MiB while 50.0 MiB was reserved but not allocated, the largest free block 10.0 MiB: " +
			"enough free memory, in pieces none large enough (fragmentation); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is the usual remedy"
		if got := strings.Join(s.Findings(), "\n"); !strings.Contains(got, want) {
			t.Fatalf("findings:\n%s", got)
		}
	})
	t.Run("expandable", func(t *testing.T) {
		// an expandable segment maps 100 MiB; 40 MiB stay allocated and 60 MiB are
		// freed, one piece; an OOM asks for 50 MiB (it fit: not fragmentation); then
		// the last 30 MiB are unmapped, so the segment at the end is 70 MiB
		tr := []*snapshot.TraceEntry{ev(snapshot.ActionSegmentMap, seg, 100*mib), ev(snapshot.ActionAlloc, seg, 40*mib),
			ev(snapshot.ActionAlloc, seg+40*mib, 40*mib), ev(snapshot.ActionAlloc, seg+80*mib, 20*mib),
			ev(snapshot.ActionFreeCompleted, seg+80*mib, 20*mib), ev(snapshot.ActionFreeCompleted, seg+40*mib, 40*mib),
			ev(snapshot.ActionOOM, 0, 50*mib), ev(snapshot.ActionSegmentUnmap, seg+70*mib, 30*mib)}
		g := &snapshot.Segment{Address: seg, TotalSize: 70 * mib, IsExpandable: true, Has: snapshot.SegAddress | snapshot.SegTotalSize | snapshot.SegBlocks | snapshot.SegIsExpandable,
			Blocks: blocks(seg, []int64{40 * mib, 30 * mib}, true, false)}
		a := analyze(t, synthetic(g, tr...))
		if len(a.OOMs) != 1 || a.OOMs[0].LargestFreeBlock == nil || *a.OOMs[0].LargestFreeBlock != 60*mib || a.OOMs[0].Fragmented() {
			t.Fatalf("the OOM: %+v (largest %v)", a.OOMs, *a.OOMs[0].LargestFreeBlock)
		}
	})
	t.Run("does not replay", func(t *testing.T) {
		// an allocation after the OOM that the segments at the end never saw: no
		// largest block is claimed
		g := &snapshot.Segment{Address: seg, TotalSize: 10 * mib, Has: snapshot.SegAddress | snapshot.SegTotalSize | snapshot.SegBlocks,
			Blocks: blocks(seg, []int64{10 * mib}, false)}
		a := analyze(t, synthetic(g, ev(snapshot.ActionOOM, 0, 20*mib), ev(snapshot.ActionAlloc, seg, 10*mib)))
		if a.FreeAtPeak != nil && a.FreeAtPeak.LargestFreeBlockBytes != nil || a.OOMs[0].LargestFreeBlock != nil || a.OOMs[0].Fragmented() {
			t.Fatalf("free at the peak %+v, OOM %+v", a.FreeAtPeak, a.OOMs)
		}
	})
}

func analyze(t *testing.T, s *snapshot.Snapshot) *RankAnalysis {
	t.Helper()
	a, err := AnalyzeSnapshot(context.Background(), s, nil, AnalyzeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.check(); err == nil && a.Snapshot.SHA256 == "" {
		return a // (check wants a snapshot's digest: everything else passed)
	} else if err != nil && !strings.Contains(err.Error(), "SHA-256") {
		t.Fatal(err)
	}
	return a
}

// TestLargestFreeBlockAgreesWithSegmentsBefore: on real snapshots, the largest
// free block after an event is the largest run of free blocks in the segments
// that SegmentsBefore (the viewer's replay, written apart) draws then.
func TestLargestFreeBlockAgreesWithSegmentsBefore(t *testing.T) {
	root := testutil.RepoRoot(t)
	for _, f := range []string{"ddp4/rank0.5.memory_snapshot.pickle", "ddp4/rank3.5.memory_snapshot.pickle", "protocols/transformer.protocol5.pickle"} {
		s, err := snapshot.ReadFile(filepath.Join(root, "testdata", "snapshots", f))
		if err != nil {
			t.Fatal(err)
		}
		r := RankFromSnapshot(s, 0, f)
		n := len(r.Trace)
		at := []int{n - 1, n - 2, n * 9 / 10, n * 3 / 4, n / 2}
		got, ok := r.largestFree(at)
		if !ok {
			t.Fatalf("%s: the trace does not replay", f)
		}
		for i, k := range at {
			var want int64
			for _, g := range snapshot.SegmentsBefore(r.Segs, r.Trace[k+1:]) {
				var run int64
				for _, b := range g.Blocks {
					if b.State == snapshot.BlockActiveAllocated || b.State == snapshot.BlockActivePendingFree {
						run = 0
						continue
					}
					run += b.Size
					want = max(want, run)
				}
			}
			if got[i] != want {
				t.Errorf("%s after event %d of %d: largest free block %d, the segments then say %d", f, k, n, got[i], want)
			}
		}
	}
}

// TestDamagedSegmentDevice: a snapshot with no trace whose segments name a
// device no rank drives (negative, huge) is analysed as device 0, not a panic.
func TestDamagedSegmentDevice(t *testing.T) {
	for _, d := range []int64{-3, 1 << 40} {
		s := &snapshot.Snapshot{Segments: []*snapshot.Segment{{Device: d}}}
		a, err := AnalyzeSnapshot(context.Background(), s, nil, AnalyzeOptions{})
		if err != nil || a.Device != 0 {
			t.Fatalf("device %d: analysed as device %v, %v", d, a, err)
		}
	}
}

// TestFreeFiguresThatCannotBe: a snapshot whose segments do not hold what its
// trace allocated (segments dropped, blocks that do not tile) gets no free
// memory at the peak rather than a negative one, and no largest free block
// larger than all that is free; an OOM in expandable segments is not told to
// turn them on.
func TestFreeFiguresThatCannotBe(t *testing.T) {
	const seg = int64(0x7f0000000000)
	tr := []*snapshot.TraceEntry{ev(snapshot.ActionSegmentAlloc, seg, 10*mib), ev(snapshot.ActionAlloc, seg, 10*mib)}
	s := synthetic(&snapshot.Segment{Address: seg, TotalSize: 10 * mib}, tr...)
	s.Segments = nil // (dropped: the start is computed as below zero)
	if a := analyze(t, s); a.FreeAtPeak != nil {
		t.Fatalf("free at the peak from damaged segments: %+v", a.FreeAtPeak)
	}
	// an expandable segment: the fragmentation finding names no remedy it has
	g := &snapshot.Segment{Address: seg, TotalSize: 100 * mib, IsExpandable: true, Has: snapshot.SegAddress | snapshot.SegTotalSize | snapshot.SegBlocks | snapshot.SegIsExpandable,
		Blocks: blocks(seg, []int64{10 * mib, 10 * mib, 10 * mib, 10 * mib, 10 * mib, 10 * mib, 10 * mib, 10 * mib, 10 * mib, 10 * mib},
			true, false, true, false, true, false, true, false, true, false)}
	tr = []*snapshot.TraceEntry{ev(snapshot.ActionSegmentMap, seg, 100*mib)}
	for i := range int64(10) {
		tr = append(tr, ev(snapshot.ActionAlloc, seg+i*10*mib, 10*mib))
	}
	for _, i := range []int64{1, 3, 5, 7, 9} {
		tr = append(tr, ev(snapshot.ActionFreeCompleted, seg+i*10*mib, 10*mib))
	}
	a := analyze(t, synthetic(g, append(tr, ev(snapshot.ActionOOM, 0, 30*mib))...))
	if !a.ExpandableSegments || len(a.OOMs) != 1 || !a.OOMs[0].Fragmented() {
		t.Fatalf("expandable %v, OOMs %+v", a.ExpandableSegments, a.OOMs)
	}
	sum := &Summary{Ranks: []RankSummary{{Rank: 0, OOMs: a.OOMs, ExpandableSegments: true}}}
	if got := strings.Join(sum.Findings(), "\n"); strings.Contains(got, "expandable_segments:True is the usual remedy") || !strings.Contains(got, "expandable segments are on already") {
		t.Fatalf("findings:\n%s", got)
	}
	// a reserved figure no device holds is no fragmentation
	if (OOM{Size: 1, AllocatedThen: 0, ReservedThen: 1 << 62}).Fragmented() {
		t.Fatal("4096 PiB reserved read as fragmentation")
	}
}
