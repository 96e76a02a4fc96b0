// Command benchtool supports the benchmark scripts: it generates large snapshots
// from a real one and times memsnap's own work on them.
//
//	benchtool gen -events N -ranks R -out DIR BASE.pickle   write rank{r}.1.memory_snapshot.pickle files (-marks B: and
//	                                                        sidecars with B batch marks; -plant-rank R -plant-bytes N: rank R
//	                                                        also holds an N-byte buffer from plantedSite for the whole trace)
//	benchtool analyses DIR                                  write every rank's analysis beside its snapshot, as rank agents do
//	benchtool decode -n ITER FILE                           print the best decode time in seconds, and on
//	                                                        stderr what one decode allocates (-cpuprofile,
//	                                                        -memprofile F: write profiles)
//	benchtool merge -n ITER DIR                             merge DIR's ranks (all five outputs); print the best time and the peak RSS
//	benchtool decoded-size FILE                             print the heap bytes one decoded snapshot holds
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/merge/synth"
	"github.com/memsnap/memsnap/naming"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchtool gen|decode ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "gen":
		err = gen(os.Args[2:])
	case "decode":
		err = decode(os.Args[2:])
	case "merge":
		err = mergeBench(os.Args[2:])
	case "decoded-size":
		err = decodedSize(os.Args[2:])
	case "analyses":
		err = analyses(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtool:", err)
		os.Exit(1)
	}
}

func gen(args []string) error {
	fs := flag.NewFlagSet("gen", flag.ExitOnError)
	events := fs.Int("events", 100000, "trace events per rank")
	ranks := fs.Int("ranks", 1, "ranks to write")
	out := fs.String("out", ".", "output folder")
	marks := fs.Int("marks", 0, "batch marks per rank, written in a sidecar (0: no sidecar)")
	plantRank := fs.Int("plant-rank", -1, "the rank that holds a planted buffer")
	plantBytes := fs.Int64("plant-bytes", 96<<20, "the planted buffer's size")
	skew := fs.Int64("skew", 4096, "rank r holds r*skew*256 bytes more, in a block of its own")
	balance := fs.Bool("balance", false, "add a segment holding what the repeated trace leaves allocated beyond the recorded one (none: repetitions free what they allocate)")
	fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("gen needs one base snapshot")
	}
	base, err := snapshot.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	for r := 0; r < *ranks; r++ {
		s := synth.Grow(base, *events, int64(r)**skew)
		if *balance {
			s = balanced(base, s)
		}
		if r == *plantRank {
			s = plant(s, *plantBytes)
		}
		b, err := snapshot.EncodeBytes(s)
		if err != nil {
			return err
		}
		p := filepath.Join(*out, fmt.Sprintf("rank%d.1.memory_snapshot.pickle", r))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
		if *marks > 0 {
			if err := writeMarks(p, s, r, *ranks, *marks); err != nil {
				return err
			}
		}
		fmt.Printf("%s: %d events, %d bytes\n", p, len(s.DeviceTraces[0]), len(b))
	}
	return nil
}

// plantedFrame is the frame the planted buffer is allocated from.
var plantedFrame = &snapshot.Frame{Name: "planted_buffer", Filename: "/bench/train.py", Line: 42,
	Has: snapshot.FrameName | snapshot.FrameFilename | snapshot.FrameLine}

// plant gives s one more buffer of size bytes, in a segment of its own, allocated
// just before the trace starts and alive at its end.
func plant(s *snapshot.Snapshot, size int64) *snapshot.Snapshot {
	tr := s.DeviceTraces[0]
	const addr = 0x7f0000000000
	t := tr[0].TimeUS - 1
	has := snapshot.EntryAction | snapshot.EntryAddr | snapshot.EntrySize | snapshot.EntryStream | snapshot.EntryTimeUS | snapshot.EntryFrames
	seg := &snapshot.TraceEntry{Action: snapshot.ActionSegmentAlloc, Addr: addr, Size: size, TimeUS: t, Frames: []*snapshot.Frame{}, Has: has}
	alloc := &snapshot.TraceEntry{Action: snapshot.ActionAlloc, Addr: addr, Size: size, TimeUS: t, Frames: []*snapshot.Frame{plantedFrame}, Has: has}
	out := *s
	out.DeviceTraces = [][]*snapshot.TraceEntry{append([]*snapshot.TraceEntry{seg, alloc}, tr...)}
	out.Segments = append(append([]*snapshot.Segment(nil), s.Segments...), &snapshot.Segment{Address: addr, TotalSize: size, AllocatedSize: size,
		SegmentType: "large", Blocks: []*snapshot.Block{{Address: addr, Size: size, RequestedSize: size, State: snapshot.BlockActiveAllocated,
			Frames: []*snapshot.Frame{plantedFrame}, Has: snapshot.BlockAddress | snapshot.BlockSize | snapshot.BlockRequestedSize | snapshot.BlockState | snapshot.BlockFrames}},
		Has: snapshot.SegDevice | snapshot.SegAddress | snapshot.SegTotalSize | snapshot.SegAllocatedSize | snapshot.SegStream | snapshot.SegSegmentType | snapshot.SegBlocks})
	return &out
}

// balanced adds to grown (base's trace repeated) one segment with one active block
// holding what the repetitions leave allocated and reserved beyond base's own
// trace, so grown's curve starts where base's does instead of far below zero.
func balanced(base, grown *snapshot.Snapshot) *snapshot.Snapshot {
	net := func(tr []*snapshot.TraceEntry) (a, r int64) {
		for _, e := range tr {
			switch e.Action {
			case snapshot.ActionAlloc:
				a += e.Size
			case snapshot.ActionFreeCompleted:
				a -= e.Size
			case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
				r += e.Size
			case snapshot.ActionSegmentFree, snapshot.ActionSegmentUnmap:
				r -= e.Size
			}
		}
		return a, r
	}
	ba, br := net(base.DeviceTraces[0])
	ga, gr := net(grown.DeviceTraces[0])
	extraA, extraR := max(ga-ba, 0), max(gr-br, 0)
	if extraA == 0 && extraR == 0 {
		return grown
	}
	const addr = 0x7e0000000000
	// a valid segment: as large as the block it holds (2 MiB pages), its blocks
	// tiling it, the rest one inactive block
	total := (max(extraR, extraA) + 2<<20 - 1) &^ (2<<20 - 1)
	has := snapshot.BlockAddress | snapshot.BlockSize | snapshot.BlockState
	var blocks []*snapshot.Block
	if extraA > 0 {
		blocks = append(blocks, &snapshot.Block{Address: addr, Size: extraA, State: snapshot.BlockActiveAllocated, Has: has})
	}
	if total > extraA {
		blocks = append(blocks, &snapshot.Block{Address: addr + extraA, Size: total - extraA, State: "inactive", Has: has})
	}
	out := *grown
	out.Segments = append(append([]*snapshot.Segment(nil), grown.Segments...), &snapshot.Segment{Address: addr, TotalSize: total, AllocatedSize: extraA,
		ActiveSize: extraA, SegmentType: "large", Blocks: blocks,
		Has: snapshot.SegDevice | snapshot.SegAddress | snapshot.SegTotalSize | snapshot.SegAllocatedSize | snapshot.SegActiveSize | snapshot.SegStream | snapshot.SegSegmentType | snapshot.SegBlocks})
	return &out
}

// writeMarks writes a sidecar whose n batch marks split the rank's trace evenly.
func writeMarks(p string, s *snapshot.Snapshot, rank, world, n int) error {
	tr := s.DeviceTraces[0]
	t0, t1 := tr[0].TimeUS, tr[len(tr)-1].TimeUS
	step := (t1 - t0 + int64(n)) / int64(n)
	m := sidecar.RankMeta{Version: 1, Rank: rank, WorldSize: world, Window: &sidecar.WindowInfo{ID: 1, Start: 1, Stop: 1 + int64(n)}}
	for b := int64(0); b < int64(n); b++ {
		m.Batches = append(m.Batches, sidecar.BatchMark{Batch: 1 + b, StartUS: t0 + b*step, EndUS: t0 + (b+1)*step - 1})
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(filepath.Dir(p), sidecar.MetaName(filepath.Base(p))), b, 0o644)
}

// analyses writes every rank's analysis beside its snapshot, as the rank agents
// would, and prints the time it took.
func analyses(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("analyses needs a folder")
	}
	files, err := filepath.Glob(filepath.Join(args[0], "rank*.memory_snapshot.pickle"))
	if err != nil {
		return err
	}
	start := time.Now()
	for _, f := range files {
		a, err := merge.AnalyzeFile(context.Background(), f, -1)
		if err != nil {
			return err
		}
		b, err := a.Marshal()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(args[0], analysis.AnalysisName(filepath.Base(f))), b, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("%d analyses in %.3fs\n", len(files), time.Since(start).Seconds())
	return nil
}

func decode(args []string) error {
	fs := flag.NewFlagSet("decode", flag.ExitOnError)
	n := fs.Int("n", 10, "iterations (the best is printed)")
	cpu := fs.String("cpuprofile", "", "write a CPU profile")
	mem := fs.String("memprofile", "", "write an allocation profile")
	fs.Parse(args)
	data, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	if *mem != "" {
		runtime.MemProfileRate = 4096
	}
	if *cpu != "" {
		f, err := os.Create(*cpu)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	best := time.Duration(1 << 62)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < *n; i++ {
		t := time.Now()
		if _, err := snapshot.Decode(data); err != nil {
			return err
		}
		best = min(best, time.Since(t))
	}
	runtime.ReadMemStats(&after)
	if *mem != "" {
		f, err := os.Create(*mem)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			return err
		}
	}
	fmt.Printf("%.6f\n", best.Seconds())
	fmt.Fprintf(os.Stderr, "allocated per decode: %d bytes in %d objects, for %d bytes of input\n",
		(after.TotalAlloc-before.TotalAlloc)/uint64(*n), (after.Mallocs-before.Mallocs)/uint64(*n), len(data))
	return nil
}

func mergeBench(args []string) error {
	fs := flag.NewFlagSet("merge", flag.ExitOnError)
	n := fs.Int("n", 3, "iterations (the best is printed)")
	prof := fs.String("cpuprofile", "", "write a CPU profile")
	fs.Parse(args)
	if *prof != "" {
		f, err := os.Create(*prof)
		if err != nil {
			return err
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	best := time.Duration(1 << 62)
	for i := 0; i < *n; i++ {
		out, err := os.MkdirTemp("", "benchmerge-")
		if err != nil {
			return err
		}
		st, err := store.OpenDir(out, true)
		if err != nil {
			return err
		}
		r := &merge.Resolver{Template: naming.MustParse(naming.ComposerSnapshotName)}
		t := time.Now()
		ins, err := r.Resolve(context.Background(), []string{fs.Arg(0)}, nil)
		if err != nil {
			return err
		}
		if _, err := merge.Merge(context.Background(), merge.Config{Inputs: ins, Out: st}); err != nil {
			return err
		}
		best = min(best, time.Since(t))
		os.RemoveAll(out)
	}
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	fmt.Printf("%.6f %d\n", best.Seconds(), ru.Maxrss*1024)
	return nil
}

func decodedSize(args []string) error {
	data, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	s, err := snapshot.Decode(data)
	if err != nil {
		return err
	}
	runtime.GC()
	runtime.ReadMemStats(&b)
	runtime.KeepAlive(s)
	fmt.Println(b.HeapAlloc - a.HeapAlloc)
	return nil
}
