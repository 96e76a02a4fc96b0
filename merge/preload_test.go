package merge

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/sidecar"
)

// TestPreloadedInputsMergeFromMemory: inputs preloaded (sidecar and analysis read
// and parsed) merge from what was read, even once the files are gone, into the
// same summary as inputs read at the merge; and one preloaded input serves two
// merges alike.
func TestPreloadedInputsMergeFromMemory(t *testing.T) {
	ins, st := storeAnswerRanks(t, 8, 2000)
	want, wantDir := runMerge(t, Config{Inputs: ins, FromAnalyses: true, WorldSize: 8})
	if len(want.FromAnalyses) != 8 {
		t.Fatalf("the plain merge took %d ranks from their analyses", len(want.FromAnalyses))
	}
	pre := make([]Input, len(ins))
	for i, in := range ins {
		pre[i] = Preload(context.Background(), in)
		if m := pre[i].Meta(); m == nil || m.Rank != in.Rank {
			t.Fatalf("rank %d: preloaded sidecar %+v", in.Rank, m)
		}
	}
	for r := range ins {
		key := fmt.Sprintf("bench/rank%d.pickle", r)
		for _, k := range []string{sidecar.MetaName(key), analysis.AnalysisName(key)} {
			if err := os.Remove(filepath.Join(st.Root(), filepath.FromSlash(k))); err != nil {
				t.Fatal(err)
			}
		}
	}
	for try := 0; try < 2; try++ {
		got, dir := runMerge(t, Config{Inputs: pre, FromAnalyses: true, WorldSize: 8})
		if len(got.FromAnalyses) != 8 || len(got.Decoded) != len(want.Decoded) {
			t.Fatalf("try %d: %d ranks from analyses, %d decoded; want 8 and %d", try, len(got.FromAnalyses), len(got.Decoded), len(want.Decoded))
		}
		a, _ := os.ReadFile(filepath.Join(wantDir, "merged.summary.json"))
		b, _ := os.ReadFile(filepath.Join(dir, "merged.summary.json"))
		if len(a) == 0 || !bytes.Equal(a, b) {
			t.Fatalf("try %d: the summary of preloaded inputs differs (%d bytes, %d bytes)", try, len(a), len(b))
		}
	}
}

// TestPreloadLeavesWhatItCannotRead: an analysis that is not there when the input
// is preloaded is read at the merge.
func TestPreloadLeavesWhatItCannotRead(t *testing.T) {
	ins, st := storeAnswerRanks(t, 2, 2000)
	p := filepath.Join(st.Root(), filepath.FromSlash(analysis.AnalysisName("bench/rank1.pickle")))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(p)
	pre := []Input{Preload(context.Background(), ins[0]), Preload(context.Background(), ins[1])}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	got, _ := runMerge(t, Config{Inputs: pre, FromAnalyses: true, WorldSize: 2})
	if len(got.FromAnalyses) != 2 {
		t.Fatalf("%v from analyses; want both", got.FromAnalyses)
	}
}

// TestFirstPassDecodesWithinWorkers: the first pass reads many inputs ahead, but
// decodes a snapshot only within Workers of the input it merges next, so no more
// than Workers decodes run at once; and the merge is the same for any Workers.
func TestFirstPassDecodesWithinWorkers(t *testing.T) {
	base, _ := storeAnswerRanks(t, 12, 2000)
	var summary []byte
	for _, workers := range []int{1, 2, 3} {
		var mu sync.Mutex
		var now, most int
		var loads atomic.Int64
		ins := make([]Input, len(base))
		for i, in := range base {
			load := in.load
			in.analysis = nil // every rank is decoded
			in.load = func(ctx context.Context) ([]byte, error) {
				mu.Lock()
				now++
				most = max(most, now)
				mu.Unlock()
				defer func() { mu.Lock(); now--; mu.Unlock() }()
				loads.Add(1)
				time.Sleep(2 * time.Millisecond) // widens the overlap a broken bound would allow
				return load(ctx)
			}
			ins[i] = in
		}
		res, dir := runMerge(t, Config{Inputs: ins, FromAnalyses: true, WorldSize: 12, Workers: workers})
		if most > workers || loads.Load() < 12 || len(res.Decoded) != 12 {
			t.Fatalf("workers %d: %d snapshots read at once, %d reads, %d decoded", workers, most, loads.Load(), len(res.Decoded))
		}
		b, _ := os.ReadFile(filepath.Join(dir, "merged.summary.json"))
		if summary == nil {
			summary = b
		} else if !bytes.Equal(summary, b) {
			t.Fatalf("workers %d: another summary", workers)
		}
	}
}
