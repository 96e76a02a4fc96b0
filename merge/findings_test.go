package merge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/internal/testjob"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/naming"
)

const mib = 1 << 20

// mergeSynth merges synthetic ranks (rank r is jobs[r]) written as files, as a
// cluster's store holds them.
func mergeSynth(t *testing.T, title string, jobs ...testjob.Job) (*Result, string) {
	t.Helper()
	const t0 = 1_700_000_000_000_000
	dir := t.TempDir()
	for r, j := range jobs {
		s, meta := j.Build(t0)
		meta.Rank, meta.WorldSize = r, len(jobs)
		writeRank(t, dir, r, s, meta)
	}
	return runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{dir}), Title: title})
}

// TestFindingsInEveryOutput: a merge of a leaking, truncated rank and a steady one
// says so in the summary, the CLI's findings, the HTML report and the diff.
func TestFindingsInEveryOutput(t *testing.T) {
	res, out := findingsMerge(t)
	checkFindings(t, res, out)
}

// TestFindingsInChromium: the report's findings and leak table are in the page a
// browser renders.
func TestFindingsInChromium(t *testing.T) {
	_, out := findingsMerge(t)
	dom, _ := browse(t, filepath.Join(out, "merged.html"))
	for _, want := range []string{"<li>rank 1: allocated grows 8.0 MiB a batch over 6 batches; " + testjob.LeakSite,
		`<table class="leak" id="leak-1">`, "<li>rank 1: history truncated: 40 events reached --max-entries 40"} {
		if !strings.Contains(dom, want) {
			t.Fatalf("the rendered report lacks %q", want)
		}
	}
}

// findingsMerge merges a steady rank 0 with a rank 1 that leaks 8 MiB a batch and
// whose history reached its cap, both with NVML samples.
func findingsMerge(t *testing.T) (*Result, string) {
	const t0 = 1_700_000_000_000_000
	dir := t.TempDir()
	for r, j := range []testjob.Job{{Batches: 6}, {Batches: 6, Leak: 8 * mib}} {
		s, meta := j.Build(t0)
		meta.Rank, meta.WorldSize = r, 2
		for i := int64(0); i < 20; i++ {
			meta.Samples = append(meta.Samples, sidecar.MemorySample{TimeUS: t0 + i*300, DeviceUsedBytes: (1024 + 300 + int64(r)*100) * mib})
		}
		if r == 1 {
			meta.MaxEntries = len(s.DeviceTraces[0])
		}
		writeRank(t, dir, r, s, meta)
	}
	return runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{dir}), Title: "findings"})
}

func checkFindings(t *testing.T, res *Result, out string) {
	r1 := res.Summary.Ranks[1]
	if r1.Leak == nil || r1.Truncated == nil || r1.OutsideAllocator == nil || res.Summary.Ranks[0].Leak != nil || res.Summary.Ranks[0].Truncated != nil {
		t.Fatalf("rank 0: %+v; rank 1: leak %v truncated %v outside %v", res.Summary.Ranks[0], r1.Leak, r1.Truncated, r1.OutsideAllocator)
	}
	f := strings.Join(res.Summary.Findings(), "\n")
	for _, want := range []string{"rank 1: history truncated", "rank 1: allocated grows 8.0 MiB a batch over 6 batches; " + testjob.LeakSite,
		"outside the allocator (NVML device used less reserved) at the peak: median 300.0 MiB, most 400.0 MiB on rank 1"} {
		if !strings.Contains(f, want) {
			t.Fatalf("findings\n%s\nlack %q", f, want)
		}
	}
	if strings.Contains(f, "rank 0:") {
		t.Fatalf("findings name the steady rank:\n%s", f)
	}
	html, err := os.ReadFile(filepath.Join(out, findOutput(t, out, ".html")))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`<ul id="findings">`, "rank 1: allocated grows 8.0 MiB a batch", `id="leak-1"`, testjob.LeakSite, "outside allocator"} {
		if !bytes.Contains(html, []byte(want)) {
			t.Fatalf("the report lacks %q", want)
		}
	}
	var tbl bytes.Buffer
	if err := res.Summary.Diff.WriteTable(&tbl, 5); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"outside allocator", "grows per batch", "truncated"} {
		if !strings.Contains(tbl.String(), want) {
			t.Fatalf("the diff table lacks %q:\n%s", want, tbl.String())
		}
	}
}

func findOutput(t *testing.T, dir, suffix string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), suffix) {
			return e.Name()
		}
	}
	t.Fatalf("no %s output in %s", suffix, dir)
	return ""
}

// TestCategoryDiff: a rank whose forward makes a 96 MiB activation more is said to
// hold 96 MiB more activations, in that module: in the diff, its table, the
// findings and the report.
func TestCategoryDiff(t *testing.T) {
	res, out := mergeSynth(t, "categories", testjob.Job{Batches: 4, Watch: true}, testjob.Job{Batches: 4, Watch: true, BigAct: 96 * mib}, testjob.Job{Batches: 4, Watch: true})
	d := res.Summary.Diff
	if d == nil || d.Other.Rank != 1 || len(d.Categories) == 0 {
		t.Fatalf("diff %+v", d)
	}
	c := d.Categories[0]
	if c.Category != analysis.CatActivations || c.DeltaBytes != 96*mib || c.Module != "forward (/job/big.py:5)" || c.ModuleDeltaBytes != 96*mib {
		t.Fatalf("the first category of the diff: %+v", c)
	}
	for _, x := range d.Categories[1:] {
		if x.DeltaBytes != 0 {
			t.Fatalf("another category differs: %+v", x)
		}
	}
	want := "rank 1 holds 96.0 MiB more activations than rank 0, 96.0 MiB of it in forward (/job/big.py:5)"
	if h := d.CategoryHeadline(); h != want {
		t.Fatalf("headline %q, want %q", h, want)
	}
	f := strings.Join(res.Summary.Findings(), "\n")
	if !strings.Contains(f, want) || !strings.Contains(f, "rank 1 at its peak of 576.0 MiB: parameters 256.0 MiB, gradients 32.0 MiB, optimizer state 128.0 MiB, activations 160.0 MiB") {
		t.Fatalf("findings:\n%s", f)
	}
	var tbl bytes.Buffer
	d.WriteTable(&tbl, 5)
	if !strings.Contains(tbl.String(), "activations  (most in forward (/job/big.py:5): +96.0 MiB)") {
		t.Fatalf("the diff table:\n%s", tbl.String())
	}
	html, _ := os.ReadFile(filepath.Join(out, "merged.html"))
	for _, w := range []string{`<table id="categories">`, "<th>optimizer state</th>", "fc1 (parameters, 128.0 MiB)", `<tr class="cat"><td class="l">activations <i>(most in forward (/job/big.py:5): &#43;96.0 MiB)</i>`} {
		if !bytes.Contains(html, []byte(w)) {
			t.Fatalf("the report lacks %q:\n%s", w, html[max(0, bytes.Index(html, []byte("class=\"cat\""))-100):][:600])
		}
	}
}

// TestMergedPicklesReplay: every rank of a merged pickle replays against its
// segments, as memory_viz replays it (whole windows, and a cut one).
func TestMergedPicklesReplay(t *testing.T) {
	ins := resolve(t, naming.ComposerSnapshotName, []string{ddp4Marked(t, false)})
	for _, cfg := range []Config{{Inputs: ins}, {Inputs: ins, Batches: &BatchRange{Start: 6, Stop: 7}}} {
		_, out := runMerge(t, cfg)
		s, err := snapshot.ReadFile(filepath.Join(out, "merged.memory_snapshot.pickle"))
		if err != nil {
			t.Fatal(err)
		}
		for d := range s.DeviceTraces {
			if err := s.CheckReplay(d); err != nil {
				t.Errorf("cut %v: rank %d: %v", cfg.Batches, d, err)
			}
		}
	}
}

// writeRank stores rank r's snapshot and sidecar in dir as an agent names them.
func writeRank(t *testing.T, dir string, r int, s *snapshot.Snapshot, meta *sidecar.RankMeta) {
	t.Helper()
	b, err := snapshot.EncodeBytes(s)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("rank%d.0.memory_snapshot.pickle", r)
	mb, _ := json.Marshal(meta)
	write(t, filepath.Join(dir, name), b)
	write(t, filepath.Join(dir, sidecar.MetaName(name)), mb)
}

// TestManifestCarriesTheAnswer: a merge's manifest holds the answer (the spread,
// then the findings), and a manifest with too many or malformed findings is
// refused.
func TestManifestCarriesTheAnswer(t *testing.T) {
	res, out := findingsMerge(t)
	b, err := os.ReadFile(filepath.Join(out, "merged.manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := publish.ParseManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	want := res.Summary.Answer()
	if len(m.Findings) < 3 || fmt.Sprint(m.Findings) != fmt.Sprint(want) || !strings.HasPrefix(m.Findings[0], "peak allocated: median ") {
		t.Fatalf("manifest findings %q, the summary's answer %q", m.Findings, want)
	}
	var raw map[string]any
	json.Unmarshal(b, &raw)
	for _, bad := range [][]string{make([]string, analysis.MaxManifestFindings+1), {strings.Repeat("x", analysis.MaxFindingBytes+1)}} {
		raw["findings"] = bad
		nb, _ := json.Marshal(raw)
		if _, err := publish.ParseManifest(nb); err == nil {
			t.Fatalf("a manifest with findings %.60q was accepted", bad)
		}
	}
}

// TestDemoBufferIsNoActivation: the demo's rank 3 holds a 96 MiB buffer made at
// module level of its training script (ddp_capture.py:27), in no module's
// forward. It is not an activation: the diff and the headline say rank 3 holds
// more of the training loop's own allocations, made at that line.
func TestDemoBufferIsNoActivation(t *testing.T) {
	ins := resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)})
	res, _ := runMerge(t, Config{Inputs: ins})
	d := res.Summary.Diff
	if d == nil || d.Other.Rank != 3 || len(d.Categories) == 0 {
		t.Fatalf("diff %+v", d)
	}
	c := d.Categories[0]
	if c.Category != analysis.CatOther || c.DeltaBytes < 96*mib || !strings.HasSuffix(c.Module, "ddp_capture.py:27)") {
		t.Fatalf("the category that differs most: %+v", c)
	}
	h := d.CategoryHeadline()
	if !strings.Contains(h, "more other allocations than rank") || !strings.Contains(h, "ddp_capture.py:27") || strings.Contains(h, "activations") {
		t.Fatalf("headline %q", h)
	}
	for _, r := range res.Summary.Ranks {
		if r.Categories == nil {
			t.Fatalf("rank %d has no categories", r.Rank)
		}
		if acts := r.Categories.AtPeak[analysis.CatActivations]; acts >= 96*mib {
			t.Fatalf("rank %d holds %d bytes of activations at its peak", r.Rank, acts)
		}
	}
}
