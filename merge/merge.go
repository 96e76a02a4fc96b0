package merge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"hash"
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
	// OutInputs is the claim, written before the outputs: what was merged, with what
	// options. OutManifest is written after them: it publishes the merge.
	OutInputs   = "inputs"
	OutManifest = "manifest"
)

// DefaultOutputBase is the default name (a template) of the merged outputs, before
// their suffixes.
const DefaultOutputBase = "merged"

var outSuffix = map[string]string{
	OutPickle: ".memory_snapshot.pickle", OutTrace: ".trace.json", OutSummary: ".summary.json",
	OutHTML: ".html", OutPB: ".memsnap.pb", OutInputs: ".inputs.json", OutManifest: ".manifest.json",
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
	// Window is the window the inputs recorded, for the claim and the manifest (nil
	// when unknown).
	Window *WindowInfo
	// MissingReasons says why a rank is missing, for the manifest (rank -> reason).
	MissingReasons map[int]string
	// Reason says why the window was recorded ("request", "schedule", a post-mortem
	// of an OOM), for the manifest.
	Reason string
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
	if c.WorldSize < 0 || c.WorldSize > MaxRanks {
		return fmt.Errorf("merge: world size %d (at most %d)", c.WorldSize, MaxRanks)
	}
	return nil
}

// OutputKeys renders the names of the outputs, the claim and the manifest.
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
	ref   InputRef
	err   error
}

// MaxRanks is the largest world size a merge accepts: a rank number, a world size
// in a sidecar or a timeline, or a flag above it is refused, so a hostile name such
// as rank50000000.5.memory_snapshot.pickle cannot make a merge write gigabytes of
// empty ranks.
const MaxRanks = 1 << 16

// Merge merges the inputs rank by rank into the five outputs and publishes them:
// the claim (<base>.inputs.json, what was merged), the outputs, and last the
// manifest (<base>.manifest.json, every output's checksum). A reader that finds the
// manifest finds every output; a merge interrupted before its manifest is finished
// by running it again with the same inputs, since a merge's outputs depend on
// nothing but its inputs and options.
func Merge(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	keys, err := OutputKeys(cfg.OutputBase, cfg.Vars)
	if err != nil {
		return nil, err
	}
	if !cfg.Overwrite {
		if _, err := cfg.Out.Stat(ctx, keys[OutManifest]); err == nil {
			return nil, fmt.Errorf("merge: %s exists in %s: this merge was published already (pass overwrite to replace it): %w", keys[OutManifest], cfg.Out, store.ErrExists)
		} else if !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
	}
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
	b, err := newBuilder(&cfg, tmp)
	if err != nil {
		return nil, err
	}
	defer b.close()

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
	var refs []InputRef
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
		refs = append(refs, l.ref)
		for _, r := range l.ranks {
			if err := b.add(r); err != nil {
				return nil, err
			}
		}
	}
	sum, err := b.finish()
	if err != nil {
		return nil, err
	}
	sum.Outputs = map[string]string{}
	for _, k := range outOrder {
		sum.Outputs[k] = keys[k]
	}
	if err := b.writeSummary(sum); err != nil {
		return nil, err
	}
	if err := publish(ctx, &cfg, keys, tmp, refs, sum, b.sums()); err != nil {
		return nil, err
	}
	cfg.Logger.Info("merge done", "ranks", len(sum.Ranks), "missing", len(sum.MissingRanks), "elapsed", time.Since(start).Round(time.Millisecond))
	return &Result{Summary: sum, Outputs: keys}, nil
}

// builder writes the merged outputs into temporary files, one rank at a time.
type builder struct {
	cfg       *Config
	files     map[string]*outFile
	in        *interner
	pw        *snapshot.Writer
	tw        *traceWriter
	pbw       *pbWriter
	summaries []RankSummary
	curves    []htmlRank
	segments  []*snapshot.Segment
	settings  snapshot.Value
	annots    []snapshot.Value
	seen      map[int]string
	nextRank  int // the next device_traces index of the merged pickle
	worldMeta int
}

func newBuilder(cfg *Config, tmp string) (*builder, error) {
	b := &builder{cfg: cfg, files: map[string]*outFile{}, in: newInterner(), seen: map[int]string{}}
	for _, k := range outOrder {
		f, err := os.Create(filepath.Join(tmp, k))
		if err != nil {
			b.close()
			return nil, fmt.Errorf("merge: %w", err)
		}
		b.files[k] = &outFile{f: f, h: sha256.New()}
	}
	pw, err := snapshot.NewWriter(b.files[OutPickle])
	if err != nil {
		b.close()
		return nil, err
	}
	b.pw = pw
	b.tw = newTraceWriter(b.files[OutTrace])
	b.pbw = newPBWriter(b.files[OutPB], b.in)
	return b, nil
}

func (b *builder) close() {
	for _, f := range b.files {
		f.f.Close()
	}
}

// outFile is one output being written, hashed as it goes so publishing need not
// read it again.
type outFile struct {
	f *os.File
	h hash.Hash
}

func (o *outFile) Write(p []byte) (int, error) {
	n, err := o.f.Write(p)
	o.h.Write(p[:n])
	return n, err
}

// sums returns each output's SHA-256.
func (b *builder) sums() map[string]string {
	out := map[string]string{}
	for k, f := range b.files {
		out[k] = hex.EncodeToString(f.h.Sum(nil))
	}
	return out
}

// add merges one rank.
func (b *builder) add(r *rankData) error {
	if prev, ok := b.seen[r.rank]; ok {
		return fmt.Errorf("merge: rank %d is in both %s and %s", r.rank, prev, r.source)
	}
	if r.rank < b.nextRank {
		return fmt.Errorf("merge: rank %d of %s arrives after rank %d; pass one merged file per rank range", r.rank, r.source, b.nextRank-1)
	}
	if r.rank >= MaxRanks || (b.cfg.WorldSize > 0 && r.rank >= b.cfg.WorldSize) {
		return fmt.Errorf("merge: rank %d of %s is outside the world size (%d, at most %d)", r.rank, r.source, max(b.cfg.WorldSize, 0), MaxRanks)
	}
	b.seen[r.rank] = r.source
	for ; b.nextRank < r.rank; b.nextRank++ { // ranks with no input: empty traces
		if err := b.pw.Trace(nil, 0); err != nil {
			return err
		}
	}
	b.nextRank++
	if r.meta != nil {
		b.worldMeta = max(b.worldMeta, r.meta.WorldSize)
	}
	r.shiftUS = b.cfg.shift(r)
	for _, e := range r.trace {
		b.in.frameList(e.Frames)
	}
	tw := b.tw
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
		for _, m := range r.meta.Batches {
			tw.batch(r.rank, m, r.shiftUS)
			hr.Batches = append(hr.Batches, [3]int64{m.Batch, m.StartUS + r.shiftUS, m.EndUS + r.shiftUS})
		}
		for _, m := range r.meta.Samples {
			tw.counter(r.rank, "device used (NVML)", m.TimeUS+r.shiftUS, m.DeviceUsedBytes)
			if m.ProcessUsedBytes > 0 {
				tw.counter(r.rank, "process used (NVML)", m.TimeUS+r.shiftUS, m.ProcessUsedBytes)
			}
		}
	}
	if err := b.pw.Trace(r.trace, r.shiftUS); err != nil {
		return err
	}
	b.pbw.rank(r, s)
	for _, g := range r.segs {
		b.in.frameList(g.Frames)
		for _, bl := range g.Blocks {
			b.in.frameList(bl.Frames)
		}
		g.Device = int64(r.rank)
		b.segments = append(b.segments, g)
	}
	if b.settings == nil && r.snap.Has&snapshot.SnapAllocatorSettings != 0 {
		b.settings = r.snap.AllocatorSettings
	}
	if l, ok := r.snap.ExternalAnnotations.(*snapshot.List); ok {
		for _, a := range l.Items {
			if d, ok := a.(*snapshot.Dict); ok {
				c := &snapshot.Dict{Items: append([]snapshot.Item(nil), d.Items...)}
				c.Set("rank", int64(r.rank))
				a = c
			}
			b.annots = append(b.annots, a)
		}
	}
	b.summaries = append(b.summaries, s)
	b.curves = append(b.curves, hr)
	b.cfg.Logger.Info("merged rank", "rank", r.rank, "events", len(r.trace), "peak_allocated", human(s.PeakAllocatedBytes), "source", r.source)
	r.snap, r.trace = nil, nil // let the decoded rank go
	return nil
}

// world is the world size: the configured one, else the largest the ranks'
// metadata names, else the highest rank plus one.
func (b *builder) world() (int, error) {
	world := b.cfg.WorldSize
	if world == 0 {
		world = max(b.worldMeta, b.nextRank)
	}
	if world > MaxRanks {
		return 0, fmt.Errorf("merge: world size %d is above the %d ranks a merge takes", world, MaxRanks)
	}
	if world < b.nextRank {
		return 0, fmt.Errorf("merge: rank %d is outside world size %d", b.nextRank-1, world)
	}
	return world, nil
}

// finish writes every output but the summary and returns the summary.
func (b *builder) finish() (*Summary, error) {
	world, err := b.world()
	if err != nil {
		return nil, err
	}
	for ; b.nextRank < world; b.nextRank++ {
		if err := b.pw.Trace(nil, 0); err != nil {
			return nil, err
		}
	}
	sum := &Summary{Version: 1, WorldSize: world, Align: b.cfg.Align, ClockOffsetsUS: map[string]int64{}, MissingRanks: []int{}, Ranks: b.summaries}
	for r := 0; r < world; r++ {
		if _, ok := b.seen[r]; ok {
			sum.RanksMerged = append(sum.RanksMerged, r)
		} else {
			sum.MissingRanks = append(sum.MissingRanks, r)
		}
	}
	for _, s := range b.summaries {
		sum.ClockOffsetsUS[strconv.Itoa(s.Rank)] = s.ClockOffsetUS
	}
	sum.Spread = computeSpread(b.summaries)
	if len(sum.MissingRanks) > 0 {
		b.cfg.Logger.Warn("ranks missing from the merge", "missing", len(sum.MissingRanks), "world_size", world)
	}
	var annotations snapshot.Value
	if b.annots != nil {
		annotations = &snapshot.List{Items: b.annots}
	}
	if err := b.pw.Finish(b.segments, b.settings, annotations, nil); err != nil {
		return nil, fmt.Errorf("merge: writing the merged pickle: %w", err)
	}
	if err := b.tw.finish(); err != nil {
		return nil, fmt.Errorf("merge: writing the trace: %w", err)
	}
	b.pbw.header(b.cfg.Align, world, sum.MissingRanks)
	if err := b.pbw.finish(); err != nil {
		return nil, fmt.Errorf("merge: writing the timeline: %w", err)
	}
	sort.Slice(b.curves, func(i, j int) bool { return b.curves[i].Rank < b.curves[j].Rank })
	if err := writeHTML(b.files[OutHTML], b.cfg.Title, sum, b.curves); err != nil {
		return nil, fmt.Errorf("merge: writing the report: %w", err)
	}
	return sum, nil
}

func (b *builder) writeSummary(sum *Summary) error {
	sb, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		return err
	}
	if _, err := b.files[OutSummary].Write(append(sb, '\n')); err != nil {
		return err
	}
	for _, k := range outOrder {
		if err := b.files[k].f.Close(); err != nil {
			return fmt.Errorf("merge: writing %s: %w", k, err)
		}
	}
	return nil
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
	ref := InputRef{Rank: in.Rank, Source: in.Source, Size: int64(len(data)), SHA256: sha256Hex(data)}
	if isPB(in.Source) {
		ranks, err := ranksFromPB(data, in.Source)
		if err != nil {
			return loaded{err: err}
		}
		return loaded{ranks: ranks, ref: ref}
	}
	s, err := snapshot.DecodeAnyContext(ctx, data)
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
			ref.MetaSHA256 = sha256Hex(b)
			if r.meta, err = ParseRankMeta(b); err != nil {
				return loaded{err: fmt.Errorf("%s: %w", in.Source, err)}
			}
			if r.meta.Rank != in.Rank {
				return loaded{err: fmt.Errorf("merge: %s is rank %d by its name but its metadata says rank %d", in.Source, in.Rank, r.meta.Rank)}
			}
		}
	}
	return loaded{ranks: []*rankData{r}, ref: ref}
}
