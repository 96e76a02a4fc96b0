package merge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/naming"
)

func ddp4(t *testing.T) string {
	return filepath.Dir(testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle"))
}

func resolve(t *testing.T, tmpl string, args []string, explicit ...string) []Input {
	t.Helper()
	r := &Resolver{Template: naming.MustParse(tmpl)}
	ins, err := r.Resolve(context.Background(), args, explicit)
	if err != nil {
		t.Fatal(err)
	}
	return ins
}

func runMerge(t *testing.T, cfg Config) (*Result, string) {
	t.Helper()
	dir := t.TempDir()
	out, err := store.OpenDir(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Out = out
	cfg.Logger = testutil.Logger(t)
	res, err := Merge(testutil.Context(t, time.Minute), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return res, dir
}

func TestMergeDDP4(t *testing.T) {
	py := testutil.Python(t)
	res, dir := runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)})})
	s := res.Summary

	// CPython loads the merged pickle: 4 device traces, each rank's events intact
	var files []string
	for r := 0; r < 4; r++ {
		files = append(files, filepath.Join(ddp4(t), fmt.Sprintf("rank%d.5.memory_snapshot.pickle", r)))
	}
	script := `import pickle, sys, json
m = pickle.load(open(sys.argv[1], "rb"))
ins = [pickle.load(open(f, "rb")) for f in sys.argv[2:]]
out = {"traces": len(m["device_traces"]), "events": [len(t) for t in m["device_traces"]],
       "want": [len(s["device_traces"][0]) for s in ins],
       "actions_equal": all([e["action"] for e in m["device_traces"][i]] == [e["action"] for e in s["device_traces"][0]] for i, s in enumerate(ins)),
       "sizes_equal": all([e["size"] for e in m["device_traces"][i]] == [e["size"] for e in s["device_traces"][0]] for i, s in enumerate(ins)),
       "segment_devices": sorted({g["device"] for g in m["segments"]}),
       "segments": [sum(1 for g in m["segments"] if g["device"] == i) for i in range(4)],
       "want_segments": [len(s["segments"]) for s in ins]}
print(json.dumps(out))`
	out, err := exec.Command(py, append([]string{"-c", script, filepath.Join(dir, "merged.memory_snapshot.pickle")}, files...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v: %s", err, out)
	}
	var got struct {
		Traces         int   `json:"traces"`
		Events         []int `json:"events"`
		WantEvents     []int `json:"want"`
		ActionsEqual   bool  `json:"actions_equal"`
		SizesEqual     bool  `json:"sizes_equal"`
		SegmentDevices []int `json:"segment_devices"`
		Segments       []int `json:"segments"`
		WantSegments   []int `json:"want_segments"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got.Traces != 4 || fmt.Sprint(got.Events) != fmt.Sprint(got.WantEvents) || !got.ActionsEqual || !got.SizesEqual {
		t.Fatalf("merged traces: %+v", got)
	}
	if fmt.Sprint(got.SegmentDevices) != "[0 1 2 3]" || fmt.Sprint(got.Segments) != fmt.Sprint(got.WantSegments) {
		t.Fatalf("merged segments: %+v", got)
	}

	// each rank's peak equals figures.py's peak_allocated_bytes for that rank
	fig, err := exec.Command(py, append([]string{filepath.Join(testutil.RepoRoot(t), "testdata", "figures.py")}, files...)...).Output()
	if err != nil {
		t.Fatal(err)
	}
	for r, line := range strings.Split(strings.TrimSpace(string(fig)), "\n") {
		var f struct {
			Devices []struct {
				Peak int64 `json:"peak_allocated_bytes"`
			} `json:"devices"`
		}
		json.Unmarshal([]byte(line), &f)
		if s.Ranks[r].Rank != r || s.Ranks[r].PeakAllocatedBytes != f.Devices[0].Peak {
			t.Errorf("rank %d: summary peak %d, figures.py %d", r, s.Ranks[r].PeakAllocatedBytes, f.Devices[0].Peak)
		}
	}
	if s.Spread == nil || s.Spread.OutlierRank != 3 || s.Spread.MaxOverMedian < 1.2 {
		t.Fatalf("outlier: %+v", s.Spread)
	}
	// the summary on disk says the same
	var disk analysis.Summary
	b, _ := os.ReadFile(filepath.Join(dir, "merged.summary.json"))
	if err := json.Unmarshal(b, &disk); err != nil || disk.Spread.OutlierRank != 3 || len(disk.Ranks) != 4 || len(disk.MissingRanks) != 0 {
		t.Fatalf("summary file: %v %+v", err, disk.Spread)
	}
	if len(disk.Ranks[3].TopSites) == 0 {
		t.Fatal("no top sites at rank 3's peak")
	}

	checkTrace(t, filepath.Join(dir, "merged.trace.json"), 4)

	// the protobuf timeline reads back to the same figures as the merged pickle
	a, err := InspectFile(filepath.Join(dir, "merged.memory_snapshot.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := InspectFile(filepath.Join(dir, "merged.memsnap.pb"))
	if err != nil {
		t.Fatal(err)
	}
	ab, _ := json.Marshal(a)
	pb, _ := json.Marshal(p)
	if string(ab) != string(pb) {
		t.Fatalf("pickle and pb figures differ:\n%s\n%s", ab, pb)
	}
	if len(a.Devices) != 4 {
		t.Fatalf("merged pickle has %d devices", len(a.Devices))
	}

	html, _ := os.ReadFile(filepath.Join(dir, "merged.html"))
	for _, bad := range []string{"http://", "https://", "src=\"//", "href=\"//"} {
		if strings.Contains(string(html), bad) && !strings.Contains(string(html), "http://www.w3.org/2000/svg") {
			t.Fatalf("the report references %q", bad)
		}
	}
	if n := strings.Count(strings.ReplaceAll(string(html), "http://www.w3.org/2000/svg", ""), "http"); n != 0 {
		t.Fatalf("the report names %d http(s) resources", n)
	}
}

// checkTrace is the structural check of a Chrome/Perfetto trace: every event has
// the fields its phase requires, and there is one process per rank, named "rank N"
// with pid N+1 (no pid 0, which Perfetto treats specially). It returns the events.
func checkTrace(t *testing.T, path string, ranks int) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		TraceEvents []map[string]any `json:"traceEvents"`
	}
	if err := json.Unmarshal(b, &tr); err != nil {
		t.Fatalf("trace JSON: %v", err)
	}
	names := map[float64]string{}
	counters := map[float64]int{}
	for i, e := range tr.TraceEvents {
		ph, _ := e["ph"].(string)
		_, hasName := e["name"].(string)
		pid, hasPid := e["pid"].(float64)
		if !hasName || !hasPid || ph == "" {
			t.Fatalf("event %d lacks name/ph/pid: %v", i, e)
		}
		if pid == 0 {
			t.Fatalf("event %d has pid 0: %v", i, e)
		}
		_, hasTs := e["ts"].(float64)
		_, hasTid := e["tid"].(float64)
		args, _ := e["args"].(map[string]any)
		switch ph {
		case "M":
			if args == nil {
				t.Fatalf("metadata event %d without args", i)
			}
			if e["name"] == "process_name" {
				names[pid] = args["name"].(string)
			}
		case "C":
			if !hasTs || len(args) == 0 {
				t.Fatalf("counter %d without ts or args: %v", i, e)
			}
			for _, v := range args {
				if _, ok := v.(float64); !ok {
					t.Fatalf("counter %d has a non-numeric value: %v", i, e)
				}
			}
			counters[pid]++
		case "i", "I":
			if !hasTs || !hasTid {
				t.Fatalf("instant %d without ts/tid: %v", i, e)
			}
			if s, _ := e["s"].(string); s != "" && s != "g" && s != "p" && s != "t" {
				t.Fatalf("instant %d scope %q", i, s)
			}
		case "X":
			d, ok := e["dur"].(float64)
			if !hasTs || !hasTid || !ok || d < 0 {
				t.Fatalf("complete event %d without ts/tid/dur: %v", i, e)
			}
		default:
			t.Fatalf("event %d has unexpected phase %q", i, ph)
		}
	}
	if len(names) != ranks {
		t.Fatalf("%d processes, want %d", len(names), ranks)
	}
	for pid, n := range names {
		if n != fmt.Sprintf("rank %d", int(pid)-1) || counters[pid] == 0 {
			t.Fatalf("process %v is named %q with %d counter events", pid, n, counters[pid])
		}
	}
	return tr.TraceEvents
}

func TestMergeMissingAndExplicitRanks(t *testing.T) {
	py := testutil.Python(t)
	d := ddp4(t)
	// ranks 0 and 3 by name, rank 1 given explicitly under another name; world size 4
	other := filepath.Join(t.TempDir(), "whatever.pickle")
	b, _ := os.ReadFile(filepath.Join(d, "rank1.5.memory_snapshot.pickle"))
	os.WriteFile(other, b, 0o644)
	ins := resolve(t, naming.ComposerSnapshotName, []string{filepath.Join(d, "rank0.5.memory_snapshot.pickle"), filepath.Join(d, "rank3.5.*")}, "1="+other)
	why := "its trainer was killed by signal 9 <during> the window"
	res, dir := runMerge(t, Config{Inputs: ins, WorldSize: 4, Align: AlignStart, MissingReasons: map[int]string{2: why}})
	if fmt.Sprint(res.Summary.MissingRanks) != "[2]" || fmt.Sprint(res.Summary.RanksMerged) != "[0 1 3]" {
		t.Fatalf("missing %v merged %v", res.Summary.MissingRanks, res.Summary.RanksMerged)
	}
	// why a rank is missing is in the summary and the report, not only the manifest
	if res.Summary.MissingReasons["2"] != why {
		t.Fatalf("the summary's missing reasons: %v", res.Summary.MissingReasons)
	}
	if page, _ := os.ReadFile(filepath.Join(dir, "merged.html")); !strings.Contains(string(page), html.EscapeString(why)) {
		t.Fatal("the report does not say why rank 2 is missing")
	}
	for _, r := range res.Summary.Ranks {
		if r.FirstEventUS != 0 {
			t.Fatalf("--align start: rank %d starts at %d", r.Rank, r.FirstEventUS)
		}
	}
	out, err := exec.Command(py, "-c", `import pickle,sys; m=pickle.load(open(sys.argv[1],"rb")); print([len(t) for t in m["device_traces"]], min(e["time_us"] for t in m["device_traces"] for e in t[:1]))`,
		filepath.Join(dir, "merged.memory_snapshot.pickle")).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "[549, 549, 0, 551] 0" {
		t.Fatalf("python: %v %s", err, out)
	}
	checkTrace(t, filepath.Join(dir, "merged.trace.json"), 3)
}

func TestResolveErrors(t *testing.T) {
	d := ddp4(t)
	r := &Resolver{Template: naming.MustParse(naming.ComposerSnapshotName)}
	ctx := context.Background()
	_, err := r.Resolve(ctx, []string{d, filepath.Join(d, "rank2.5.memory_snapshot.pickle")}, nil)
	if err == nil || !strings.Contains(err.Error(), "rank 2 is claimed by both") {
		t.Fatalf("duplicate rank: %v", err)
	}
	_, err = r.Resolve(ctx, []string{testutil.Snapshot(t, "single/oom.memory_snapshot.pickle")}, nil)
	if err == nil || !strings.Contains(err.Error(), "cannot tell the rank") {
		t.Fatalf("unnamed file: %v", err)
	}
	_, err = r.Resolve(ctx, []string{filepath.Join(d, "nope*.pickle")}, nil)
	if err == nil {
		t.Fatal("a glob matching nothing must fail")
	}
	// torchtitan names
	tt := t.TempDir()
	b, _ := os.ReadFile(filepath.Join(d, "rank2.5.memory_snapshot.pickle"))
	os.WriteFile(filepath.Join(tt, "000002_step_5.pickle"), b, 0o644)
	ins := resolve(t, Layouts["torchtitan"], []string{tt})
	if len(ins) != 1 || ins[0].Rank != 2 {
		t.Fatalf("torchtitan: %+v", ins)
	}
}

func TestMergeRefusesOverwrite(t *testing.T) {
	dir := t.TempDir()
	out, _ := store.OpenDir(dir, true)
	cfg := Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)}), Out: out}
	if _, err := Merge(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := Merge(context.Background(), cfg); !errors.Is(err, store.ErrExists) {
		t.Fatalf("second merge: want ErrExists, got %v", err)
	}
	cfg.Overwrite = true
	if _, err := Merge(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
}

func TestMergeBadInput(t *testing.T) {
	dir := t.TempDir()
	b, _ := os.ReadFile(filepath.Join(ddp4(t), "rank0.5.memory_snapshot.pickle"))
	os.WriteFile(filepath.Join(dir, "rank0.5.memory_snapshot.pickle"), b, 0o644)
	os.WriteFile(filepath.Join(dir, "rank1.5.memory_snapshot.pickle"), b[:1000], 0o644)
	out, _ := store.OpenDir(t.TempDir(), true)
	_, err := Merge(context.Background(), Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{dir}), Out: out})
	if err == nil || !strings.Contains(err.Error(), "rank1.5.memory_snapshot.pickle") || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("want an error naming the truncated file, got %v", err)
	}
	if objs, _ := out.List(context.Background(), ""); len(objs) != 0 {
		t.Fatalf("a failed merge stored %d outputs", len(objs))
	}
}

// TestMergeS3 reads the ranks from a real MinIO and writes the outputs back there.
func TestMergeS3(t *testing.T) {
	m := testutil.RequireMinIO(t)
	ctx := testutil.Context(t, time.Minute)
	bucket := testutil.BucketName(t)
	cfg := func(u string) store.Config {
		return store.Config{URL: u, Endpoint: m.Endpoint, CreateBucket: true,
			Credentials: store.Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}}
	}
	in, err := store.Open(ctx, cfg("s3://"+bucket+"/run7/torch_memory_traces"))
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 4; r++ {
		name := fmt.Sprintf("rank%d.5.memory_snapshot.pickle", r)
		f, _ := os.Open(filepath.Join(ddp4(t), name))
		if _, err := in.Put(ctx, name, f, store.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	res := &Resolver{Template: naming.MustParse(naming.ComposerSnapshotName), OpenStore: func(ctx context.Context, u string) (store.Store, error) {
		return store.Open(ctx, cfg(u))
	}}
	ins, err := res.Resolve(ctx, []string{"s3://" + bucket + "/run7/torch_memory_traces/"}, nil)
	if err != nil || len(ins) != 4 {
		t.Fatalf("resolve: %v (%d inputs)", err, len(ins))
	}
	out, err := store.Open(ctx, cfg("s3://"+bucket+"/run7/merged"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Merge(ctx, Config{Inputs: ins, Out: out, OutputBase: "{run_name}-w{window}", Vars: naming.Vars{"run_name": "run7", "window": 1}, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if r.Summary.Spread.OutlierRank != 3 {
		t.Fatalf("outlier %d", r.Summary.Spread.OutlierRank)
	}
	objs, err := out.List(ctx, "")
	if err != nil || len(objs) != 7 {
		t.Fatalf("list: %v %v", objs, err)
	}
	for _, o := range objs {
		if !strings.HasPrefix(o.Key, "run7-w1.") {
			t.Fatalf("output %s is not named by the template", o.Key)
		}
	}
	// and the merged timeline merges again, from the store
	ins2, err := res.Resolve(ctx, []string{"s3://" + bucket + "/run7/merged/run7-w1.memsnap.pb"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, _ := runMerge(t, Config{Inputs: ins2})
	if len(r2.Summary.Ranks) != 4 || r2.Summary.Ranks[3].PeakAllocatedBytes != r.Summary.Ranks[3].PeakAllocatedBytes {
		t.Fatalf("re-merging the timeline: %+v", r2.Summary.Ranks)
	}
}

// TestUnmeasuredClockIsMarked: aligned by the agents' clock offsets, a rank whose
// offset was never measured is named as such in the summary and the report, and
// is in no clock_offsets_us (an offset of 0 there would claim a measurement).
func TestUnmeasuredClockIsMarked(t *testing.T) {
	ins := resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)}) // no sidecars: nothing measured
	res, dir := runMerge(t, Config{Inputs: ins, Align: AlignOffsets, Offsets: map[int]int64{1: 250}})
	s := res.Summary
	if fmt.Sprint(s.ClockUnmeasured) != "[0 2 3]" || len(s.ClockOffsetsUS) != 1 || s.ClockOffsetsUS["1"] != 250 {
		t.Fatalf("unmeasured %v, offsets %v", s.ClockUnmeasured, s.ClockOffsetsUS)
	}
	if !s.Ranks[0].ClockUnmeasured || s.Ranks[1].ClockUnmeasured {
		t.Fatalf("ranks: %+v %+v", s.Ranks[0].ClockUnmeasured, s.Ranks[1].ClockUnmeasured)
	}
	if page, _ := os.ReadFile(filepath.Join(dir, "merged.html")); !strings.Contains(string(page), "clock offset never measured for ranks [0 2 3]") {
		t.Fatal("the report does not say which clocks were never measured")
	}
}
