package merge

import (
	"context"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/internal/testjob"
	"github.com/memsnap/memsnap/merge/render"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// analysisSeeds are analyses as ranks write them: of a real rank with batch marks
// (and an OOM), and of a synthetic one whose hook told gradients_made.
func analysisSeeds(t testing.TB) [][]byte {
	var out [][]byte
	for _, name := range []string{"ddp4/rank3.5.memory_snapshot.pickle", "single/oom.memory_snapshot.pickle"} {
		data, err := os.ReadFile(testutil.Snapshot(t, name))
		if err != nil {
			t.Fatal(err)
		}
		a, err := analysis.Analyze(context.Background(), data, markedMeta(t, data, 3), analysis.AnalyzeOptions{Rank: -1})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, marshal(t, a))
	}
	// the hook's version 2: gradients told with the batch each was made in, one
	// address handed to the optimizer's temporaries the next batch
	s, meta := (testjob.Job{Batches: 6, Watch: true, GradFlip: true, MadeNotes: true, OptTemp: true, GradFreed: true}).Build(1_700_000_000_000_000)
	data, err := snapshot.EncodeBytes(s)
	if err != nil {
		t.Fatal(err)
	}
	a, err := analysis.Analyze(context.Background(), data, meta, analysis.AnalyzeOptions{Rank: 2})
	if err != nil {
		t.Fatal(err)
	}
	if a.Categories == nil || a.Categories.AtPeak[analysis.CatGradients] == 0 {
		t.Fatalf("the gradients_made seed has no gradients: %+v", a.Categories)
	}
	return append(out, marshal(t, a))
}

var brokenAnalyses = []string{
	`{"version":1,"rank":0,"snapshot":{"size":1,"sha256":"` + strings.Repeat("0", 64) + `"},"free_at_peak":{"reserved_bytes":1,"free_bytes":1,"largest_free_block_bytes":-1}}`,
	`{"version":1,"rank":0,"snapshot":{"size":1,"sha256":"` + strings.Repeat("0", 64) + `"},"ooms":[{"time_us":1,"size":1,"device_free_bytes":0,"allocated_bytes":0,"largest_free_block_bytes":72057594037927937}]}`,
	`{"version":1,"rank":0,"snapshot":{"size":1,"sha256":"` + strings.Repeat("0", 64) + `"},"kept_sites":[{"site":"a"},{"site":"b"},{"site":"c"},{"site":"d"},{"site":"e"},{"site":"f"}]}`,
	`{"version":2,"rank":0}`,
	`{"version":1,"rank":-1}`,
	`{"version":1,"rank":65536}`,
	`{"version":1,"rank":0,"snapshot":{"size":1,"sha256":"zz"}}`,
	`{"version":1,"rank":0,"snapshot":{"size":-1,"sha256":"` + strings.Repeat("0", 64) + `"}}`,
	`{"version":1,"rank":0,"snapshot":{"size":1,"sha256":"` + strings.Repeat("0", 64) + `"},"curve":{"t":[5,-1],"a":[0,0],"r":[0,0]}}`,
	`{"version":1,"rank":0,"snapshot":{"size":1,"sha256":"` + strings.Repeat("0", 64) + `"},"curve":{"t":[5],"a":[0,0],"r":[0]}}`,
	`{"version":1,"rank":0,"snapshot":{"size":1,"sha256":"` + strings.Repeat("0", 64) + `"},"curve":{"t":[9223372036854775807,1],"a":[0,0],"r":[0,0]}}`,
	`{"version":1,"rank":0,"snapshot":{"size":1,"sha256":"` + strings.Repeat("0", 64) + `"},"peak_phase":"lunch"}`,
	`{"version":1,"rank":0,"snapshot":{"size":1,"sha256":"` + strings.Repeat("0", 64) + `"},"batches":[{"batch":1,"start_us":5,"end_us":4}]}`,
	`{"version":1,"rank":0,"snapshot":{"size":1,"sha256":"` + strings.Repeat("0", 64) + `"},"sites":[{"site":"x","bytes":1,"blocks":-1}]}`,
	`{"version":1,"rank":0,"snapshot":{"size":1,"sha256":"` + strings.Repeat("0", 64) + `"},"other_sites":{"site":"x","bytes":1,"blocks":1}}`,
	`{"version":1,"rank":0,"snapshot":{"size":1,"sha256":"` + strings.Repeat("0", 64) + `"},"events":-3}`,
	`{"version":1`, `[]`, `null`, ``,
}

func TestParseAnalysisRefuses(t *testing.T) {
	for _, b := range brokenAnalyses {
		if _, err := analysis.ParseAnalysis([]byte(b)); err == nil {
			t.Errorf("accepted %s", b)
		}
	}
	big := `{"version":1,"note":"` + strings.Repeat("x", analysis.MaxAnalysisBytes) + `"}`
	if _, err := analysis.ParseAnalysis([]byte(big)); err == nil || !strings.Contains(err.Error(), "bytes") {
		t.Errorf("an analysis larger than MaxAnalysisBytes: %v", err)
	}
	for _, b := range analysisSeeds(t) {
		if _, err := analysis.ParseAnalysis(b); err != nil {
			t.Fatalf("a real analysis is refused: %v", err)
		}
	}
}

// FuzzParseAnalysis: ParseAnalysis never panics; what it accepts reads the same
// once re-marshalled, and the leader's whole use of it (a line of the summary,
// the trace, the report, a diff against itself) neither panics nor fails.
func FuzzParseAnalysis(f *testing.F) {
	for _, b := range analysisSeeds(f) {
		f.Add(b)
	}
	for _, b := range brokenAnalyses {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := analysis.ParseAnalysis(b)
		if err != nil {
			return
		}
		again, err := analysis.ParseAnalysis(marshal(t, a))
		if err != nil || !reflect.DeepEqual(a, again) {
			t.Fatalf("re-marshalled: %v", err)
		}
		leaderUse(t, a)
	})
}

// leaderUse runs what a merge does with one rank's analysis, into nowhere.
func leaderUse(t *testing.T, a *analysis.RankAnalysis) {
	lr := &loadedRank{rank: a.Rank, source: "fuzz", a: a, shift: -12345}
	e := &rankEntry{Rank: &render.Rank{Summary: rankSummary(lr), Analysis: a, Shift: lr.shift}}
	b := &builder{cfg: &Config{}, tw: render.NewTraceWriter(io.Discard), tracePoints: 300, byRank: map[int]*rankEntry{a.Rank: e}}
	b.writeTraceRank(lr)
	if err := b.tw.Finish(); err != nil {
		t.Fatal(err)
	}
	other := *a
	other.Rank = a.Rank + 1
	e2 := &rankEntry{Rank: &render.Rank{Summary: rankSummary(&loadedRank{rank: other.Rank, a: &other}), Analysis: &other}}
	b.byRank[other.Rank] = e2
	s := &analysis.Summary{Ranks: []analysis.RankSummary{e.Summary, e2.Summary}}
	s.Spread = analysis.ComputeSpread(s.Ranks)
	s.Diff, _ = b.diffs(s)
	for _, entries := range [][]*render.Rank{{e.Rank, e2.Rank}, manyEntries(e.Rank, render.MaxLines+1)} {
		if err := render.WriteHTML(io.Discard, "fuzz", s, entries); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Diff.WriteTable(io.Discard, 5); err != nil {
		t.Fatal(err)
	}
}

func manyEntries(e *render.Rank, n int) []*render.Rank {
	out := make([]*render.Rank, n)
	for i := range out {
		out[i] = e
	}
	return out
}
