package render

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// ReadTimeline parses a merged.memsnap.pb, checking its indexes.
func ReadTimeline(data []byte) (*pb.Timeline, error) {
	var tl pb.Timeline
	if err := proto.Unmarshal(data, &tl); err != nil {
		return nil, fmt.Errorf("merge: not a memsnap timeline: %w", err)
	}
	if tl.Version != 1 {
		return nil, fmt.Errorf("merge: timeline version %d is not supported (1 is)", tl.Version)
	}
	if tl.WorldSize < 0 || tl.WorldSize > sidecar.MaxRanks {
		return nil, fmt.Errorf("merge: timeline world size %d (0 to %d)", tl.WorldSize, sidecar.MaxRanks)
	}
	if len(tl.Ranks) > sidecar.MaxRanks || len(tl.MissingRanks) > sidecar.MaxRanks {
		return nil, fmt.Errorf("merge: timeline holds %d ranks and %d missing ones, more than %d", len(tl.Ranks), len(tl.MissingRanks), sidecar.MaxRanks)
	}
	seen := make(map[int32]bool, len(tl.Ranks))
	for _, r := range tl.Ranks {
		switch {
		case r.Rank < 0 || r.Rank >= sidecar.MaxRanks || (tl.WorldSize > 0 && r.Rank >= tl.WorldSize):
			return nil, fmt.Errorf("merge: timeline holds rank %d of world size %d", r.Rank, tl.WorldSize)
		case seen[r.Rank]:
			return nil, fmt.Errorf("merge: timeline holds rank %d twice", r.Rank)
		}
		seen[r.Rank] = true
	}
	for _, r := range tl.MissingRanks {
		if r < 0 || r >= sidecar.MaxRanks || seen[r] {
			return nil, fmt.Errorf("merge: timeline names rank %d missing", r)
		}
	}
	ns, nf := uint32(len(tl.Strings)), uint32(len(tl.Frames))
	for i, f := range tl.Frames {
		if f.Name >= ns || f.Filename >= ns {
			return nil, fmt.Errorf("merge: timeline frame %d names string %d of %d", i, max(f.Name, f.Filename), ns)
		}
	}
	for _, r := range tl.Ranks {
		for _, e := range r.Events {
			for _, f := range e.Frames {
				if f >= nf {
					return nil, fmt.Errorf("merge: timeline rank %d names frame %d of %d", r.Rank, f, nf)
				}
			}
			if e.ActionName >= ns {
				return nil, fmt.Errorf("merge: timeline rank %d names string %d of %d", r.Rank, e.ActionName, ns)
			}
		}
	}
	return &tl, nil
}

// actionName is ev's action as a trace entry names it: its code's lower-case
// name, else (OTHER, or a code the enum does not name) the one among tl's strings.
func actionName(tl *pb.Timeline, ev *pb.Event) string {
	if a := pb.Lower(ev.Action); a != "" && ev.Action != pb.Action_OTHER && ev.Action != pb.Action_ACTION_UNSPECIFIED {
		return a
	}
	return tl.Strings[ev.ActionName]
}

// rankSnapshot rebuilds one rank of a timeline as a snapshot with that rank's trace
// as device 0's; frames are shared through frames.
func rankSnapshot(tl *pb.Timeline, rt *pb.RankTimeline, frames []*snapshot.Frame, device int64) ([]*snapshot.TraceEntry, []*snapshot.Segment) {
	entries := make([]snapshot.TraceEntry, len(rt.Events))
	trace := make([]*snapshot.TraceEntry, len(rt.Events))
	for i, ev := range rt.Events {
		e := &entries[i]
		e.Action = actionName(tl, ev)

		e.Addr, e.Size, e.Stream, e.TimeUS = ev.Addr, ev.Size, ev.Stream, ev.TimeUs
		e.Has = snapshot.EntryAction | snapshot.EntrySize | snapshot.EntryStream | snapshot.EntryTimeUS | snapshot.EntryFrames
		if ev.Action == pb.Action_OOM {
			e.DeviceFree, e.Has = ev.DeviceFree, e.Has|snapshot.EntryDeviceFree
		} else {
			e.Has |= snapshot.EntryAddr
		}
		e.Frames = make([]*snapshot.Frame, len(ev.Frames))
		for j, f := range ev.Frames {
			e.Frames[j] = frames[f]
		}
		trace[i] = e
	}
	var segs []*snapshot.Segment
	for _, g := range rt.Segments {
		s := &snapshot.Segment{Device: device, Address: g.Address, TotalSize: g.TotalSize, AllocatedSize: g.AllocatedSize,
			Stream: g.Stream, SegmentType: g.SegmentType, IsExpandable: g.IsExpandable,
			Has: snapshot.SegDevice | snapshot.SegAddress | snapshot.SegTotalSize | snapshot.SegAllocatedSize | snapshot.SegStream |
				snapshot.SegSegmentType | snapshot.SegIsExpandable | snapshot.SegBlocks}
		if g.ActiveAllocatedBytes > 0 {
			s.Blocks = []*snapshot.Block{{Address: g.Address, Size: g.ActiveAllocatedBytes, State: snapshot.BlockActiveAllocated,
				Has: snapshot.BlockAddress | snapshot.BlockSize | snapshot.BlockState}}
		}
		segs = append(segs, s)
	}
	return trace, segs
}

func timelineFrames(tl *pb.Timeline) []*snapshot.Frame {
	fr := make([]*snapshot.Frame, len(tl.Frames))
	for i, f := range tl.Frames {
		fr[i] = &snapshot.Frame{Name: tl.Strings[f.Name], Filename: tl.Strings[f.Filename], Line: f.Line,
			Has: snapshot.FrameName | snapshot.FrameFilename | snapshot.FrameLine}
	}
	return fr
}

// RanksFromPB turns a merged timeline back into per-rank inputs of a merge.
func RanksFromPB(data []byte, source string) ([]*analysis.RankData, error) {
	tl, err := ReadTimeline(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	frames := timelineFrames(tl)
	var out []*analysis.RankData
	for _, rt := range tl.Ranks {
		trace, segs := rankSnapshot(tl, rt, frames, 0)
		s := &snapshot.Snapshot{DeviceTraces: [][]*snapshot.TraceEntry{trace}, Segments: segs, Has: snapshot.SnapSegments | snapshot.SnapDeviceTraces}
		off := rt.ClockOffsetUs
		meta := &sidecar.RankMeta{Rank: int(rt.Rank), WorldSize: int(tl.WorldSize), ClockOffsetUS: &off}
		for _, b := range rt.Batches {
			meta.Batches = append(meta.Batches, sidecar.BatchMark{Batch: b.Batch, StartUS: b.StartUs, EndUS: b.EndUs})
		}
		for _, m := range rt.Samples {
			meta.Samples = append(meta.Samples, sidecar.MemorySample{TimeUS: m.TimeUs, DeviceUsedBytes: m.DeviceUsedBytes, ProcessUsedBytes: m.ProcessUsedBytes})
		}
		out = append(out, &analysis.RankData{Rank: int(rt.Rank), Source: fmt.Sprintf("%s#rank%d", source, rt.Rank), Snap: s, Trace: trace, Segs: segs, Meta: meta})
	}
	return out, nil
}

// TimelineSnapshot rebuilds a whole merged timeline as one snapshot whose device i
// is rank i (what merged.memory_snapshot.pickle holds, without blocks' detail).
func TimelineSnapshot(tl *pb.Timeline) *snapshot.Snapshot {
	frames := timelineFrames(tl)
	n := int(tl.WorldSize)
	for _, rt := range tl.Ranks {
		n = max(n, int(rt.Rank)+1)
	}
	s := &snapshot.Snapshot{DeviceTraces: make([][]*snapshot.TraceEntry, n), Has: snapshot.SnapSegments | snapshot.SnapDeviceTraces}
	for _, rt := range tl.Ranks {
		trace, segs := rankSnapshot(tl, rt, frames, int64(rt.Rank))
		s.DeviceTraces[rt.Rank] = trace
		s.Segments = append(s.Segments, segs...)
	}
	return s
}

// ReadSnapshotFile reads a torch pickle or a merged timeline as a snapshot; only
// regular files are read, and reading stops when ctx is done.
func ReadSnapshotFile(ctx context.Context, path string) (*snapshot.Snapshot, error) {
	if !strings.HasSuffix(path, ".pb") {
		return snapshot.ReadFileContext(ctx, path)
	}
	data, err := snapshot.ReadFileBytes(ctx, path)
	if err != nil {
		return nil, err
	}
	tl, err := ReadTimeline(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return TimelineSnapshot(tl), nil
}
