package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/analysis"
)

// plantedSite holds rank 3's extra 96 MiB buffer in testdata/snapshots/ddp4.
const plantedSite = "<module> (/workspace/train/ddp_capture.py:27)"

func ddp4Dir(t *testing.T) string {
	return filepath.Dir(testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle"))
}

// TestDiffTwoSnapshots: rank 3 against rank 1, as a table and as JSON, names the
// planted buffer first, held by rank 3 alone.
func TestDiffTwoSnapshots(t *testing.T) {
	a, b := filepath.Join(ddp4Dir(t), "rank1.5.memory_snapshot.pickle"), filepath.Join(ddp4Dir(t), "rank3.5.memory_snapshot.pickle")
	code, out, errOut := runCLI(t, "diff", a, b)
	if code != 0 {
		t.Fatalf("diff exited %d: %s", code, errOut)
	}
	lines := strings.Split(out, "\n")
	var first string
	for i, l := range lines {
		if strings.Contains(l, "difference  site") && i+1 < len(lines) {
			first = lines[i+1]
		}
	}
	if !strings.Contains(first, plantedSite) || !strings.Contains(first, "+96.0 MiB") || !strings.Contains(first, "(only rank3.5.memory_snapshot.pickle)") {
		t.Fatalf("the first site row is %q in:\n%s", first, out)
	}
	d := diffJSON(t, "diff", "--json", a, b)
	if d.Sites[0].Site != plantedSite || d.Sites[0].Only != "other" || d.Sites[0].DeltaBytes != 96<<20 || d.Base.PeakPhase != "optimizer" {
		t.Fatalf("diff --json: %+v", d.Sites[0])
	}
}

func diffJSON(t *testing.T, args ...string) analysis.RankDiff {
	t.Helper()
	code, out, errOut := runCLI(t, args...)
	if code != 0 {
		t.Fatalf("%v exited %d: %s", args, code, errOut)
	}
	var d analysis.RankDiff
	if err := json.Unmarshal([]byte(out), &d); err != nil || len(d.Sites) == 0 {
		t.Fatalf("%v: %v: %s", args, err, out)
	}
	return d
}

// TestDiffMergedWindows: one merged window compares its outlier with its median
// rank; two merged windows compare one rank before and after (here, a window
// where rank 3 no longer holds the buffer).
func TestDiffMergedWindows(t *testing.T) {
	before, after := t.TempDir(), t.TempDir()
	if code, _, e := runCLI(t, "merge", "-q", "--out", before, ddp4Dir(t)); code != 0 {
		t.Fatal(e)
	}
	fixed := t.TempDir()
	for _, r := range []string{"0", "1", "2", "3"} {
		src := r
		if r == "3" {
			src = "2"
		}
		b, _ := os.ReadFile(filepath.Join(ddp4Dir(t), "rank"+src+".5.memory_snapshot.pickle"))
		os.WriteFile(filepath.Join(fixed, "rank"+r+".5.memory_snapshot.pickle"), b, 0o644)
	}
	if code, _, e := runCLI(t, "merge", "-q", "--out", after, fixed); code != 0 {
		t.Fatal(e)
	}
	pb1, pb2 := filepath.Join(before, "merged.memsnap.pb"), filepath.Join(after, "merged.memsnap.pb")
	d := diffJSON(t, "diff", "--json", pb1)
	if d.Base.Rank != 1 || d.Other.Rank != 3 || d.Sites[0].Site != plantedSite || d.Sites[0].Only != "other" {
		t.Fatalf("one window: %s vs %s, first %+v", d.Base.Label, d.Other.Label, d.Sites[0])
	}
	d = diffJSON(t, "diff", "--json", "--rank", "0", "--vs", "3", pb1)
	if d.Base.Rank != 3 || d.Other.Rank != 0 || d.Sites[0].DeltaBytes != -96<<20 {
		t.Fatalf("--rank 0 --vs 3: %+v", d.Sites[0])
	}
	d = diffJSON(t, "diff", "--json", "--rank", "3", pb1, pb2)
	if d.Sites[0].Site != plantedSite || d.Sites[0].Only != "base" || d.Sites[0].DeltaBytes != -96<<20 {
		t.Fatalf("before/after: %+v", d.Sites[0])
	}
	// the two windows' files have one name: each is named by its folder
	if a, b := filepath.Base(before)+"/merged.memsnap.pb#rank3", filepath.Base(after)+"/merged.memsnap.pb#rank3"; d.Base.Label != a || d.Other.Label != b {
		t.Fatalf("before/after labelled %q and %q, want %q and %q", d.Base.Label, d.Other.Label, a, b)
	}
	if code, _, e := runCLI(t, "diff", pb1, pb2); code != 1 || !strings.Contains(e, "say which") {
		t.Fatalf("two timelines without --rank: %d %s", code, e)
	}
}

// TestAnalyzeThenDiff: `memsnap analyze` writes what a rank agent uploads, and
// diff reads it as it reads the snapshot.
func TestAnalyzeThenDiff(t *testing.T) {
	dir := t.TempDir()
	for _, r := range []string{"1", "3"} {
		out := filepath.Join(dir, "rank"+r+".analysis.json")
		code, _, e := runCLI(t, "analyze", "--rank", r, "-o", out, filepath.Join(ddp4Dir(t), "rank"+r+".5.memory_snapshot.pickle"))
		if code != 0 {
			t.Fatal(e)
		}
		b, _ := os.ReadFile(out)
		a, err := analysis.ParseAnalysis(b)
		if err != nil || strconv.Itoa(a.Rank) != r {
			t.Fatalf("analysis of rank %s: %v", r, err)
		}
	}
	d := diffJSON(t, "diff", "--json", filepath.Join(dir, "rank1.analysis.json"), filepath.Join(dir, "rank3.analysis.json"))
	if d.Sites[0].Site != plantedSite {
		t.Fatalf("first site %+v", d.Sites[0])
	}
	for _, args := range [][]string{{"diff"}, {"diff", "a", "b", "c"}, {"analyze"}} {
		if code, _, _ := runCLI(t, args...); code != 2 {
			t.Fatalf("%v: exit %d, want 2", args, code)
		}
	}
	if code, _, e := runCLI(t, "diff", filepath.Join(ddp4Dir(t), "rank1.5.memory_snapshot.pickle")); code != 1 || !strings.Contains(e, "not a merged timeline") {
		t.Fatalf("one snapshot: %d %s", code, e)
	}
}

// TestMergeCutAndSplitFlags: --ranks cuts the merge, --pickle-max-bytes splits
// the pickle, and the summary says which part holds which ranks.
func TestMergeCutAndSplitFlags(t *testing.T) {
	out := t.TempDir()
	code, stdout, e := runCLI(t, "merge", "-q", "--out", out, "--ranks", "0,2-3", "--pickle-max-bytes", "400000", ddp4Dir(t))
	if code != 0 {
		t.Fatal(e)
	}
	if !strings.Contains(stdout, "merged 3 of 4 ranks") || strings.Contains(stdout, "missing") || !strings.Contains(stdout, "rank 3 against rank 2") {
		t.Fatalf("merge said: %s", stdout)
	}
	var s analysis.Summary
	b, _ := os.ReadFile(filepath.Join(out, "merged.summary.json"))
	if err := json.Unmarshal(b, &s); err != nil || len(s.Pickles) < 2 {
		t.Fatalf("summary pickles: %v %+v", err, s.Pickles)
	}
	for _, p := range s.Pickles {
		st, err := os.Stat(filepath.Join(out, p.Name))
		if err != nil || st.Size() > 400000 {
			t.Fatalf("part %s: %v", p.Name, err)
		}
	}
	for _, bad := range [][]string{{"--ranks", "x"}, {"--batches", "5"}, {"--detail", "some"}, {"--pickle-max-bytes", "0"}, {"--diff-rank", "-1"}, {"--from", "soon"}} {
		args := append([]string{"merge", "-q", "--out", t.TempDir()}, append(bad, ddp4Dir(t))...)
		if code, _, _ := runCLI(t, args...); code == 0 {
			t.Fatalf("%v was accepted", bad)
		}
	}
}
