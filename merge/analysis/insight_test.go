package analysis

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/internal/testjob"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
)

const mib = 1 << 20

func ddp4Dir(t testing.TB) string {
	return filepath.Dir(testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle"))
}

func analyseJob(t *testing.T, j testjob.Job, t0 int64) *RankAnalysis {
	t.Helper()
	s, meta := j.Build(t0)
	return analyse(t, s, meta)
}

func analyse(t *testing.T, s *snapshot.Snapshot, meta *sidecar.RankMeta) *RankAnalysis {
	t.Helper()
	a, err := AnalyzeSnapshot(context.Background(), s, meta, AnalyzeOptions{Rank: -1})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestLeakAcrossBatches(t *testing.T) {
	const t0 = 1_700_000_000_000_000
	a := analyseJob(t, testjob.Job{Batches: 6, Leak: 8 * mib}, t0)
	l := a.Leak
	if l == nil {
		t.Fatalf("a rank leaking 8 MiB a batch is not flagged; batches %+v", a.Batches)
	}
	if l.Batches != 6 || l.PerBatchBytes != 8*mib || l.GrowthBytes != 72*mib { // 40 MiB leaked, the 32 MiB gradient kept from batch 0 on
		t.Fatalf("leak %+v, want 6 batches growing 8 MiB each", l)
	}
	// the gradient lives into the next batch but is freed there: not a leak
	if len(l.Sites) != 1 || l.Sites[0].Site != testjob.LeakSite || l.Sites[0].PerBatchBytes != 8*mib || l.Sites[0].Batches != 5 || l.Sites[0].Blocks != 5 {
		t.Fatalf("leak sites %+v, want %s alone, 8 MiB in each of 5 batches", l.Sites, testjob.LeakSite)
	}
	if !strings.Contains(l.describe(), "8.0 MiB a batch over 6 batches; "+testjob.LeakSite+" leaves 8.0 MiB a batch") {
		t.Fatalf("described as %q", l.describe())
	}

	// the same training without the leak: nothing flagged
	if a := analyseJob(t, testjob.Job{Batches: 6}, t0); a.Leak != nil {
		t.Fatalf("a steady rank is flagged: %+v", a.Leak)
	}
	// growth under the threshold, or over too few batches: not flagged
	if a := analyseJob(t, testjob.Job{Batches: 6, Leak: 512 << 10}, t0); a.Leak != nil {
		t.Fatalf("512 KiB a batch is flagged: %+v", a.Leak)
	}
	if a := analyseJob(t, testjob.Job{Batches: 2, Leak: 64 * mib}, t0); a.Leak != nil {
		t.Fatalf("two batches are flagged: %+v", a.Leak)
	}
}

func TestTruncatedHistory(t *testing.T) {
	const t0 = 1_700_000_000_000_000
	s, meta := testjob.Job{Batches: 400}.Build(t0)
	full := s.DeviceTraces[0]
	if a := analyse(t, s, &sidecar.RankMeta{Version: 1, Batches: meta.Batches, MaxEntries: len(full) + 1}); a.Truncated != nil {
		t.Fatalf("a history under its cap is truncated: %+v", a.Truncated)
	}
	// the ring buffer kept the last 500 events: about the last 80 batches
	kept := full[len(full)-500:]
	s.DeviceTraces[0] = kept
	meta.MaxEntries = 500
	a := analyse(t, s, meta)
	tr := a.Truncated
	if tr == nil {
		t.Fatal("a history at its cap is not flagged")
	}
	if tr.Events != 500 || tr.MaxEntries != 500 || tr.MissingUS != kept[0].TimeUS-t0 {
		t.Fatalf("truncation %+v (first kept event at +%d µs)", tr, kept[0].TimeUS-t0)
	}
	// the suggestion holds the whole window's history, with no more than twice to spare
	if tr.SuggestMaxEntries < len(full) || tr.SuggestMaxEntries > 2*len(full) {
		t.Fatalf("suggested --max-entries %d for a window of %d events", tr.SuggestMaxEntries, len(full))
	}
	if tr.UnknownFrees == 0 {
		t.Fatal("frees of blocks the kept history never allocated are not counted")
	}
	if !strings.Contains(tr.Describe(), "500 events reached --max-entries 500") {
		t.Fatalf("described as %q", tr.Describe())
	}
	// without the cap in the metadata nothing is claimed
	meta.MaxEntries = 0
	if a := analyse(t, s, meta); a.Truncated != nil {
		t.Fatalf("truncation claimed without a known cap: %+v", a.Truncated)
	}
}

func TestRoundUpEntries(t *testing.T) {
	for in, want := range map[float64]int{10: 1000, 1000: 1000, 1001: 1100, 123456: 130000, 99999: 100000, 2e12: 1e9} {
		if got := roundUpEntries(in); got != want {
			t.Errorf("roundUpEntries(%v) = %d, want %d", in, got, want)
		}
	}
}

func TestMemoryOutsideTheAllocator(t *testing.T) {
	const t0 = 1_700_000_000_000_000
	s, meta := testjob.Job{Batches: 4}.Build(t0)
	// reserved is the 1 GiB segment throughout; NVML says 1.5 GiB used on the
	// device, 1.25 GiB by this process, and 3 GiB at one moment far from the peak
	for i := int64(0); i < 40; i++ {
		meta.Samples = append(meta.Samples, sidecar.MemorySample{TimeUS: t0 + i*100, DeviceUsedBytes: 1536 * mib, ProcessUsedBytes: 1280 * mib})
	}
	meta.Samples[39].DeviceUsedBytes = 3 << 30
	meta.Samples = append(meta.Samples, sidecar.MemorySample{TimeUS: t0 - 10_000_000, DeviceUsedBytes: 50 << 30}) // outside the window: ignored
	a := analyse(t, s, meta)
	o := a.Outside
	if o == nil {
		t.Fatal("no figure of memory outside the allocator")
	}
	if o.AtPeakBytes != 512*mib || o.MaxBytes != 2<<30 || o.ProcessAtPeakBytes == nil || *o.ProcessAtPeakBytes != 256*mib {
		t.Fatalf("outside %+v (process %v)", o, o.ProcessAtPeakBytes)
	}
	if a := analyse(t, s, &sidecar.RankMeta{Version: 1, Batches: meta.Batches}); a.Outside != nil {
		t.Fatalf("a figure without samples: %+v", a.Outside)
	}
}

func TestCategoriesAtThePeak(t *testing.T) {
	const t0 = 1_700_000_000_000_000
	want := map[string]int64{CatParameters: 256 * mib, CatGradients: 32 * mib, CatOptimizerState: 128 * mib,
		CatActivations: 64 * mib, CatTemporaries: 0, CatOther: 0, CatUnknown: 0}
	s, meta := testjob.Job{Batches: 6, Watch: true}.Build(t0)
	// decoded from its pickle, as the agent reads it
	b, err := snapshot.EncodeBytes(s)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Analyze(context.Background(), b, meta, AnalyzeOptions{Rank: -1})
	if err != nil {
		t.Fatal(err)
	}
	c := a.Categories
	if c == nil || c.Watched != 5 {
		t.Fatalf("categories %+v, want 5 watched tensors", c)
	}
	// the peak is in batch 0, whose gradient block is freed in batch 1: it is a
	// gradient because the last batch's gradient, watched, has the same slot
	if fmt.Sprint(c.AtPeak) != fmt.Sprint(want) {
		t.Fatalf("at the peak %v, want %v", c.AtPeak, want)
	}
	var sum int64
	for _, v := range c.AtPeak {
		sum += v
	}
	if sum != a.PeakAllocatedBytes {
		t.Fatalf("the categories add up to %d, the peak is %d", sum, a.PeakAllocatedBytes)
	}
	for k, v := range want {
		if c.Max[k] != v {
			t.Fatalf("most %s: %d, want %d", k, c.Max[k], v)
		}
	}
	mods := map[string]int64{}
	for _, m := range c.Modules {
		mods[m.Module+"/"+m.Category] = m.Bytes
	}
	wantMods := map[string]int64{"fc1/parameters": 128 * mib, "fc2/parameters": 128 * mib, "fc1/optimizer_state": 64 * mib,
		"fc2/optimizer_state": 64 * mib, "fc2/gradients": 32 * mib, "forward (/job/model.py:10)/activations": 64 * mib}
	if fmt.Sprint(mods) != fmt.Sprint(wantMods) {
		t.Fatalf("modules %v, want %v", mods, wantMods)
	}

	// not told: the weights are unknown, the gradient a temporary of the backward pass
	a = analyseJob(t, testjob.Job{Batches: 6}, t0)
	want = map[string]int64{CatParameters: 0, CatGradients: 0, CatOptimizerState: 0, CatActivations: 64 * mib, CatTemporaries: 32 * mib, CatOther: 0, CatUnknown: 256 * mib}
	if c := a.Categories; c == nil || c.Watched != 0 || fmt.Sprint(c.AtPeak) != fmt.Sprint(want) {
		t.Fatalf("unwatched categories %+v, want at the peak %v", c, want)
	}
}

// TestCategoriesAddUpOnRealSnapshots: on every recorded snapshot the categories
// at the peak add up to the peak, and none is larger at the peak than at most.
func TestCategoriesAddUpOnRealSnapshots(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(filepath.Dir(ddp4Dir(t)), "*", "*.pickle"))
	if len(files) < 4 {
		t.Fatalf("%d snapshots", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		a, err := Analyze(context.Background(), b, nil, AnalyzeOptions{Rank: 0})
		if err != nil {
			t.Fatal(err)
		}
		if a.Categories == nil {
			t.Fatalf("%s: no categories", f)
		}
		var sum int64
		for k, v := range a.Categories.AtPeak {
			sum += v
			if v > a.Categories.Max[k] {
				t.Fatalf("%s: %s is %d at the peak but at most %d", f, k, v, a.Categories.Max[k])
			}
		}
		if sum != a.PeakAllocatedBytes {
			t.Fatalf("%s: the categories %v add up to %d, the peak is %d", f, a.Categories.AtPeak, sum, a.PeakAllocatedBytes)
		}
	}
}

// TestGradientsSeenInTheWindow: a gradient block freed before the snapshot, at an
// address the surviving one does not have, is a gradient when the hook saw
// autograd make a gradient there; without that, a temporary of the backward pass.
func TestGradientsSeenInTheWindow(t *testing.T) {
	const t0 = 1_700_000_000_000_000
	for _, c := range []struct {
		seen       bool
		grads, tmp int64
	}{{true, 32 * mib, 0}, {false, 0, 32 * mib}} {
		a := analyseJob(t, testjob.Job{Batches: 6, Watch: true, GradFlip: true, SeenGrad: c.seen}, t0)
		at := a.Categories.AtPeak
		if at[CatGradients] != c.grads || at[CatTemporaries] != c.tmp || at[CatParameters] != 256*mib {
			t.Fatalf("seen %v: at the peak %v", c.seen, at)
		}
	}
}

// TestGradientAddressReusedInTheNextBatch: the allocator hands last batch's
// gradient address to a temporary of the same size in the optimizer's step (the
// gradients alternate between two addresses). Told with the batch each gradient
// was made in, only this batch's gradient is a gradient at the peak; told without
// (the hook's version 1), both addresses look like gradients.
func TestGradientAddressReusedInTheNextBatch(t *testing.T) {
	const t0 = 1_700_000_000_000_000
	a := analyseJob(t, testjob.Job{Batches: 6, Watch: true, GradFlip: true, MadeNotes: true, OptTemp: true}, t0)
	at := a.Categories.AtPeak
	if at[CatGradients] != 32*mib || at[CatTemporaries] != 32*mib || at[CatActivations] != 64*mib || at[CatParameters] != 256*mib {
		t.Fatalf("at the peak %v, want 32 MiB of gradients and 32 MiB of the optimizer's temporaries", at)
	}
	// version 1: the gradient seen at the other address counts the temporary too
	a = analyseJob(t, testjob.Job{Batches: 6, Watch: true, GradFlip: true, SeenGrad: true, OptTemp: true}, t0)
	if at := a.Categories.AtPeak; at[CatGradients] != 64*mib {
		t.Fatalf("version 1 at the peak %v", at)
	}
	// every gradient freed before the snapshot: the notes alone say what they were
	a = analyseJob(t, testjob.Job{Batches: 6, Watch: true, GradFlip: true, MadeNotes: true, OptTemp: true, GradFreed: true}, t0)
	if at := a.Categories.AtPeak; at[CatGradients] != 32*mib || at[CatTemporaries] != 32*mib {
		t.Fatalf("gradients freed before the snapshot: at the peak %v", at)
	}
	// without marks to place the blocks in batches, the notes name every block at
	// their addresses
	s, meta := (testjob.Job{Batches: 6, Watch: true, GradFlip: true, MadeNotes: true, OptTemp: true}).Build(t0)
	meta.Batches = nil
	if at := analyse(t, s, meta).Categories.AtPeak; at[CatGradients] != 64*mib {
		t.Fatalf("no marks: at the peak %v", at)
	}
}

// TestPhaseCacheAgreesWithStackPhase: the cached classification of every recorded
// allocation's stack is the one stackPhase gives, a Python stack with no forward
// frame being the training loop's own ("other").
func TestPhaseCacheAgreesWithStackPhase(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(filepath.Dir(ddp4Dir(t)), "*", "*.pickle"))
	var c phaseCache
	n := 0
	for _, f := range files {
		s, err := snapshot.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, tr := range s.DeviceTraces {
			for _, e := range tr {
				if e.Action != snapshot.ActionAlloc {
					continue
				}
				want := map[string]int{PhaseForward: cActs, PhaseBackward: cTemps, PhaseOptimizer: cTemps, "": cUnknown}[stackPhase(e.Frames)]
				if want == cActs && !slices.ContainsFunc(e.Frames, func(f *snapshot.Frame) bool { return f != nil && f.Name == "forward" }) {
					want = cOther // the training loop's own code, outside any module's forward
				}
				if got, _ := c.cat(e.Frames); got != want {
					t.Fatalf("%s: %s allocation classified %d, stackPhase says %d", f, siteName(e.Frames), got, want)
				}
				n++
			}
		}
	}
	if n < 1000 {
		t.Fatalf("only %d allocations", n)
	}
}

// TestCategoriesAddUpOnOddInput: the categories at the peak add up to the peak for
// a cut window whose peak is its start, a block whose free is pending at the
// snapshot, and a corrupt negative size; an activation reusing a gradient's
// address stays an activation.
func TestCategoriesAddUpOnOddInput(t *testing.T) {
	has := snapshot.EntryAction | snapshot.EntryAddr | snapshot.EntrySize | snapshot.EntryTimeUS | snapshot.EntryFrames
	ev := func(action string, addr, size, ts int64, fr *snapshot.Frame) *snapshot.TraceEntry {
		return &snapshot.TraceEntry{Action: action, Addr: addr, Size: size, TimeUS: ts, Frames: []*snapshot.Frame{fr}, Has: has}
	}
	blk := func(addr, size int64, state string) *snapshot.Block {
		return &snapshot.Block{Address: addr, Size: size, State: state, Has: snapshot.BlockAddress | snapshot.BlockSize | snapshot.BlockState}
	}
	snap := func(tr []*snapshot.TraceEntry, blocks ...*snapshot.Block) *snapshot.Snapshot {
		var total int64
		for _, b := range blocks {
			total += b.Size
		}
		seg := &snapshot.Segment{Address: 1 << 30, TotalSize: total, Blocks: blocks, Has: snapshot.SegDevice | snapshot.SegAddress | snapshot.SegTotalSize | snapshot.SegBlocks}
		return &snapshot.Snapshot{Segments: []*snapshot.Segment{seg}, DeviceTraces: [][]*snapshot.TraceEntry{tr}, Has: snapshot.SnapSegments | snapshot.SnapDeviceTraces}
	}
	const a0 = 1 << 30
	check := func(name string, s *snapshot.Snapshot, from *int64) *RankAnalysis {
		t.Helper()
		a, err := AnalyzeSnapshot(context.Background(), s, nil, AnalyzeOptions{Rank: 0, From: from})
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		for _, v := range a.Categories.AtPeak {
			sum += v
		}
		if sum != a.PeakAllocatedBytes {
			t.Fatalf("%s: the categories %v add up to %d, the peak is %d", name, a.Categories.AtPeak, sum, a.PeakAllocatedBytes)
		}
		return a
	}
	// the peak is where a cut window starts
	tr := []*snapshot.TraceEntry{ev("alloc", a0, 100*mib, 10, testjob.ActFrame), ev("alloc", a0+100*mib, 50*mib, 20, testjob.ActFrame),
		ev("free_completed", a0, 100*mib, 30, testjob.ActFrame), ev("free_completed", a0+100*mib, 50*mib, 40, testjob.ActFrame)}
	from := int64(25)
	if a := check("cut", snap(tr, blk(a0, 150*mib, "inactive")), &from); a.PeakAllocatedBytes != 150*mib {
		t.Fatalf("cut: peak %d", a.PeakAllocatedBytes)
	}
	// a block whose free is pending at the snapshot is still allocated
	tr = []*snapshot.TraceEntry{ev("alloc", a0+100*mib, 10*mib, 10, testjob.ActFrame), ev("free_requested", a0+100*mib, 10*mib, 20, testjob.ActFrame)}
	if a := check("pending", snap(tr, blk(a0, 100*mib, "active_allocated"), blk(a0+100*mib, 10*mib, "active_pending_free")), nil); a.PeakAllocatedBytes != 110*mib {
		t.Fatalf("pending: peak %d", a.PeakAllocatedBytes)
	}
	// a negative size counts as nothing
	tr = []*snapshot.TraceEntry{ev("alloc", a0, 50*mib, 10, testjob.ActFrame), ev("alloc", a0+50*mib, -5*mib, 20, testjob.ActFrame)}
	check("negative", snap(tr, blk(a0, 50*mib, "active_allocated"), blk(a0+50*mib, 10*mib, "inactive")), nil)

	// a gradient seen at an address, then an activation of its size there
	tr = []*snapshot.TraceEntry{ev("alloc", a0, 32*mib, 10, testjob.GradFrame), ev("free_completed", a0, 32*mib, 20, testjob.GradFrame),
		ev("alloc", a0, 32*mib, 30, testjob.ActFrame), ev("free_completed", a0, 32*mib, 40, testjob.ActFrame)}
	s := snap(tr, blk(a0, 32*mib, "inactive"))
	s.Extra = []snapshot.Item{{Key: TensorsKey, Value: &snapshot.Dict{Items: []snapshot.Item{{Key: "tensors", Value: &snapshot.List{Items: []snapshot.Value{
		&snapshot.List{Items: []snapshot.Value{int64(a0), int64(32 * mib), "gradient", "fc"}}}}}}}}}
	a := check("reused", s, nil)
	if a.Categories.Max[CatGradients] != 32*mib || a.Categories.Max[CatActivations] != 32*mib {
		t.Fatalf("reused: most %v", a.Categories.Max)
	}
}

// TestCategoryDiffOfTruncatedModuleLists: two ranks with the same model, one of
// which holds a large activation more, name their 20 largest modules at the peak;
// the activation pushes one of the model's modules out of that rank's list. The
// diff names the activation's module and no difference in the model's (on the
// H200, "parameters: layers.3.linear1 +16 MiB" came from a list cut this way).
func TestCategoryDiffOfTruncatedModuleLists(t *testing.T) {
	model := func() []ModuleBytes {
		var m []ModuleBytes
		for i := 0; i < analysisModules; i++ {
			m = append(m, ModuleBytes{Module: fmt.Sprintf("layers.%02d", i), Category: CatParameters, Bytes: 16 * mib})
		}
		return m
	}
	at := map[string]int64{CatParameters: 20 * 16 * mib, CatActivations: 0}
	base := &Categories{Watched: 40, AtPeak: at, Modules: model()}
	other := &Categories{Watched: 40, AtPeak: map[string]int64{CatParameters: 20 * 16 * mib, CatActivations: 96 * mib},
		Modules: append([]ModuleBytes{{Module: "leak.py:44", Category: CatActivations, Bytes: 96 * mib}}, model()[:analysisModules-1]...)}
	ds := diffCategories(base, other)
	for _, d := range ds {
		switch d.Category {
		case CatActivations:
			if d.DeltaBytes != 96*mib || d.Module != "leak.py:44" || d.ModuleDeltaBytes != 96*mib {
				t.Fatalf("activations: %+v", d)
			}
		case CatParameters:
			if d.DeltaBytes != 0 || d.Module != "" || d.ModuleDeltaBytes != 0 {
				t.Fatalf("parameters differ by module although no module does: %+v", d)
			}
		}
	}
	// a list that is not full names every module: one missing there holds nothing
	short := &Categories{Watched: 40, AtPeak: at, Modules: model()[:3]}
	shorter := &Categories{Watched: 40, AtPeak: at, Modules: model()[:2]}
	for _, d := range diffCategories(short, shorter) {
		if d.Category == CatParameters && (d.Module != "layers.02" || d.ModuleDeltaBytes != -16*mib) {
			t.Fatalf("a module gone from a complete list: %+v", d)
		}
	}
}

// TestCategoryDiffBoundsAMissingModule: a module missing from a full list holds
// up to that list's smallest entry, so a smaller share on the other side is no
// certain difference, and a larger one differs by at least the excess.
func TestCategoryDiffBoundsAMissingModule(t *testing.T) {
	full := func(extra ...ModuleBytes) []ModuleBytes {
		var m []ModuleBytes
		for i := 0; i < analysisModules; i++ {
			m = append(m, ModuleBytes{Module: fmt.Sprintf("layers.%02d", i), Category: CatParameters, Bytes: 16 * mib})
		}
		return append(m, extra...)
	}
	at := map[string]int64{CatParameters: 20 * 16 * mib, CatActivations: 64 * mib}
	base := &Categories{AtPeak: at, Modules: full()} // x's activations are not named: at most 16 MiB
	for _, c := range []struct {
		x, want int64
	}{{4 * mib, 0}, {16 * mib, 0}, {40 * mib, 24 * mib}} {
		other := &Categories{AtPeak: at, Modules: []ModuleBytes{{Module: "x", Category: CatActivations, Bytes: c.x}}}
		for _, d := range diffCategories(base, other) {
			if d.Category == CatActivations && d.ModuleDeltaBytes != c.want && !(c.want == 0 && d.Module != "x") {
				t.Fatalf("x holding %d MiB against a full list: %+v, want a difference of %d MiB", c.x/mib, d, c.want/mib)
			}
		}
	}
}

// TestFragmentedOOM: an OOM that asked for less than the allocator held free in
// its segments is told as fragmentation, with the usual remedy; one that asked
// for more than was free is not.
func TestFragmentedOOM(t *testing.T) {
	s := &Summary{Ranks: []RankSummary{
		{Rank: 3, OOMs: []OOM{{Size: 64 << 20, AllocatedThen: 1 << 30, ReservedThen: 3 << 29}}},
		{Rank: 5, OOMs: []OOM{{Size: 1 << 30, AllocatedThen: 1 << 30, ReservedThen: 3 << 29}}},
	}}
	got := strings.Join(s.Findings(), "\n")
	want := "rank 3 ran out of memory asking for 64.0 MiB while 512.0 MiB was reserved but not allocated: enough free memory, in pieces none large enough (fragmentation); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is the usual remedy"
	if !strings.Contains(got, want) || strings.Contains(got, "rank 5 ran out") {
		t.Fatalf("findings:\n%s", got)
	}
}

// TestFocusLeads: a window taken for a rank (a trigger, a post-mortem's first
// failure) answers with that rank first, naming what it kept, or why it is
// missing; without a focus the spread leads as before.
func TestFocusLeads(t *testing.T) {
	sp := &Spread{MedianPeakAllocatedBytes: 100 * mib, MaxPeakAllocatedBytes: 200 * mib, OutlierRank: 1, OutlierRanks: []int{1}, OutlierPeakBytes: 200 * mib}
	ranks := []RankSummary{{Rank: 0, PeakAllocatedBytes: 100 * mib},
		{Rank: 1, Events: 500, PeakAllocatedBytes: 200 * mib, KeptSites: []Site{{Site: "grow (train.py:9)", Bytes: 48 * mib, Blocks: 3}}}}
	s := &Summary{Spread: sp, Ranks: ranks, Focus: &Focus{Rank: 1, Why: "crossed a trigger: growing 16.0 MiB a batch"}}
	a := s.Answer()
	want := "rank 1, which this window was taken for (crossed a trigger: growing 16.0 MiB a batch): peak 200.0 MiB; allocated in the window and kept: grow (train.py:9) 48.0 MiB in 3 blocks"
	if len(a) < 2 || a[0] != want || !strings.HasPrefix(a[1], "peak allocated: median") {
		t.Fatalf("answer:\n%s", strings.Join(a, "\n"))
	}
	s.Focus = &Focus{Rank: 3, Why: "failed first: out of memory"}
	s.MissingReasons = map[string]string{"3": "its agent left the cluster"}
	if a := s.Answer(); a[0] != "rank 3, which this window was taken for (failed first: out of memory): its snapshot is missing: its agent left the cluster" {
		t.Fatalf("answer:\n%s", strings.Join(a, "\n"))
	}
	// a rank gone: the answer says where its history is
	s.Focus.Elsewhere = "its history is in oom post-mortem window 3"
	if a := s.Answer(); a[0] != "rank 3, which this window was taken for (failed first: out of memory): its snapshot is missing: its agent left the cluster; its history is in oom post-mortem window 3" {
		t.Fatalf("answer:\n%s", strings.Join(a, "\n"))
	}
	// a dump of a rank that kept no history (no --record-always) says so
	s.Focus, s.MissingReasons = &Focus{Rank: 1, Why: "crossed a trigger"}, nil
	s.Ranks[1].Events = 0
	if a := s.Answer(); !strings.HasSuffix(a[0], "its snapshot holds no allocator history (an agent keeps one only with --record-always, or while it records a window)") {
		t.Fatalf("answer:\n%s", strings.Join(a, "\n"))
	}
	s.Focus = nil
	if a := s.Answer(); !strings.HasPrefix(a[0], "peak allocated: median") || strings.Contains(strings.Join(a, "\n"), "taken for") {
		t.Fatalf("answer without a focus:\n%s", strings.Join(a, "\n"))
	}
}
