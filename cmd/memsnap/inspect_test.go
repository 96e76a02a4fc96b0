package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
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

// TestInspectRefusesNonRegularFiles gives inspect a device that never ends and a
// FIFO nobody writes to: both are refused with a line each, at once, and the good
// file between them is still printed.
func TestInspectRefusesNonRegularFiles(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo.pickle")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	good := testutil.Snapshot(t, "single/oom.memory_snapshot.pickle")
	code, out, errOut := runCLI(t, "inspect", "--json", "/dev/zero", good, fifo)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "/dev/zero") || !strings.Contains(lines[1], "fifo.pickle") {
		t.Fatalf("want one line for /dev/zero and one for the FIFO, got %q", errOut)
	}
	for _, l := range lines {
		if !strings.Contains(l, "not a regular file") {
			t.Errorf("%s: does not say why", l)
		}
	}
	if !strings.Contains(out, `"file":"oom.memory_snapshot.pickle"`) {
		t.Errorf("the good file was not printed: %s", out)
	}
}

// TestInspectStopsWhenCancelled runs inspect with its context already done (as
// after Ctrl-C): it stops before reading, says why, and prints nothing.
func TestInspectStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	good := testutil.Snapshot(t, "single/transformer.memory_snapshot.pickle")
	var o, e bytes.Buffer
	code := run(ctx, []string{"inspect", "--json", good, good}, &o, &e)
	if code != 1 || o.Len() != 0 || !strings.Contains(e.String(), "context canceled") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, o.String(), e.String())
	}
}

// TestInspectRestoresGC checks that inspect, which pauses the collector while it
// decodes, puts the setting back.
func TestInspectRestoresGC(t *testing.T) {
	if _, ok := os.LookupEnv("GOGC"); ok {
		t.Skip("GOGC is set: inspect leaves the collector alone")
	}
	prev := debug.SetGCPercent(123)
	defer debug.SetGCPercent(prev)
	good := testutil.Snapshot(t, "single/oom.memory_snapshot.pickle")
	if code, _, errOut := runCLI(t, "inspect", good, good); code != 0 {
		t.Fatalf("inspect: %s", errOut)
	}
	if got := debug.SetGCPercent(123); got != 123 {
		t.Fatalf("GOGC is %d after inspect, want 123", got)
	}
}

// TestInspectSaysTruncated: a snapshot whose sidecar gives a history cap its
// trace reached is said to be truncated, with the --max-entries that would hold it.
func TestInspectSaysTruncated(t *testing.T) {
	src := testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle")
	dir := t.TempDir()
	snap := filepath.Join(dir, "rank0.5.memory_snapshot.pickle")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(snap, b, 0o644)
	code, out, errOut := runCLI(t, "inspect", "--json", snap)
	if code != 0 {
		t.Fatalf("inspect: %s", errOut)
	}
	var plain struct {
		Devices   []struct{ Events int }
		Truncated *struct{ Events int } `json:"truncated"`
	}
	json.Unmarshal([]byte(out), &plain)
	if len(plain.Devices) == 0 || plain.Devices[0].Events == 0 || plain.Truncated != nil {
		t.Fatalf("inspect without a sidecar: %s", out)
	}
	n := plain.Devices[0].Events
	side := filepath.Join(dir, "rank0.5.memory_snapshot.memsnap.json")
	for _, c := range []struct {
		cap       int
		truncated bool
	}{{n + 1, false}, {n, true}} {
		os.WriteFile(side, []byte(`{"version":1,"rank":0,"max_entries":`+strconv.Itoa(c.cap)+`}`), 0o644)
		code, out, errOut := runCLI(t, "inspect", snap)
		want := "history truncated: " + strconv.Itoa(n) + " events reached --max-entries " + strconv.Itoa(n)
		if code != 0 || strings.Contains(out, want) != c.truncated {
			t.Fatalf("cap %d: inspect exited %d (%s), printed:\n%s", c.cap, code, errOut, out)
		}
		if c.truncated && !strings.Contains(out, "would have held it") {
			t.Fatalf("no suggested --max-entries:\n%s", out)
		}
	}
	_, out, _ = runCLI(t, "inspect", "--json", snap)
	json.Unmarshal([]byte(out), &plain)
	if plain.Truncated == nil || plain.Truncated.Events != n {
		t.Fatalf("inspect --json: %s", out)
	}
}
