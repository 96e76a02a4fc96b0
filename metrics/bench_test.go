package metrics

import (
	"fmt"
	"io"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/rankagent"
)

// BenchmarkLeaderScrape is one Prometheus scrape of the leader of 1,024 ranks:
// its own figures and health, every rank's figures from its view, the Go and
// process collectors, in the text format.
//
//	go test -run XXX -bench LeaderScrape ./metrics
func BenchmarkLeaderScrape(b *testing.B) {
	for _, n := range []int{64, 1024} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			v := &pb.ClusterView{WorldSize: int32(n), LeaderRank: 0}
			for r := 0; r < n; r++ {
				v.Ranks = append(v.Ranks, &pb.RankFigures{Rank: int32(r), Node: fmt.Sprintf("node%04d", r/8), AgeMs: 1200,
					Figures: &pb.Figures{Batch: 1000, Allocated: 20 << 30, Reserved: 22 << 30, Peak: 21 << 30, DeviceTotal: 80 << 30, DeviceUsed: 60 << 30,
						Headroom: int64(r+1) << 28, Growth: float64(r)}})
			}
			src := Source{Run: "job", Rank: 0, Node: "node0000",
				Memory: func() (rankagent.MemoryView, bool) {
					return rankagent.MemoryView{Batch: 1000, At: time.Now(), Memory: rankagent.Memory{Allocated: 1 << 30}, DeviceTotal: 80 << 30, Headroom: 1 << 30}, true
				},
				Stats: func() rankagent.Stats { return rankagent.Stats{} }, SpoolBytes: func() int64 { return 0 },
				Members: func() int { return n }, Term: func() uint64 { return 3 }, Leading: func() bool { return true },
				View: func() *pb.ClusterView { return v }}
			h := Handler(src)
			req := httptest.NewRequest("GET", "/metrics", nil)
			var size int
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				body, _ := io.ReadAll(w.Result().Body)
				size = len(body)
			}
			b.ReportMetric(float64(size), "bytes/scrape")
		})
	}
}
