package merge

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/naming"
)

// copies writes n ranks, rank r a copy of ddp4's rank r%4.
func copies(t *testing.T, n int) string {
	in := t.TempDir()
	for r := 0; r < n; r++ {
		b, err := os.ReadFile(filepath.Join(ddp4Dir(t), fmt.Sprintf("rank%d.5.memory_snapshot.pickle", r%4)))
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(in, fmt.Sprintf("rank%d.5.memory_snapshot.pickle", r)), b)
	}
	return in
}

// TestPicklesSplitUnderTheCap: with a bound of a few ranks' worth, the merged
// pickle is split into parts, each within the bound, named by rank range, tiling
// the ranks; CPython loads every part, whose device i is rank first+i with that
// rank's events; the summary and the manifest list the parts.
func TestPicklesSplitUnderTheCap(t *testing.T) {
	py := testutil.Python(t)
	const ranks, limit = 16, 800 << 10
	res, dir := runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{copies(t, ranks)}), PickleMaxBytes: limit})
	parts := res.Summary.Pickles
	if len(parts) < 2 || len(parts) > 8 {
		t.Fatalf("%d parts for %d ranks of ~75 KiB under %d bytes", len(parts), ranks, limit)
	}
	next := 0
	for _, p := range parts {
		t.Logf("part %s: ranks %s, %d bytes", p.Name, p.Ranks, p.Bytes)
		want := fmt.Sprintf("merged.ranks-%d-%d.memory_snapshot.pickle", p.FirstRank, p.LastRank)
		st, err := os.Stat(filepath.Join(dir, p.Name))
		if err != nil || p.Name != want || p.FirstRank != next || st.Size() > limit || st.Size() != p.Bytes || p.OverCap {
			t.Fatalf("part %+v (want name %s, first rank %d): %v", p, want, next, err)
		}
		if res.Outputs["pickle.ranks-"+fmt.Sprintf("%d-%d", p.FirstRank, p.LastRank)] != p.Name {
			t.Fatalf("outputs %v lack %s", res.Outputs, p.Name)
		}
		next = p.LastRank + 1
		out, err := exec.Command(py, "-c", `import pickle,sys; m=pickle.load(open(sys.argv[1],"rb")); print([len(t) for t in m["device_traces"]], sorted({g["device"] for g in m["segments"]}))`,
			filepath.Join(dir, p.Name)).CombinedOutput()
		if err != nil {
			t.Fatalf("python: %v %s", err, out)
		}
		var want1, devs []string
		for r := p.FirstRank; r <= p.LastRank; r++ {
			want1 = append(want1, fmt.Sprint(res.Summary.Ranks[r].Events))
			devs = append(devs, fmt.Sprint(r-p.FirstRank))
		}
		if got := strings.TrimSpace(string(out)); got != "["+strings.Join(want1, ", ")+"] ["+strings.Join(devs, ", ")+"]" {
			t.Fatalf("part %s holds %s", p.Name, got)
		}
	}
	if next != ranks {
		t.Fatalf("the parts end at rank %d", next-1)
	}
	if _, ok := res.Outputs[publish.OutPickle]; ok {
		t.Fatal("a split merge names an unsplit pickle")
	}
	m, err := publish.ParseManifest(readFile(t, filepath.Join(dir, "merged.manifest.json")))
	if err != nil || len(m.Pickles) != len(parts) || len(m.Outputs) != len(parts)+4 {
		t.Fatalf("manifest: %v, %d pickles, %d outputs", err, len(m.Pickles), len(m.Outputs))
	}
}

// TestRankAndBatchCuts: --ranks merges only those ranks (the others are not
// missing); --batches keeps each rank's events inside those batches, in every
// output; --from/--to cut in aligned time.
func TestRankAndBatchCuts(t *testing.T) {
	dir := ddp4Marked(t, false)
	ins := resolve(t, naming.ComposerSnapshotName, []string{dir})
	set, err := ParseRankSet("3,0")
	if err != nil || set.String() != "0,3" {
		t.Fatalf("rank set %v %v", set, err)
	}
	res, _ := runMerge(t, Config{Inputs: ins, Ranks: set})
	s := res.Summary
	if fmt.Sprint(s.RanksMerged) != "[0 3]" || len(s.MissingRanks) != 0 || s.WorldSize != 4 || s.Cut == nil || s.Cut.Ranks != "0,3" {
		t.Fatalf("ranks cut: merged %v missing %v world %d cut %+v", s.RanksMerged, s.MissingRanks, s.WorldSize, s.Cut)
	}
	br, _ := ParseBatchRange("6:7")
	res, out := runMerge(t, Config{Inputs: ins, Batches: br})
	merged, err := snapshot.ReadFile(filepath.Join(out, "merged.memory_snapshot.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	for _, rs := range res.Summary.Ranks {
		data := readFile(t, filepath.Join(dir, fmt.Sprintf("rank%d.5.memory_snapshot.pickle", rs.Rank)))
		m := markedMeta(t, data, rs.Rank).Batches[1]
		src, _ := snapshot.Decode(data)
		var want int
		for _, e := range src.DeviceTraces[0] {
			if e.TimeUS >= m.StartUS && e.TimeUS <= m.EndUS {
				want++
			}
		}
		start, end, peak := replay(src.DeviceTraces[0], src.AllocatedAtEnd(0), m.StartUS, m.EndUS)
		got := merged.DeviceTraces[rs.Rank]
		if rs.Events != want || len(got) != want || rs.StartAllocatedBytes != start || rs.EndAllocatedBytes != end || rs.PeakAllocatedBytes != peak {
			t.Fatalf("rank %d cut to batch 6: %d events (pickle %d), want %d; start %d end %d peak %d, want %d %d %d",
				rs.Rank, rs.Events, len(got), want, rs.StartAllocatedBytes, rs.EndAllocatedBytes, rs.PeakAllocatedBytes, start, end, peak)
		}
		if len(rs.BatchFigures) != 1 || rs.BatchFigures[0].Batch != 6 || *rs.PeakAllocatedBatch != 6 {
			t.Fatalf("rank %d: batch figures %+v", rs.Rank, rs.BatchFigures)
		}
	}
	r0 := res.Summary.Ranks[0]
	from, to := r0.FirstEventUS, r0.FirstEventUS+1000
	res, _ = runMerge(t, Config{Inputs: ins, From: &from, To: &to})
	for _, rs := range res.Summary.Ranks {
		if rs.Events > 0 && (rs.FirstEventUS < from || rs.LastEventUS > to) {
			t.Fatalf("rank %d: events from %d to %d outside [%d, %d]", rs.Rank, rs.FirstEventUS, rs.LastEventUS, from, to)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "-1", "70000", "1,,2"} {
		if _, err := ParseRankSet(bad); err == nil {
			t.Errorf("rank set %q accepted", bad)
		}
	}
	for _, bad := range []string{"5", "5:5", "6:5", "a:b"} {
		if _, err := ParseBatchRange(bad); err == nil {
			t.Errorf("batch range %q accepted", bad)
		}
	}
}

// TestTraceBatchSlicesAndOOMs: the trace has a batch slice per batch mark, in
// each rank's process, and an OOM instant where the snapshot has an OOM.
func TestTraceBatchSlicesAndOOMs(t *testing.T) {
	_, dir := runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{ddp4Marked(t, false)})})
	slices := map[float64][]string{}
	for _, e := range checkTrace(t, filepath.Join(dir, "merged.trace.json"), 4) {
		if e["ph"] == "X" && e["cat"] == "batch" {
			slices[e["pid"].(float64)] = append(slices[e["pid"].(float64)], e["name"].(string))
		}
	}
	for pid := 1.0; pid <= 4; pid++ {
		if fmt.Sprint(slices[pid]) != "[batch 5 batch 6 batch 7]" {
			t.Fatalf("process %v has batch slices %v", pid, slices[pid])
		}
	}
	oom := testutil.Snapshot(t, "single/oom.memory_snapshot.pickle")
	_, dir = runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, nil, "0="+oom)})
	n := 0
	for _, e := range checkTrace(t, filepath.Join(dir, "merged.trace.json"), 1) {
		if e["name"] == "OOM" && e["ph"] == "i" && e["pid"].(float64) == 1 {
			n++
		}
	}
	var sum analysis.Summary
	json.Unmarshal(readFile(t, filepath.Join(dir, "merged.summary.json")), &sum)
	if n == 0 || n != len(sum.Ranks[0].OOMs) {
		t.Fatalf("%d OOM instants, the summary has %d OOMs", n, len(sum.Ranks[0].OOMs))
	}
}

func readFile(t testing.TB, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
