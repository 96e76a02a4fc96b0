package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/runlog"
)

// TestLsAndGetPublishedMerge: ls lists the merge published in a real MinIO from its
// manifest; get fetches every output, verifies each checksum, never silently
// replaces a local file, and refuses an object whose content changed.
func TestLsAndGetPublishedMerge(t *testing.T) {
	m := testutil.RequireMinIO(t)
	bucket := testutil.BucketName(t)
	creds := []string{"--endpoint", m.Endpoint, "--access-key", m.AccessKey, "--secret-key", m.SecretKey}
	ddp := filepath.Dir(testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle"))
	code, out, errOut := runCLI(t, append([]string{"merge", "-q", "--out", "s3://" + bucket + "/run/merged", ddp}, creds...)...)
	if code != 0 {
		t.Fatalf("merge: %d %s %s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, append([]string{"ls", "s3://" + bucket + "/run"}, creds...)...)
	if code != 0 || !strings.Contains(out, "4/4") || !strings.Contains(out, "run/merged/merged.*") {
		t.Fatalf("ls: %d %q %q", code, out, errOut)
	}
	code, out, _ = runCLI(t, append([]string{"ls", "--objects", "s3://" + bucket + "/run"}, creds...)...)
	if code != 0 || strings.Count(out, "\n") != 7 {
		t.Fatalf("ls --objects: %d %q", code, out)
	}

	dest := t.TempDir()
	src := "s3://" + bucket + "/run/merged/merged.manifest.json"
	code, out, errOut = runCLI(t, append([]string{"get", src, dest}, creds...)...)
	if code != 0 || strings.Count(out, "\n") != 7 || strings.Count(errOut, "sha256 verified") != 7 {
		t.Fatalf("get: %d %q %q", code, out, errOut)
	}
	for _, n := range []string{"merged.html", "merged.memory_snapshot.pickle", "merged.trace.json", "merged.summary.json", "merged.memsnap.pb", "merged.inputs.json", "merged.manifest.json"} {
		if _, err := os.Stat(filepath.Join(dest, n)); err != nil {
			t.Fatal(err)
		}
	}
	// a prefix: the manifest comes last, so an interrupted get never leaves one
	// naming files that are not there
	code, out, errOut = runCLI(t, append([]string{"get", "s3://" + bucket + "/run/", t.TempDir()}, creds...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 7 || !strings.Contains(lines[6], "merged.manifest.json") {
		t.Fatalf("get of a prefix: %d %q %q", code, out, errOut)
	}
	// again: nothing changes
	code, _, errOut = runCLI(t, append([]string{"get", src, dest}, creds...)...)
	if code != 0 || strings.Count(errOut, "up to date") != 7 {
		t.Fatalf("second get: %d %q", code, errOut)
	}
	// a local file with other content is kept
	html := filepath.Join(dest, "merged.html")
	os.WriteFile(html, []byte("mine"), 0o644)
	code, _, errOut = runCLI(t, append([]string{"get", src, dest}, creds...)...)
	if code == 0 || !strings.Contains(errOut, "holds other content") {
		t.Fatalf("get over a changed local file: %d %q", code, errOut)
	}
	if b, _ := os.ReadFile(html); string(b) != "mine" {
		t.Fatal("get replaced a local file without --overwrite")
	}
	code, _, errOut = runCLI(t, append([]string{"get", "--overwrite", src, dest}, creds...)...)
	if b, _ := os.ReadFile(html); code != 0 || string(b) == "mine" {
		t.Fatalf("get --overwrite: %d %q", code, errOut)
	}
	// an object that no longer matches its manifest is refused, and nothing is written
	ctx := testutil.Context(t, time.Minute)
	st, err := store.Open(ctx, store.Config{URL: "s3://" + bucket + "/run/merged", Endpoint: m.Endpoint,
		Credentials: store.Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(ctx, "merged.trace.json", bytes.NewReader([]byte("{}")), store.PutOptions{Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	dest2 := t.TempDir()
	code, _, errOut = runCLI(t, append([]string{"get", src, dest2}, creds...)...)
	if code == 0 || !strings.Contains(errOut, "checksum") {
		t.Fatalf("get of a changed object: %d %q", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dest2, "merged.trace.json")); err == nil {
		t.Fatal("a file that failed its checksum was kept")
	}
}

// TestCommandsOnBothStores: get copies a folder store's window (checksums
// checked) as it does an S3 one; diff, inspect and analyze read s3:// URLs as
// they read files; ls's outputs column is a URL get takes, and its times say
// they are UTC.
func TestCommandsOnBothStores(t *testing.T) {
	m := testutil.RequireMinIO(t)
	bucket := testutil.BucketName(t)
	creds := []string{"--endpoint", m.Endpoint, "--access-key", m.AccessKey, "--secret-key", m.SecretKey}
	ddp := filepath.Dir(testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle"))
	// a folder store: get a window from it
	dir := t.TempDir()
	if code, out, errOut := runCLI(t, "merge", "-q", "--out", filepath.Join(dir, "run", "merged"), ddp); code != 0 {
		t.Fatalf("merge into a folder: %d %s %s", code, out, errOut)
	}
	dest := t.TempDir()
	code, out, errOut := runCLI(t, "get", filepath.Join(dir, "run", "merged", "merged.manifest.json"), dest)
	if code != 0 || strings.Count(errOut, "sha256 verified") != 7 {
		t.Fatalf("get from a folder store: %d %q %q", code, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(dest, "merged.html")); err != nil {
		t.Fatal(err)
	}
	// S3: a merge, then ls's outputs as get takes them
	if code, out, errOut := runCLI(t, append([]string{"merge", "-q", "--out", "s3://" + bucket + "/run/merged", ddp}, creds...)...); code != 0 {
		t.Fatalf("merge into S3: %d %s %s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, append([]string{"ls", "s3://" + bucket + "/run"}, creds...)...)
	if code != 0 || !strings.Contains(out, "TIME (UTC)") {
		t.Fatalf("ls: %d %q %q", code, out, errOut)
	}
	var outputs string
	for _, f := range strings.Fields(out) {
		if strings.HasPrefix(f, "s3://") && strings.HasSuffix(f, ".*") {
			outputs = f
		}
	}
	if outputs != "s3://"+bucket+"/run/merged/merged.*" {
		t.Fatalf("ls's outputs column: %q", out)
	}
	if code, _, errOut := runCLI(t, append([]string{"get", strings.TrimSuffix(outputs, ".*") + ".manifest.json", t.TempDir()}, creds...)...); code != 0 {
		t.Fatalf("get of what ls says: %d %q", code, errOut)
	}
	// snapshots in S3: inspect, analyze and diff read them
	for r := 0; r < 4; r++ {
		src := testutil.Snapshot(t, fmt.Sprintf("ddp4/rank%d.5.memory_snapshot.pickle", r))
		if code, _, errOut := runCLI(t, append([]string{"merge", "-q", "--rank", fmt.Sprintf("%d=%s", r, src), "--out", fmt.Sprintf("s3://%s/one%d/merged", bucket, r)}, creds...)...); code != 0 {
			t.Fatalf("merge of rank %d: %q", r, errOut)
		}
	}
	a, b := "s3://"+bucket+"/one1/merged/merged.memory_snapshot.pickle", "s3://"+bucket+"/one3/merged/merged.memory_snapshot.pickle"
	if code, out, errOut := runCLI(t, append([]string{"inspect", "--json", a}, creds...)...); code != 0 || !strings.Contains(out, `"events"`) {
		t.Fatalf("inspect of an s3:// URL: %d %q %q", code, out, errOut)
	}
	if code, out, errOut := runCLI(t, append([]string{"analyze", a}, creds...)...); code != 0 || !strings.Contains(out, "peak_allocated_bytes") {
		t.Fatalf("analyze of an s3:// URL: %d %q %q", code, out, errOut)
	}
	if code, out, errOut := runCLI(t, append([]string{"diff", "--json", a, b}, creds...)...); code != 0 || !strings.Contains(out, `"source": "s3://`) {
		t.Fatalf("diff of two s3:// URLs: %d %q %q", code, out, errOut)
	}
}

// TestKindLabels: snapshot's answer and ls name a window's kind alike: a
// trigger's window is a "trigger window" in both.
func TestKindLabels(t *testing.T) {
	for _, c := range []struct {
		kind pb.WindowKind
		want string
	}{
		{pb.WindowKind_WINDOW_KIND_UNSPECIFIED, "window"},
		{pb.WindowKind_WINDOW_KIND_WINDOW, "window"},
		{pb.WindowKind_WINDOW_KIND_TRIGGER, "trigger window"},
		{pb.WindowKind_WINDOW_KIND_OOM, "OOM post-mortem"},
		{pb.WindowKind_WINDOW_KIND_CRASH, "crash post-mortem"},
	} {
		var b strings.Builder
		printAnswer(&b, &pb.WindowResult{Kind: c.kind, Start: 4, Stop: 6, Ranks: []int32{0}}, 7, false)
		if want := c.want + " 7 (batches 4-5) published"; !strings.HasPrefix(b.String(), want) {
			t.Errorf("%v: %q, want %q", c.kind, b.String(), want)
		}
		if c.kind == pb.WindowKind_WINDOW_KIND_UNSPECIFIED {
			continue
		}
		row := windowRow{kind: pb.Name(c.kind)} // as the run's log names it
		if cells := strings.Split(row.line(nil), "\t"); cells[2] != c.want {
			t.Errorf("%v: ls's row says %q, want %q", c.kind, cells[2], c.want)
		}
	}
}

// TestFinishHint: the command ls names for unfinished windows is the agents'
// store, whatever location ls was given, quoted for a shell where it needs it.
func TestFinishHint(t *testing.T) {
	for _, c := range []struct{ loc, root, want string }{
		{"s3://bkt/runs/team", "runs/team/", "s3://bkt/runs/team"},
		{"s3://bkt/runs", "runs/team/", "s3://bkt/runs/team"},
		{"s3://bkt", "", "s3://bkt"},
		{"par", "st/", "par/st"},
		{"./st/", "", "./st/"},
	} {
		if got := agentsStore(c.loc, c.root); got != c.want {
			t.Errorf("agentsStore(%q, %q) = %q, want %q", c.loc, c.root, got, c.want)
		}
	}
	for in, want := range map[string]string{"sp ace/st": "'sp ace/st'", "run$1;x": "'run$1;x'", "it's": `'it'\''s'`, "s3://b/r-1": "s3://b/r-1"} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestLsKindsAndReasons: ls names what asked for each window (the schedule,
// memsnap snapshot or the API, an alert, a trigger, an incident) and says why
// in a short column, from the plan in the run's log; a reason holding a
// terminal's escapes is printed escaped.
func TestLsKindsAndReasons(t *testing.T) {
	dir := t.TempDir()
	st, err := store.OpenDir(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, time.Minute)
	rl := runlog.New(st, "job")
	term, err := rl.NewTerm(ctx, runlog.Term{Leader: "r0", Rank: 0}, 0)
	if err != nil {
		t.Fatal(err)
	}
	three := 3
	now := time.Now().UTC()
	plans := []runlog.Plan{
		{Kind: runlog.KindWindow, Reason: "schedule", Start: 10, Stop: 13},
		{Kind: runlog.KindWindow, Reason: "request", Start: 20, Stop: 23},
		{Kind: runlog.KindWindow, Reason: "alert: MemsnapLowHeadroom (rank 2)", Start: 30, Stop: 33},
		{Kind: runlog.KindTrigger, Reason: "trigger: rank 5: headroom 3.1 GiB (3.9%) < 5%, growing 48.0 MiB a batch", Start: 40, Stop: 43},
		{Kind: runlog.KindWindow, Reason: "trigger: rank 1: growing 16.0 MiB a batch", Start: 50, Stop: 53},
		{Kind: runlog.KindOOM, Reason: "out of memory", FailedRank: &three, Cause: "out of memory", Dump: true},
		{Kind: runlog.KindWindow, Reason: "api: loss \x1b[2Jspike\x1b]0;x\x07", Start: 60, Stop: 63},
	}
	for _, p := range plans {
		p.Run, p.Term, p.Leader, p.WorldSize, p.Ranks, p.Created, p.Deadline = "job", term.Term, "r0", 4, []int{0, 1, 2, 3}, now, now.Add(time.Hour)
		if _, err := rl.CreatePlan(ctx, p, 0, func(id uint64) (string, error) {
			return fmt.Sprintf("job/torch_memory_traces/window%d/merged.manifest.json", id), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := runCLI(t, "ls", dir)
	if code != 0 {
		t.Fatalf("ls: %d %s", code, errOut)
	}
	rows := lsRows(out)
	for id, want := range [][2]string{
		{"schedule", "-"}, {"asked", "-"}, {"alert", "MemsnapLowHeadroom (rank 2)"},
		{"trigger", "rank 5: headroom 3.1 GiB (3.9%) < 5%, growing…"}, {"trigger", "rank 1: growing 16.0 MiB a batch"},
		{"postmortem", "rank 3: out of memory"}, {"asked", `loss \x1b[2Jspike\x1b]0;x\x07`},
	} {
		r := rows[fmt.Sprint(id+1)]
		if r["KIND"] != want[0] || r["REASON"] != want[1] {
			t.Errorf("window %d: kind %q, reason %q; want %q, %q", id+1, r["KIND"], r["REASON"], want[0], want[1])
		}
	}
	if strings.ContainsAny(out, "\x1b\x07") || t.Failed() {
		t.Fatalf("ls:\n%s", out)
	}
	if _, j, _ := runCLI(t, "ls", "--json", dir); !strings.Contains(j, `"origin":"alert"`) || !strings.Contains(j, `"reason":"alert: MemsnapLowHeadroom (rank 2)"`) {
		t.Fatalf("ls --json:\n%s", j)
	}
}

// TestLsShowsNoClaimAsAMerge: a leadership term's claim on a window's commit
// point is no merge: ls of a folder below the run's log lists nothing for it,
// and the run's ls lists the window unfinished.
func TestLsShowsNoClaimAsAMerge(t *testing.T) {
	dir := t.TempDir()
	st, err := store.OpenDir(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, time.Minute)
	rl := runlog.New(st, "job")
	t1, err := rl.NewTerm(ctx, runlog.Term{Leader: "job/rank0"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	key := "job/torch_memory_traces/window1/merged.manifest.json"
	if _, err := rl.CreatePlan(ctx, runlog.Plan{Term: t1.Term, Kind: runlog.KindWindow, Start: 1, Stop: 3, WorldSize: 2, Ranks: []int{0, 1}}, 0,
		func(uint64) (string, error) { return key, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := rl.NewTerm(ctx, runlog.Term{Leader: "job/rank1", Rank: 1}, 0); err != nil { // (claims window 1's commit point)
		t.Fatal(err)
	}
	if _, err := publish.ReadManifest(ctx, st, key); !errors.Is(err, publish.ErrClaimed) {
		t.Fatalf("not the scenario: window 1's commit point holds %v", err)
	}
	code, out, errOut := runCLI(t, "ls", filepath.Join(dir, "job", "torch_memory_traces"))
	if code != 0 || strings.Contains(out, "unreadable") || strings.Contains(out, "claim") {
		t.Fatalf("ls below the run's log: %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "ls", dir)
	if code != 0 || !strings.Contains(out, "unfinished") || strings.Contains(out, "unreadable") {
		t.Fatalf("ls of the store: %d\n%s%s", code, out, errOut)
	}
	t.Logf("%s", out)
}
