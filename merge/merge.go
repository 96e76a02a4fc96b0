package merge

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/render"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/naming"
)

// Alignment modes.
const (
	AlignWall    = "wall"    // each rank's own wall clock, as recorded
	AlignStart   = "start"   // each rank's first event at zero
	AlignOffsets = "offsets" // each rank's clock minus its measured offset from the leader
)

// fixedOutputs are the outputs after the pickles, in the order they are stored.
var fixedOutputs = []string{publish.OutTrace, publish.OutSummary, publish.OutHTML, publish.OutPB}

// Detail chooses the ranks whose full traces the merged pickles and the merged
// timeline hold.
type Detail int

const (
	// DetailAll puts every merged rank into the pickles and the timeline, which
	// decodes every rank's snapshot.
	DetailAll Detail = iota
	// DetailDiff puts only the ranks the summary's diffs compare there (the
	// outlier, the median rank and Config.DiffRanks): with FromAnalyses, the
	// leader decodes those snapshots and no others.
	DetailDiff
)

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
	Window *sidecar.WindowInfo
	// MissingReasons says why a rank is missing, for the manifest (rank -> reason).
	MissingReasons map[int]string
	// Partial names merged ranks that recorded only part of the window, and what
	// each covers and why, for the manifest (rank -> reason).
	Partial map[int]string
	// Reason says why the window was recorded ("request", "schedule", a post-mortem
	// of an OOM), for the manifest.
	Reason string
	// Kind is what the window is ("window", "oom" or "crash", as runlog names
	// them), for the manifest ("" for a merge of files).
	Kind string
	// Focus is the rank the window was taken for (the one that crossed a trigger,
	// a post-mortem's first failed rank): the findings lead with it. Nil: none.
	Focus *analysis.Focus
	// Attempt names this publication (a cluster's leader uses its term, "t7").
	// With Supersede, a claim under the window's names from another attempt, with
	// no manifest yet (a leader that died or stalled while publishing), does not
	// stop this merge: it publishes under names of its own, <base>.<attempt>.*,
	// and the manifest, which is created once, decides which set is published.
	// Two attempts never write the same name, so a leader that wakes from a stall
	// can never mix its outputs into its successor's.
	Attempt   string
	Supersede bool
	// Logger receives progress; nil discards it.
	Logger *slog.Logger

	// PickleMaxBytes bounds each merged pickle (0: DefaultPickleMaxBytes). Ranks
	// are split into groups that fit, one pickle per group, named by
	// PicklePartName; a rank larger than the bound alone is written alone.
	PickleMaxBytes int64
	// PicklePartName is the template of a part's name after the base name, with
	// {first} and {last} (default DefaultPicklePartName).
	PicklePartName string
	// Ranks, when not nil, merges only these ranks; the others are neither merged
	// nor reported missing.
	Ranks *RankSet
	// Batches, when not nil, keeps only these batches of every rank (by its batch
	// marks; a rank without marks for them is an error). From and To, when not
	// nil, keep only events between these aligned times (microseconds).
	Batches  *BatchRange
	From, To *int64
	// FromAnalyses takes each rank's figures from its analysis (an Input's
	// analysis loader, see Input.WithAnalysis) instead of its snapshot; a rank
	// without a usable analysis is decoded and analysed here. It does not apply
	// to a merge cut in time (the analyses cover whole windows).
	FromAnalyses bool
	// Detail chooses the ranks whose full traces the pickles and the timeline
	// hold (DetailAll by default).
	Detail Detail
	// DiffRanks are ranks the summary also compares with the median rank, besides
	// the outlier.
	DiffRanks []int
	// Progressive publishes in two steps (see mergeProgressive): first the
	// answer (the summary, the report, the trace, and a manifest whose Pending
	// says the pickles and the timeline are coming), then those and the manifest
	// that names them. OnAnswer, when set, is called once the answer is published.
	// Not with Overwrite.
	Progressive bool
	OnAnswer    func(Answer)
	// Fence, when set, is asked before the claim and every manifest are stored:
	// an error stops the merge there (a cluster's leader whose term was
	// superseded publishes nothing more).
	Fence func(ctx context.Context) error
}

// Result says what a merge wrote.
type Result struct {
	Summary *analysis.Summary
	// Manifest is the manifest published.
	Manifest *publish.Manifest
	Outputs  map[string]string // output kind -> key in Out (with the claim and the manifest)
	// Decoded are the ranks whose snapshots were decoded (in full), FromAnalyses
	// the ranks whose figures came from their analyses; both in rank order, with
	// repeats when a rank was decoded twice.
	Decoded      []int
	FromAnalyses []int
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
		c.OutputBase = publish.DefaultOutputBase
	}
	if c.Workers <= 0 {
		c.Workers = min(2, runtime.GOMAXPROCS(0))
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Progressive && c.Overwrite {
		return errors.New("merge: a progressive merge does not overwrite")
	}
	if c.WorldSize < 0 || c.WorldSize > sidecar.MaxRanks {
		return fmt.Errorf("merge: world size %d (at most %d)", c.WorldSize, sidecar.MaxRanks)
	}
	return c.validateCut()
}

// validateCut fills the defaults of the pickles' bound and checks the cut.
func (c *Config) validateCut() error {
	if c.PickleMaxBytes == 0 {
		c.PickleMaxBytes = render.DefaultPickleMaxBytes
	}
	if c.PicklePartName == "" {
		c.PicklePartName = render.DefaultPicklePartName
	}
	if c.PickleMaxBytes < 0 {
		return fmt.Errorf("merge: a pickle bound of %d bytes", c.PickleMaxBytes)
	}
	if err := render.CheckPartName(c.PicklePartName); err != nil {
		return err
	}
	if c.From != nil && c.To != nil && *c.To < *c.From {
		return fmt.Errorf("merge: the cut ends (%d) before it starts (%d)", *c.To, *c.From)
	}
	if c.Detail != DetailAll && c.Detail != DetailDiff {
		return fmt.Errorf("merge: unknown detail %d", c.Detail)
	}
	for _, r := range c.DiffRanks {
		if r < 0 || r >= sidecar.MaxRanks {
			return fmt.Errorf("merge: diff rank %d", r)
		}
	}
	return nil
}

// Merge merges the inputs rank by rank into the outputs and publishes them: the
// claim (<base>.inputs.json, what was merged), the outputs, and last the manifest
// (<base>.manifest.json, every output's checksum). A reader that finds the
// manifest finds every output; a merge interrupted before its manifest is finished
// by running it again with the same inputs, since a merge's outputs depend on
// nothing but its inputs and options.
//
// The merge runs in two passes. The first reads every rank in rank order (decoding
// up to Workers ahead), takes its analysis (from its analysis file under
// FromAnalyses, else by decoding its snapshot) and writes its part of the summary,
// the trace and the report; under DetailAll it also writes the rank's full trace
// into the pickles and the timeline. Under DetailDiff a second pass decodes only
// the ranks the diffs compare and writes those.
func Merge(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	keys, err := publish.OutputKeys(cfg.OutputBase, cfg.Vars)
	if err != nil {
		return nil, err
	}
	var answered *publish.Manifest // a progressive merge's answer, published already
	if cfg.Progressive {
		answered, err = readAnswer(ctx, &cfg, keys)
	} else {
		err = checkUnpublished(ctx, &cfg, keys)
	}
	if err != nil {
		return nil, err
	}
	b, done, err := startMerge(ctx, &cfg, keys, cfg.Progressive)
	if err != nil {
		return nil, err
	}
	defer done()
	if cfg.Progressive {
		return b.mergeProgressive(ctx, answered)
	}
	return b.mergePlain(ctx)
}

// mergePlain writes the detail pass and the outputs, and publishes them with their
// manifest.
func (b *builder) mergePlain(ctx context.Context) (*Result, error) {
	keys := b.keys
	if err := b.detailPass(ctx); err != nil {
		return nil, err
	}
	sum, outs, err := b.finish(keys)
	if err != nil {
		return nil, err
	}
	man, err := publish.Publish(ctx, b.cfg.publishing(), keys, b.tmp, b.refs, sum, outs)
	if err != nil {
		return nil, err
	}
	b.removeSuperseded(ctx)
	b.logDone(sum)
	res := &Result{Summary: sum, Manifest: man, Outputs: map[string]string{publish.OutInputs: keys[publish.OutInputs], publish.OutManifest: keys[publish.OutManifest]},
		Decoded: b.decoded, FromAnalyses: b.fromAnalyses}
	for _, o := range outs {
		res.Outputs[o.Kind] = o.Key
	}
	return res, nil
}

// checkUnpublished refuses a merge whose manifest exists, unless overwriting.
func checkUnpublished(ctx context.Context, cfg *Config, keys map[string]string) error {
	if cfg.Overwrite {
		return nil
	}
	_, err := cfg.Out.Stat(ctx, keys[publish.OutManifest])
	if err == nil {
		if _, rerr := publish.ReadManifest(ctx, cfg.Out, keys[publish.OutManifest]); errors.Is(rerr, publish.ErrClaimed) {
			return nil // (a leadership term's claim on the commit point, which the commit replaces)
		}
	}
	switch {
	case err == nil:
		return fmt.Errorf("merge: %s exists in %s: this merge was published already (pass overwrite to replace it): %w", keys[publish.OutManifest], cfg.Out, store.ErrExists)
	case !errors.Is(err, store.ErrNotFound):
		return err
	}
	return nil
}

// attemptKeys returns the names this merge publishes under: the window's own,
// unless Supersede is set and another attempt claimed them already, in which case
// <base>.<attempt>.* (the manifest keeps its name: it is the one commit point).
func attemptKeys(ctx context.Context, cfg *Config, keys map[string]string) (map[string]string, error) {
	if !cfg.Supersede || cfg.Overwrite {
		return keys, nil
	}
	if cfg.Attempt == "" || strings.ContainsAny(cfg.Attempt, "/\\.") || len(cfg.Attempt) > 32 {
		return nil, fmt.Errorf("merge: attempt name %q (a short name without '.', '/')", cfg.Attempt)
	}
	prev, err := publish.ReadClaim(ctx, cfg.Out, keys[publish.OutInputs])
	switch {
	case errors.Is(err, store.ErrNotFound):
		return keys, nil
	case err != nil && !errors.Is(err, publish.ErrBadClaim):
		return nil, err
	case err == nil && prev.Attempt == cfg.Attempt:
		return keys, nil // this attempt's own claim, from a try the store interrupted
	}
	base := strings.TrimSuffix(keys[publish.OutInputs], publish.OutSuffix[publish.OutInputs])
	out := map[string]string{}
	for k, v := range keys {
		out[k] = v
		if k != publish.OutManifest {
			out[k] = base + "." + cfg.Attempt + publish.OutSuffix[k]
		}
	}
	cfg.Logger.Info("another attempt claimed the window's names and did not publish; publishing under this attempt's names", "attempt", cfg.Attempt,
		"claimed_by", prev.Attempt, "names", base+"."+cfg.Attempt+".*")
	return out, nil
}

// startMerge settles the names the merge publishes under (attemptKeys), makes the
// folder the outputs are written in and the builder that writes them, and runs the
// first pass (deferred: writing no rank's detail); done removes both.
func startMerge(ctx context.Context, cfg *Config, keys map[string]string, deferred bool) (b *builder, done func(), err error) {
	attempt, err := attemptKeys(ctx, cfg, keys)
	if err != nil {
		return nil, nil, err
	}
	start := time.Now()
	tmp, err := cfg.tempDir()
	if err != nil {
		return nil, nil, err
	}
	if b, err = newBuilder(cfg, tmp); err != nil {
		os.RemoveAll(tmp)
		return nil, nil, err
	}
	done = func() { b.close(); os.RemoveAll(tmp) }
	b.deferred, b.plain, b.keys, b.start = deferred, keys, attempt, start
	if err := b.firstPass(ctx); err != nil {
		done()
		return nil, nil, err
	}
	return b, done, nil
}

// removeSuperseded removes what another attempt left under the window's own names
// once this one published under its own.
func (b *builder) removeSuperseded(ctx context.Context) {
	if b.plain[publish.OutInputs] != b.keys[publish.OutInputs] {
		publish.RemoveSuperseded(ctx, b.cfg.publishing(), b.plain, b.keys)
	}
}

// logDone logs the merge's end.
func (b *builder) logDone(sum *analysis.Summary) {
	b.cfg.Logger.Info("merge done", "ranks", len(sum.Ranks), "missing", len(sum.MissingRanks), "decoded", len(b.decoded),
		"from_analyses", len(b.fromAnalyses), "elapsed", time.Since(b.start).Round(time.Millisecond))
}

// tempDir makes the folder the outputs are written in: inside a folder store, so
// they are moved into place, not copied.
func (c *Config) tempDir() (string, error) {
	var tmp string
	var err error
	if d, ok := c.Out.(*store.Dir); ok && c.TempDir == "" {
		tmp, err = d.TempDir()
	} else {
		// what a killed merge left behind goes first
		store.SweepStale(cmp.Or(c.TempDir, os.TempDir()), "memsnap-merge-")
		tmp, err = os.MkdirTemp(c.TempDir, store.OwnedPattern("memsnap-merge-"))
	}
	if err != nil {
		return "", fmt.Errorf("merge: %w", err)
	}
	return tmp, nil
}

// publishing is how the merge publishes: the fields of c that publish.Config
// names.
func (c *Config) publishing() *publish.Config {
	return &publish.Config{Out: c.Out, Overwrite: c.Overwrite, Align: c.Align, Offsets: c.Offsets, Title: c.Title, Window: c.Window,
		Reason: c.Reason, Kind: c.Kind, Attempt: c.Attempt, Partial: c.Partial, Logger: c.Logger, Fence: c.Fence}
}

// shift returns what is added to a rank's time_us to align it; traceStart is its
// first event's time, when it has events.
func (c *Config) shift(rank int, meta *sidecar.RankMeta, traceStart int64, hasTrace bool) int64 {
	switch c.Align {
	case AlignStart:
		if hasTrace {
			return -traceStart
		}
	case AlignOffsets:
		if off, ok := c.Offsets[rank]; ok {
			return -off
		}
		if meta != nil && meta.ClockOffsetUS != nil {
			return -*meta.ClockOffsetUS
		}
	}
	return 0
}
