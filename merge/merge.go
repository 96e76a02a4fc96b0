package merge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/naming"
)

// Alignment modes.
const (
	AlignWall    = "wall"    // each rank's own wall clock, as recorded
	AlignStart   = "start"   // each rank's first event at zero
	AlignOffsets = "offsets" // each rank's clock minus its measured offset from the leader
)

// Output kinds, and their default names.
const (
	OutPickle  = "pickle"
	OutTrace   = "trace"
	OutSummary = "summary"
	OutHTML    = "html"
	OutPB      = "pb"
)

// DefaultOutputBase is the default name (a template) of the merged outputs, before
// their suffixes.
const DefaultOutputBase = "merged"

var outSuffix = map[string]string{
	OutPickle: ".memory_snapshot.pickle", OutTrace: ".trace.json", OutSummary: ".summary.json",
	OutHTML: ".html", OutPB: ".memsnap.pb",
}

var outOrder = []string{OutPickle, OutTrace, OutSummary, OutHTML, OutPB}

// Config is one merge.
type Config struct {
	// Inputs are the per-rank snapshots (see Resolver).
	Inputs []Input
	// Out receives the merged outputs.
	Out store.Store
	// OutputBase is the template of the outputs' names, before their suffixes
	// (default "merged"); rendered with Vars.
	OutputBase string
	// Vars are the values OutputBase is rendered with (run_name, window, ...).
	Vars naming.Vars
	// Overwrite replaces outputs that exist already.
	Overwrite bool
	// Align is AlignWall (default), AlignStart or AlignOffsets.
	Align string
	// Offsets are per-rank clock offsets in microseconds (the rank's clock minus the
	// leader's) for AlignOffsets; ranks without one use their sidecar's, or zero.
	Offsets map[int]int64
	// WorldSize is the number of ranks expected; 0 takes it from the sidecars, or
	// the highest rank plus one.
	WorldSize int
	// Title names the run in the HTML report.
	Title string
	// Workers decode that many ranks ahead in parallel (0: up to 2). Memory holds at
	// most Workers+1 decoded ranks at once, whatever the number of ranks.
	Workers int
	// TempDir holds the outputs while they are written (default os.TempDir()).
	TempDir string
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
}

// Result says what a merge wrote.
type Result struct {
	Summary *Summary
	Outputs map[string]string // output kind -> key in Out
}

func (c *Config) validate() error {
	if len(c.Inputs) == 0 {
		return errors.New("merge: no inputs")
	}
	if c.Out == nil {
		return errors.New("merge: no output store")
	}
	switch c.Align {
	case "":
		c.Align = AlignWall
		if len(c.Offsets) > 0 {
			c.Align = AlignOffsets
		}
	case AlignWall, AlignStart, AlignOffsets:
	default:
		return fmt.Errorf("merge: unknown alignment %q (wall, start or offsets)", c.Align)
	}
	if c.OutputBase == "" {
		c.OutputBase = DefaultOutputBase
	}
	if c.Workers <= 0 {
		c.Workers = min(2, runtime.GOMAXPROCS(0))
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.WorldSize < 0 {
		return fmt.Errorf("merge: world size %d", c.WorldSize)
	}
	return nil
}

// OutputKeys renders the names of the five outputs.
func OutputKeys(base string, vars naming.Vars) (map[string]string, error) {
	t, err := naming.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("merge: output name: %w", err)
	}
	b, err := t.RenderKey(vars)
	if err != nil {
		return nil, fmt.Errorf("merge: output name: %w", err)
	}
	out := map[string]string{}
	for k, s := range outSuffix {
		if out[k], err = naming.CleanKey(b + s); err != nil {
			return nil, err
		}
	}
	return out, nil
}

type loaded struct {
	ranks []*rankData // one, or several for a .memsnap.pb
	err   error
}

// Merge merges the inputs rank by rank into the five outputs and stores them.
func Merge(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	keys, err := OutputKeys(cfg.OutputBase, cfg.Vars)
	if err != nil {
		return nil, err
	}
	if !cfg.Overwrite {
		for _, k := range outOrder {
			if _, err := cfg.Out.Stat(ctx, keys[k]); err == nil {
				return nil, fmt.Errorf("merge: %s exists in %s (pass overwrite to replace it): %w", keys[k], cfg.Out, store.ErrExists)
			} else if !errors.Is(err, store.ErrNotFound) {
				return nil, err
			}
		}
	}
	log := cfg.Logger
	start := time.Now()

	var tmp string
	if d, ok := cfg.Out.(*store.Dir); ok && cfg.TempDir == "" {
		tmp, err = d.TempDir() // outputs are moved into place, not copied
	} else {
		tmp, err = os.MkdirTemp(cfg.TempDir, "memsnap-merge-")
	}
	if err != nil {
		return nil, fmt.Errorf("merge: %w", err)
	}
	defer os.RemoveAll(tmp)
	files := map[string]*os.File{}
	for _, k := range outOrder {
		f, err := os.Create(filepath.Join(tmp, k))
		if err != nil {
			return nil, fmt.Errorf("merge: %w", err)
		}
		defer f.Close()
		files[k] = f
	}

	// Decode ahead in parallel, consume in rank order.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make([]chan loaded, len(cfg.Inputs))
	for i := range results {
		results[i] = make(chan loaded, 1)
	}
	sem := make(chan struct{}, cfg.Workers)
	go func() {
		for i, in := range cfg.Inputs {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			go func(i int, in Input) { results[i] <- load(ctx, in) }(i, in)
		}
	}()

	in := newInterner()
	pw, err := snapshot.NewWriter(files[OutPickle])
	if err != nil {
		return nil, err
	}
	tw := newTraceWriter(files[OutTrace])
	pbw := newPBWriter(files[OutPB], in)
	var (
		summaries []RankSummary
		curves    []htmlRank
		segments  []*snapshot.Segment
		settings  snapshot.Value
		annots    []snapshot.Value
		seen      = map[int]string{}
		nextRank  = 0 // the next device_traces index of the merged pickle
		worldMeta = 0
	)
	for i := range cfg.Inputs {
		var l loaded
		select {
		case l = <-results[i]:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		<-sem
		if l.err != nil {
			return nil, l.err
		}
		for _, r := range l.ranks {
			if prev, ok := seen[r.rank]; ok {
				return nil, fmt.Errorf("merge: rank %d is in both %s and %s", r.rank, prev, r.source)
			}
			if r.rank < nextRank {
				return nil, fmt.Errorf("merge: rank %d of %s arrives after rank %d; pass one merged file per rank range", r.rank, r.source, nextRank-1)
			}
			seen[r.rank] = r.source
			for ; nextRank < r.rank; nextRank++ { // ranks with no input: empty traces
				if err := pw.Trace(nil, 0); err != nil {
					return nil, err
				}
			}
			nextRank++
			if r.meta != nil {
				worldMeta = max(worldMeta, r.meta.WorldSize)
			}
			r.shiftUS = cfg.shift(r)
			for _, e := range r.trace {
				in.frameList(e.Frames)
			}
			tw.process(r.rank)
			lastA, lastR := int64(-1), int64(-1)
			s, pts := r.analyze(func(t, a, res int64) {
				if a != lastA {
					tw.counter(r.rank, "allocated", t, a)
					lastA = a
				}
				if res != lastR {
					tw.counter(r.rank, "reserved", t, res)
					lastR = res
				}
			})
			for _, o := range s.OOMs {
				tw.oom(r.rank, o)
			}
			hr := htmlRank{Rank: r.rank, Peak: s.PeakAllocatedBytes, Pts: make([][2]int64, len(pts))}
			for j, p := range pts {
				hr.Pts[j] = [2]int64{p.t, p.v}
			}
			for _, o := range s.OOMs {
				hr.OOMs = append(hr.OOMs, [2]int64{o.TimeUS, o.AllocatedThen})
			}
			if r.meta != nil {
				for _, b := range r.meta.Batches {
					tw.batch(r.rank, b, r.shiftUS)
					hr.Batches = append(hr.Batches, [3]int64{b.Batch, b.StartUS + r.shiftUS, b.EndUS + r.shiftUS})
				}
				for _, m := range r.meta.Samples {
					tw.counter(r.rank, "device used (NVML)", m.TimeUS+r.shiftUS, m.DeviceUsedBytes)
					if m.ProcessUsedBytes > 0 {
						tw.counter(r.rank, "process used (NVML)", m.TimeUS+r.shiftUS, m.ProcessUsedBytes)
					}
				}
			}
			if err := pw.Trace(r.trace, r.shiftUS); err != nil {
				return nil, err
			}
			pbw.rank(r, s)
			for _, g := range r.segs {
				in.frameList(g.Frames)
				for _, b := range g.Blocks {
					in.frameList(b.Frames)
				}
				g.Device = int64(r.rank)
				segments = append(segments, g)
			}
			if settings == nil && r.snap.Has&snapshot.SnapAllocatorSettings != 0 {
				settings = r.snap.AllocatorSettings
			}
			if l, ok := r.snap.ExternalAnnotations.(*snapshot.List); ok {
				for _, a := range l.Items {
					if d, ok := a.(*snapshot.Dict); ok {
						c := &snapshot.Dict{Items: append([]snapshot.Item(nil), d.Items...)}
						c.Set("rank", int64(r.rank))
						a = c
					}
					annots = append(annots, a)
				}
			}
			summaries = append(summaries, s)
			curves = append(curves, hr)
			log.Info("merged rank", "rank", r.rank, "events", len(r.trace), "peak_allocated", human(s.PeakAllocatedBytes), "source", r.source)
			r.snap, r.trace = nil, nil // let the decoded rank go
		}
	}

	world := cfg.WorldSize
	if world == 0 {
		world = max(worldMeta, nextRank)
	}
	if world < nextRank {
		return nil, fmt.Errorf("merge: rank %d is outside world size %d", nextRank-1, world)
	}
	for ; nextRank < world; nextRank++ {
		if err := pw.Trace(nil, 0); err != nil {
			return nil, err
		}
	}
	sum := &Summary{Version: 1, WorldSize: world, Align: cfg.Align, ClockOffsetsUS: map[string]int64{}, MissingRanks: []int{}, Ranks: summaries}
	for r := 0; r < world; r++ {
		if _, ok := seen[r]; ok {
			sum.RanksMerged = append(sum.RanksMerged, r)
		} else {
			sum.MissingRanks = append(sum.MissingRanks, r)
		}
	}
	for _, s := range summaries {
		sum.ClockOffsetsUS[strconv.Itoa(s.Rank)] = s.ClockOffsetUS
	}
	sum.Spread = computeSpread(summaries)
	sum.Outputs = keys
	if len(sum.MissingRanks) > 0 {
		log.Warn("ranks missing from the merge", "missing", sum.MissingRanks, "world_size", world)
	}

	var annotations snapshot.Value
	if annots != nil {
		annotations = &snapshot.List{Items: annots}
	}
	if err := pw.Finish(segments, settings, annotations, nil); err != nil {
		return nil, fmt.Errorf("merge: writing the merged pickle: %w", err)
	}
	if err := tw.finish(); err != nil {
		return nil, fmt.Errorf("merge: writing the trace: %w", err)
	}
	pbw.header(cfg.Align, world, sum.MissingRanks)
	if err := pbw.finish(); err != nil {
		return nil, fmt.Errorf("merge: writing the timeline: %w", err)
	}
	sb, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		return nil, err
	}
	if _, err := files[OutSummary].Write(append(sb, '\n')); err != nil {
		return nil, err
	}
	sort.Slice(curves, func(i, j int) bool { return curves[i].Rank < curves[j].Rank })
	if err := writeHTML(files[OutHTML], cfg.Title, sum, curves); err != nil {
		return nil, fmt.Errorf("merge: writing the report: %w", err)
	}
	for _, k := range outOrder {
		if err := files[k].Close(); err != nil {
			return nil, fmt.Errorf("merge: writing %s: %w", keys[k], err)
		}
		info, err := store.PutFile(ctx, cfg.Out, keys[k], filepath.Join(tmp, k), store.PutOptions{Overwrite: cfg.Overwrite, ContentType: contentType(k)})
		if err != nil {
			return nil, fmt.Errorf("merge: storing %s: %w", keys[k], err)
		}
		log.Info("stored", "output", keys[k], "bytes", info.Size, "store", cfg.Out.String())
	}
	log.Info("merge done", "ranks", len(summaries), "missing", len(sum.MissingRanks), "elapsed", time.Since(start).Round(time.Millisecond))
	return &Result{Summary: sum, Outputs: keys}, nil
}

func contentType(kind string) string {
	switch kind {
	case OutHTML:
		return "text/html; charset=utf-8"
	case OutTrace, OutSummary:
		return "application/json"
	}
	return "application/octet-stream"
}

// shift returns what is added to a rank's time_us to align it.
func (c *Config) shift(r *rankData) int64 {
	switch c.Align {
	case AlignStart:
		if len(r.trace) > 0 {
			return -r.trace[0].TimeUS
		}
	case AlignOffsets:
		if off, ok := c.Offsets[r.rank]; ok {
			return -off
		}
		if r.meta != nil && r.meta.ClockOffsetUS != nil {
			return -*r.meta.ClockOffsetUS
		}
	}
	return 0
}

// load reads and decodes one input.
func load(ctx context.Context, in Input) loaded {
	data, err := in.load(ctx)
	if err != nil {
		return loaded{err: fmt.Errorf("merge: reading %s: %w", in.Source, err)}
	}
	if isPB(in.Source) {
		ranks, err := ranksFromPB(data, in.Source)
		if err != nil {
			return loaded{err: err}
		}
		return loaded{ranks: ranks}
	}
	s, err := snapshot.DecodeAny(data)
	if err != nil {
		return loaded{err: fmt.Errorf("merge: %s: %w", in.Source, err)}
	}
	data = nil
	r := &rankData{rank: in.Rank, source: in.Source, snap: s}
	r.device, r.note = pickDevice(s)
	if r.device < len(s.DeviceTraces) {
		r.trace = s.DeviceTraces[r.device]
	}
	for _, g := range s.Segments {
		if int(g.Device) == r.device {
			r.segs = append(r.segs, g)
		}
	}
	if in.meta != nil {
		b, err := in.meta(ctx)
		if err != nil {
			return loaded{err: fmt.Errorf("merge: reading the metadata of %s: %w", in.Source, err)}
		}
		if b != nil {
			if r.meta, err = ParseRankMeta(b); err != nil {
				return loaded{err: fmt.Errorf("%s: %w", in.Source, err)}
			}
			if r.meta.Rank != in.Rank {
				return loaded{err: fmt.Errorf("merge: %s is rank %d by its name but its metadata says rank %d", in.Source, in.Rank, r.meta.Rank)}
			}
		}
	}
	return loaded{ranks: []*rankData{r}}
}
