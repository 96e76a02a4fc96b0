package analysis

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/merge/synth"
)

// BenchmarkAnalysis times a rank's analysis of a 100,000-event trace (grown from
// the recorded transformer), and its categories alone:
//
//	go test ./merge/analysis -run '^$' -bench Analysis -benchmem
func BenchmarkAnalysis(b *testing.B) {
	base, err := snapshot.ReadFile(filepath.Join(testutil.RepoRoot(b), "testdata", "snapshots", "single", "transformer.memory_snapshot.pickle"))
	if err != nil {
		b.Fatal(err)
	}
	s := synth.Grow(base, 100000, 0)
	b.Run("whole", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := AnalyzeSnapshot(context.Background(), s, nil, AnalyzeOptions{Rank: 0}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("categories", func(b *testing.B) {
		r := RankFromSnapshot(s, 0, "")
		for i := 0; i < b.N; i++ {
			r.categories(Window{}, len(r.Trace)/2, 0)
		}
	})
}
