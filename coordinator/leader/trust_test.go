package leader

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/rankagent"
)

// TestAnotherRanksSnapshotIsNotTaken: a rank's result that points at another
// rank's (or another run's) metadata is left out, with the reason; the rank's
// own is taken.
func TestAnotherRanksSnapshotIsNotTaken(t *testing.T) {
	st, err := store.OpenDir(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	put := func(key string, m sidecar.RankMeta) {
		b, _ := json.Marshal(m)
		if _, err := st.Put(ctx, key, bytes.NewReader(b), store.PutOptions{Overwrite: true}); err != nil {
			t.Fatal(err)
		}
	}
	marks := []sidecar.BatchMark{{Batch: 10, StartUS: 1, EndUS: 2}, {Batch: 11, StartUS: 2, EndUS: 3}}
	put("r0.json", sidecar.RankMeta{Version: 1, RunName: "gpt", Rank: 0, WorldSize: 2, Window: &sidecar.WindowInfo{ID: 5, Start: 10, Stop: 12}, Batches: marks})
	put("other.json", sidecar.RankMeta{Version: 1, RunName: "bert", Rank: 1, WorldSize: 2, Window: &sidecar.WindowInfo{ID: 5, Start: 10, Stop: 12}, Batches: marks})
	cfg := config.Config{Identity: rankagent.Identity{RunName: "gpt"}}
	l := New(&fakeMember{name: "gpt/rank0"}, &cfg, slog.New(slog.DiscardHandler))
	l.st = st
	w := newWin(window.New(window.Config{ID: 5, Start: 10, Stop: 12, World: 2}), "", nil, "")
	for _, c := range []struct {
		key  string
		rank int
		want string
	}{{"r0.json", 0, ""}, {"r0.json", 1, "rank 0's"}, {"other.json", 1, `run "bert"`}} {
		meta, why, err := l.checkCoverage(ctx, &pb.RankResult{MetaKey: c.key}, c.rank, w)
		if err != nil || (c.want == "") != (why == "") || !strings.Contains(why, c.want) {
			t.Errorf("rank %d with %s: %q %v, want %q", c.rank, c.key, why, err, c.want)
		}
		if (why == "") != (meta != nil) {
			t.Errorf("rank %d with %s: the sidecar's %d bytes handed on with %q", c.rank, c.key, len(meta), why)
		}
	}
}
