package merge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/naming"
)

// plantedSite is the site that holds rank 3's extra 96 MiB buffer in the recorded
// 4-rank job (testdata/snapshots/ddp4).
const plantedSite = "<module> (/workspace/train/ddp_capture.py:27)"

// ddp4Marked copies the recorded 4-rank job into a folder with sidecars whose
// batch marks split each rank's trace into batches 5, 6 and 7 of equal time, and
// (with analyses) each rank's analysis beside it, as a rank agent stores them.
func ddp4Marked(t testing.TB, analyses bool) string {
	t.Helper()
	dir := t.TempDir()
	for r := 0; r < 4; r++ {
		name := fmt.Sprintf("rank%d.5.memory_snapshot.pickle", r)
		data, err := os.ReadFile(filepath.Join(ddp4Dir(t), name))
		if err != nil {
			t.Fatal(err)
		}
		meta := markedMeta(t, data, r)
		mb, _ := json.Marshal(meta)
		write(t, filepath.Join(dir, name), data)
		write(t, filepath.Join(dir, sidecar.MetaName(name)), mb)
		if !analyses {
			continue
		}
		a, err := analysis.Analyze(context.Background(), data, meta, analysis.AnalyzeOptions{Rank: -1})
		if err != nil {
			t.Fatal(err)
		}
		ab, err := a.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, analysis.AnalysisName(name)), ab)
	}
	return dir
}

func ddp4Dir(t testing.TB) string {
	return filepath.Dir(testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle"))
}

func write(t testing.TB, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// markedMeta is rank r's sidecar: three batches splitting its trace's time span.
func markedMeta(t testing.TB, data []byte, r int) *sidecar.RankMeta {
	s, err := snapshot.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	tr := s.DeviceTraces[0]
	t0, t1 := tr[0].TimeUS, tr[len(tr)-1].TimeUS
	step := (t1 - t0 + 3) / 3
	m := &sidecar.RankMeta{Version: 1, Rank: r, WorldSize: 4, Window: &sidecar.WindowInfo{ID: 1, Start: 5, Stop: 8}, StallUS: int64(1000 + r)}
	for b := int64(0); b < 3; b++ {
		m.Batches = append(m.Batches, sidecar.BatchMark{Batch: 5 + b, StartUS: t0 + b*step, EndUS: t0 + (b+1)*step - 1})
	}
	return m
}

// TestAnalysesGiveTheFullMergesOutputs: a merge that takes the ranks' figures from
// their analysis files writes byte-identical outputs (summary, report, trace,
// pickle, timeline, claim, manifest) to one that decodes every rank; under
// DetailDiff it decodes only the two ranks the diff compares.
func TestAnalysesGiveTheFullMergesOutputs(t *testing.T) {
	dir := ddp4Marked(t, true)
	ins := resolve(t, naming.ComposerSnapshotName, []string{dir})
	for _, detail := range []Detail{DetailAll, DetailDiff} {
		full, fdir := runMerge(t, Config{Inputs: ins, Title: "t", Detail: detail, Align: AlignStart})
		fast, adir := runMerge(t, Config{Inputs: ins, Title: "t", Detail: detail, Align: AlignStart, FromAnalyses: true})
		fa, fb := readAll(t, fdir), readAll(t, adir)
		if len(fa) != 7 || len(fa) != len(fb) {
			t.Fatalf("detail %d: %d and %d files", detail, len(fa), len(fb))
		}
		for k, v := range fa {
			if !bytes.Equal(v, fb[k]) {
				t.Fatalf("detail %d: %s differs between the full merge and the merge from analyses", detail, k)
			}
		}
		if fmt.Sprint(fast.FromAnalyses) != "[0 1 2 3]" || len(full.FromAnalyses) != 0 {
			t.Fatalf("detail %d: ranks from analyses: %v and %v", detail, full.FromAnalyses, fast.FromAnalyses)
		}
		want := "[0 1 2 3]"
		if detail == DetailDiff {
			want = "[1 3]"
		}
		if fmt.Sprint(fast.Decoded) != want {
			t.Fatalf("detail %d: the merge from analyses decoded ranks %v, want %v", detail, fast.Decoded, want)
		}
	}
}

// TestDetailDiffPickleHoldsTheDiffRanks: under DetailDiff the merged pickle holds
// events for the outlier and the median rank only, and the summary says so.
func TestDetailDiffPickleHoldsTheDiffRanks(t *testing.T) {
	dir := ddp4Marked(t, true)
	res, out := runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{dir}), Detail: DetailDiff, FromAnalyses: true})
	p := res.Summary.Pickles
	if len(p) != 1 || p[0].Ranks != "1,3" || p[0].FirstRank != 0 || p[0].LastRank != 3 {
		t.Fatalf("pickles %+v", p)
	}
	s, err := snapshot.ReadFile(filepath.Join(out, "merged.memory_snapshot.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	var n []int
	for _, tr := range s.DeviceTraces {
		n = append(n, len(tr))
	}
	if fmt.Sprint(n) != "[0 549 0 551]" {
		t.Fatalf("events per device %v", n)
	}
}

// TestUnusableAnalysesAreNotTrusted: an analysis of another rank, of other batch
// marks, or malformed is set aside (the rank is decoded and the outputs are the
// full merge's); one of another snapshot fails the merge when it is decoded.
func TestUnusableAnalysesAreNotTrusted(t *testing.T) {
	ref := ddp4Marked(t, true)
	a1, _ := os.ReadFile(filepath.Join(ref, analysis.AnalysisName("rank1.5.memory_snapshot.pickle")))
	cases := map[string]func(a *analysis.RankAnalysis) []byte{
		"another rank": func(a *analysis.RankAnalysis) []byte { return must(t, a1) },
		"other marks":  func(a *analysis.RankAnalysis) []byte { a.Batches[0].EndUS++; return marshal(t, a) },
		"malformed": func(a *analysis.RankAnalysis) []byte {
			return []byte(`{"version":1,"rank":2,"curve":{"t":[1,-5],"a":[0,0],"r":[0,0]}}`)
		},
		"garbage": func(a *analysis.RankAnalysis) []byte { return []byte("\x00not json") },
	}
	for name, spoil := range cases {
		t.Run(name, func(t *testing.T) {
			dir := ddp4Marked(t, true)
			p := filepath.Join(dir, analysis.AnalysisName("rank2.5.memory_snapshot.pickle"))
			b, _ := os.ReadFile(p)
			a, err := analysis.ParseAnalysis(b)
			if err != nil {
				t.Fatal(err)
			}
			write(t, p, spoil(a))
			ins := resolve(t, naming.ComposerSnapshotName, []string{dir})
			_, want := runMerge(t, Config{Inputs: ins})
			res, got := runMerge(t, Config{Inputs: ins, FromAnalyses: true})
			if fmt.Sprint(res.FromAnalyses) != "[0 1 3]" {
				t.Fatalf("ranks from analyses %v", res.FromAnalyses)
			}
			sameFile(t, want, got, "merged.summary.json")
			sameFile(t, want, got, "merged.html")
		})
	}
	dir := ddp4Marked(t, true)
	p := filepath.Join(dir, analysis.AnalysisName("rank2.5.memory_snapshot.pickle"))
	b, _ := os.ReadFile(p)
	a, _ := analysis.ParseAnalysis(b)
	a.Snapshot.SHA256 = strings.Repeat("ab", 32)
	write(t, p, marshal(t, a))
	st := openDir(t)
	_, err := Merge(testutil.Context(t, time.Minute), Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{dir}), Out: st, FromAnalyses: true})
	if err == nil || !strings.Contains(err.Error(), "not the snapshot its analysis describes") {
		t.Fatalf("an analysis of another snapshot: %v", err)
	}
}

func must(t *testing.T, b []byte) []byte {
	if len(b) == 0 {
		t.Fatal("empty")
	}
	return b
}

func marshal(t testing.TB, a *analysis.RankAnalysis) []byte {
	b, err := a.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sameFile(t *testing.T, a, b, name string) {
	t.Helper()
	x, _ := os.ReadFile(filepath.Join(a, name))
	y, _ := os.ReadFile(filepath.Join(b, name))
	if len(x) == 0 || !bytes.Equal(x, y) {
		t.Fatalf("%s differs", name)
	}
}

// TestSummaryDiffNamesThePlantedSite: the summary's diff compares the outlier
// (rank 3) with the median rank and puts the planted 96 MiB buffer first, held by
// rank 3 alone; its rows add up to the difference of the peaks.
func TestSummaryDiffNamesThePlantedSite(t *testing.T) {
	res, _ := runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{ddp4Marked(t, false)}), DiffRanks: []int{2}})
	d := res.Summary.Diff
	if d == nil || d.Other.Rank != 3 || d.Base.Rank != 1 {
		t.Fatalf("diff %+v", d)
	}
	top := d.Sites[0]
	if top.Site != plantedSite || top.Only != "other" || top.DeltaBytes != 96<<20 || top.BaseBytes != 0 {
		t.Fatalf("the first site of the diff is %+v", top)
	}
	var sum int64
	for _, s := range d.Sites {
		sum += s.DeltaBytes
	}
	if sum != d.PeakDeltaBytes || d.PeakDeltaBytes != res.Summary.Ranks[3].PeakAllocatedBytes-res.Summary.Ranks[1].PeakAllocatedBytes {
		t.Fatalf("the rows add up to %d, the peaks differ by %d", sum, d.PeakDeltaBytes)
	}
	if d.Other.PeakBatch == nil || d.Other.PeakPhase != analysis.PhaseOptimizer {
		t.Fatalf("rank 3's peak: batch %v, phase %q", d.Other.PeakBatch, d.Other.PeakPhase)
	}
	if len(res.Summary.DiffsAsked) != 1 || res.Summary.DiffsAsked[0].Other.Rank != 2 {
		t.Fatalf("asked diffs %+v", res.Summary.DiffsAsked)
	}
}

// TestBatchFigures: each rank's allocated bytes at the start and end of every
// batch, and its peak inside it, are those a plain replay of its trace gives.
func TestBatchFigures(t *testing.T) {
	dir := ddp4Marked(t, false)
	res, _ := runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{dir})})
	for _, rs := range res.Summary.Ranks {
		data, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank%d.5.memory_snapshot.pickle", rs.Rank)))
		s, _ := snapshot.Decode(data)
		meta := markedMeta(t, data, rs.Rank)
		if len(rs.BatchFigures) != 3 || rs.StallUS != int64(1000+rs.Rank) {
			t.Fatalf("rank %d: %d batch figures, stall %d", rs.Rank, len(rs.BatchFigures), rs.StallUS)
		}
		for i, f := range rs.BatchFigures {
			m := meta.Batches[i]
			start, end, peak := replay(s.DeviceTraces[0], s.AllocatedAtEnd(0), m.StartUS, m.EndUS)
			if f.Batch != m.Batch || f.StartAllocatedBytes != start || f.EndAllocatedBytes != end || f.PeakAllocatedBytes != peak {
				t.Fatalf("rank %d batch %d: %+v, a replay gives start %d end %d peak %d", rs.Rank, m.Batch, f, start, end, peak)
			}
		}
		if first := rs.BatchFigures[0]; first.StartAllocatedBytes != rs.StartAllocatedBytes {
			t.Fatalf("rank %d: batch 5 starts at %d, the trace at %d", rs.Rank, first.StartAllocatedBytes, rs.StartAllocatedBytes)
		}
	}
}

// replay computes, the plain way, the allocated bytes before from, after to, and
// the largest in between.
func replay(tr []*snapshot.TraceEntry, atEnd, from, to int64) (start, end, peak int64) {
	a := atEnd
	for _, e := range tr {
		dA, _ := analysis.Deltas(e)
		a -= dA
	}
	peak = -1 << 62
	for _, e := range tr {
		if e.TimeUS < from {
			dA, _ := analysis.Deltas(e)
			a += dA
		}
	}
	start, peak = a, a
	for _, e := range tr {
		if e.TimeUS >= from && e.TimeUS <= to {
			dA, _ := analysis.Deltas(e)
			a += dA
			peak = max(peak, a)
		}
	}
	return start, a, peak
}

func openDir(t testing.TB) *store.Dir {
	st, err := store.OpenDir(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
