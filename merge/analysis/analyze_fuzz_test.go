package analysis

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// FuzzAnalyzeSnapshot: any snapshot the decoder accepts is analysed without a
// panic, and the analysis passes the checks a leader puts a rank's analysis
// through (figures replayed from a damaged trace included: the largest free
// block, the kept sites), so an honest rank's analysis is never refused.
//
//	go test ./merge/analysis -run '^$' -fuzz FuzzAnalyzeSnapshot -fuzztime 60s
func FuzzAnalyzeSnapshot(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join(testutil.RepoRoot(f), "testdata", "seeds", "*.pickle"))
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := snapshot.DecodeAny(data)
		if err != nil {
			return
		}
		a, err := AnalyzeSnapshot(context.Background(), s, nil, AnalyzeOptions{})
		if err != nil {
			return
		}
		a.Snapshot = SnapshotRef{Size: int64(len(data)), SHA256: "0000000000000000000000000000000000000000000000000000000000000000"}
		if err := a.check(); err != nil {
			t.Fatalf("our own analysis is refused: %v", err)
		}
	})
}
