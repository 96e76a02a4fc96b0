package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
)

// TestInspectMatchesFigures runs `memsnap inspect --json` and the reference
// figures.py on every real snapshot (the repository's copies, and ../shared's when
// present) and requires identical objects.
func TestInspectMatchesFigures(t *testing.T) {
	py := testutil.Python(t)
	root := testutil.RepoRoot(t)
	files, _ := filepath.Glob(filepath.Join(root, "testdata", "snapshots", "*", "*.pickle"))
	shared, _ := filepath.Glob(filepath.Join(root, "..", "shared", "testdata", "torch-2.11", "*", "*.pickle"))
	files = append(files, shared...)
	if len(files) < 12 {
		t.Fatalf("found only %d snapshots", len(files))
	}
	code, out, errOut := runCLI(t, append([]string{"inspect", "--json"}, files...)...)
	if code != 0 {
		t.Fatalf("inspect exited %d: %s", code, errOut)
	}
	want, err := exec.Command(py, append([]string{filepath.Join(root, "testdata", "figures.py")}, files...)...).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSpace(out), "\n")
	exp := strings.Split(strings.TrimSpace(string(want)), "\n")
	if len(got) != len(files) || len(exp) != len(files) {
		t.Fatalf("%d files, %d lines from inspect, %d from figures.py", len(files), len(got), len(exp))
	}
	for i := range files {
		var g, w map[string]any
		if err := json.Unmarshal([]byte(got[i]), &g); err != nil {
			t.Fatal(err)
		}
		json.Unmarshal([]byte(exp[i]), &w)
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%s:\n inspect    %s\n figures.py %s", files[i], got[i], exp[i])
		}
	}
}

func TestInspectRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	evil := filepath.Join(dir, "evil.pickle")
	os.WriteFile(evil, []byte("\x80\x04cos\nsystem\n(S'touch /tmp/pwned'\ntR."), 0o644)
	trunc := filepath.Join(dir, "trunc.pickle")
	data, _ := os.ReadFile(testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle"))
	os.WriteFile(trunc, data[:len(data)/2], 0o644)
	good := testutil.Snapshot(t, "single/oom.memory_snapshot.pickle")
	code, out, errOut := runCLI(t, "inspect", "--json", evil, good, trunc, filepath.Join(dir, "missing.pickle"))
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if len(lines) != 3 {
		t.Fatalf("want one error line per bad file, got %q", errOut)
	}
	if !strings.Contains(lines[0], "evil.pickle") || !strings.Contains(lines[0], "GLOBAL") || !strings.Contains(lines[0], "byte 2") {
		t.Errorf("evil: %s", lines[0])
	}
	if !strings.Contains(lines[1], "trunc.pickle") || !strings.Contains(lines[1], "truncated") {
		t.Errorf("trunc: %s", lines[1])
	}
	if !strings.Contains(lines[2], "missing.pickle") {
		t.Errorf("missing: %s", lines[2])
	}
	if !strings.Contains(out, `"file":"oom.memory_snapshot.pickle"`) {
		t.Errorf("the good file was not printed: %s", out)
	}
}
