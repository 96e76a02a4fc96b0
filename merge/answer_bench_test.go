package merge

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/merge/synth"
)

// BenchmarkAnswer times what a leader does once every rank of a large window has
// stored its snapshot, metadata and analysis: a progressive merge from the
// analyses, up to its answer (summary, report, diff, answer manifest) being
// published, in a folder store. Each rank holds a 5,000-event snapshot (the
// recorded DDP job's ranks, grown), as in the 1,024-member scale benchmark:
//
//	go test ./merge -run '^$' -bench Answer -benchtime 3x
func BenchmarkAnswer(b *testing.B) {
	for _, n := range []int{256, 1024} {
		b.Run(fmt.Sprintf("ranks=%d", n), func(b *testing.B) {
			ins, _ := storeAnswerRanks(b, n, 5000)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				out, err := store.OpenDir(b.TempDir(), true)
				if err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				var answered time.Duration
				_, err = Merge(context.Background(), Config{Inputs: ins, Out: out, Title: "bench", Progressive: true, FromAnalyses: true,
					Detail: DetailDiff, WorldSize: n, Supersede: true, Attempt: "t1",
					OnAnswer: func(Answer) { answered = time.Since(t0) }})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(answered.Microseconds())/1000, "answer-ms")
			}
		})
	}
}

// storeAnswerRanks stores n ranks' snapshots (grown to events), metadata and
// analyses in a folder store, as rank agents do, and returns the merge's inputs
// and the store.
func storeAnswerRanks(tb testing.TB, n, events int) ([]Input, *store.Dir) {
	tb.Helper()
	ctx := context.Background()
	st, err := store.OpenDir(tb.TempDir(), true)
	if err != nil {
		tb.Fatal(err)
	}
	type base struct {
		data   []byte
		snap   *snapshot.Snapshot
		sha    string
		t0, t1 int64 // the span of its trace (µs)
	}
	var bases []base
	for r := 0; r < 4; r++ {
		data, err := os.ReadFile(testutil.Snapshot(tb, fmt.Sprintf("ddp4/rank%d.5.memory_snapshot.pickle", r)))
		if err != nil {
			tb.Fatal(err)
		}
		s, err := snapshot.Decode(data)
		if err != nil {
			tb.Fatal(err)
		}
		s = synth.Grow(s, events, int64(r)*4096)
		if data, err = snapshot.EncodeBytes(s); err != nil {
			tb.Fatal(err)
		}
		sum := sha256.Sum256(data)
		bs := base{data: data, snap: s, sha: hex.EncodeToString(sum[:])}
		for _, tr := range s.DeviceTraces {
			for _, e := range tr {
				if bs.t0 == 0 || e.TimeUS < bs.t0 {
					bs.t0 = e.TimeUS
				}
				bs.t1 = max(bs.t1, e.TimeUS)
			}
		}
		bases = append(bases, bs)
	}
	put := func(k string, b []byte) {
		if _, err := st.Put(ctx, k, bytes.NewReader(b), store.PutOptions{Size: int64(len(b))}); err != nil {
			tb.Fatal(err)
		}
	}
	var ins []Input
	for r := 0; r < n; r++ {
		bs := bases[r%len(bases)]
		key := fmt.Sprintf("bench/rank%d.pickle", r)
		meta := sidecar.RankMeta{Version: 1, RunName: "bench", Rank: r, WorldSize: n, Hostname: fmt.Sprintf("node%04d", r/8),
			Window: &sidecar.WindowInfo{ID: 1, Start: 10, Stop: 13}}
		t0, t1 := bs.t0, bs.t1+1
		for i := int64(0); i < 3; i++ {
			meta.Batches = append(meta.Batches, sidecar.BatchMark{Batch: 10 + i, StartUS: t0 + (t1-t0)*i/3, EndUS: t0 + (t1-t0)*(i+1)/3 - 1})
		}
		mb, err := json.Marshal(meta)
		if err != nil {
			tb.Fatal(err)
		}
		an, err := analysis.AnalyzeSnapshot(ctx, bs.snap, &meta, analysis.AnalyzeOptions{Rank: r})
		if err != nil {
			tb.Fatal(err)
		}
		an.Snapshot = analysis.SnapshotRef{Size: int64(len(bs.data)), SHA256: bs.sha}
		ab, err := an.Marshal()
		if err != nil {
			tb.Fatal(err)
		}
		put(key, bs.data)
		put(sidecar.MetaName(key), mb)
		put(analysis.AnalysisName(key), ab)
		ins = append(ins, StoreInput(st, key, sidecar.MetaName(key), r).WithAnalysis(StoreAnalysis(st, analysis.AnalysisName(key))))
	}
	return ins, st
}
