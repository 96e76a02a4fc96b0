package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
)

func TestMergeCommand(t *testing.T) {
	out := t.TempDir()
	ddp := filepath.Dir(testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle"))
	code, stdout, stderr := runCLI(t, "merge", "-q", "--out", out, "--world-size", "5", ddp)
	if code != 0 {
		t.Fatalf("merge exited %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "merged 4 of 5 ranks") || !strings.Contains(stdout, "missing ranks: [4]") || !strings.Contains(stdout, "outlier: rank 3") {
		t.Fatalf("merge said: %s", stdout)
	}
	for _, n := range []string{"merged.memory_snapshot.pickle", "merged.trace.json", "merged.summary.json", "merged.html", "merged.memsnap.pb"} {
		if st, err := os.Stat(filepath.Join(out, n)); err != nil || st.Size() == 0 {
			t.Fatalf("%s: %v", n, err)
		}
	}
	// again without --overwrite: refused, with a hint
	code, _, stderr = runCLI(t, "merge", "-q", "--out", out, ddp)
	if code != 1 || !strings.Contains(stderr, "overwrite") {
		t.Fatalf("second merge: %d %s", code, stderr)
	}
	// the flags that bind into merge.Config reach it
	code, _, stderr = runCLI(t, "merge", "-q", "--out", out, "--output-name", "{run_name}/m", "--var", "run_name=gpt", "--align", "start",
		"--title", "the title", "--overwrite", ddp)
	if code != 0 {
		t.Fatalf("merge with --output-name: %d %s", code, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(out, "gpt", "m.summary.json")); err != nil || !strings.Contains(string(b), `"align": "start"`) {
		t.Fatalf("gpt/m.summary.json: %v\n%s", err, b)
	}
	if b, err := os.ReadFile(filepath.Join(out, "gpt", "m.html")); err != nil || !strings.Contains(string(b), "the title") {
		t.Fatalf("gpt/m.html lacks the title: %v", err)
	}
	// inspect reads the merged timeline back
	code, stdout, _ = runCLI(t, "inspect", "--json", filepath.Join(out, "merged.memsnap.pb"))
	if code != 0 || !strings.Contains(stdout, `"device":3`) {
		t.Fatalf("inspect pb: %d %s", code, stdout)
	}
	// a bad layout and a template without {rank}
	if code, _, stderr = runCLI(t, "merge", "--layout", "nope", ddp); code != 1 || !strings.Contains(stderr, "unknown --layout") {
		t.Fatalf("bad layout: %d %s", code, stderr)
	}
	if code, _, stderr = runCLI(t, "merge", "--name-template", "{batch}.pickle", ddp); code != 1 || !strings.Contains(stderr, "does not name {rank}") {
		t.Fatalf("template without rank: %d %s", code, stderr)
	}
}

func TestDemoCommand(t *testing.T) {
	out := t.TempDir()
	code, stdout, stderr := runCLI(t, "demo", "-q", "--out", out)
	if code != 0 {
		t.Fatalf("demo exited %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "merged from 4 ranks") || !strings.Contains(stdout, "outlier: rank 3") || strings.Contains(stdout, "missing") {
		t.Fatalf("demo said: %s", stdout)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "open ") || !strings.Contains(last, "merged.html") {
		t.Fatalf("the last line does not say where the report is: %q", last)
	}
	for _, pat := range []string{"demo-*/torch_memory_traces/rank0.*.memory_snapshot.pickle", "demo-*/torch_memory_traces/rank3.*.memory_snapshot.memsnap.json",
		"demo-*/torch_memory_traces/window1/merged.html", "demo-*/torch_memory_traces/window1/merged.summary.json", "demo-*/torch_memory_traces/window1/merged.manifest.json"} {
		if m, _ := filepath.Glob(filepath.Join(out, pat)); len(m) != 1 {
			t.Fatalf("%s: %v", pat, m)
		}
	}
	// the agents' batch marks reached the summary: every rank peaked inside the window
	sums, _ := filepath.Glob(filepath.Join(out, "demo-*", "torch_memory_traces", "window1", "merged.summary.json"))
	b, _ := os.ReadFile(sums[0])
	if !strings.Contains(string(b), `"batches": [`) || strings.Count(string(b), `"peak_allocated_batch": null`) != 0 {
		t.Fatalf("summary lacks batch marks:\n%s", b)
	}
}
