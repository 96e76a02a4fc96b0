package leader

import (
	"context"
	"testing"

	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
)

// TestSteppedDownLeaderTellsNoFailure: a leader that stops leading while it asks
// the ranks for their batches (its context ends, and with it every answer it
// waited for) tells the member that asked nothing: the ranks did not fail to
// answer, the leader went; the member asks the new one. (Told "no rank answered
// the leader", the member's window failed while the cluster was well.)
func TestSteppedDownLeaderTellsNoFailure(t *testing.T) {
	f := &fakeMember{name: "job/rank0", world: 3}
	cfg := config.DefaultLocal(rankagent.Identity{RunName: "job", Rank: 0, WorldSize: 3})
	l := New(f, &cfg, testutil.Logger(t))
	st, _ := store.OpenDir(t.TempDir(), true)
	l.st, l.rl, l.term = st, runlog.New(st, "job"), 1 // leading, with a term
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // stepped down
	watcher := &pb.Envelope{Sender: "job/client", SenderRank: -1, Seq: 42}
	if res := l.record(ctx, plan{length: 2, reason: "request", watchers: []*pb.Envelope{watcher}}, false); res != nil {
		t.Fatalf("a leader that stepped down told %+v", res)
	}
	for _, env := range f.told() {
		if a := env.GetAck(); a != nil && a.Code != pb.AckCode_ACK_OK {
			t.Fatalf("a leader that stepped down told the member %v: %s", a.Code, a.Message)
		}
		if r := env.GetWindowResult(); r != nil {
			t.Fatalf("a leader that stepped down told the member a result: %+v", r)
		}
	}
}
