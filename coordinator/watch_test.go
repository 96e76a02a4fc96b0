package coordinator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/rankagent"
)

// TestWatchNeverWaitsBehindAPlan: a member asking the leader how a window
// ended (a client re-asking a new leader) is answered from the run's log while
// the leader is still waiting, before it plans another member's window, for a
// rank to join: not once that wait is over.
func TestWatchNeverWaitsBehindAPlan(t *testing.T) {
	tc := &testCluster{t: t, run: fmt.Sprintf("run%d", time.Now().UnixNano()%1e6), key: newKey(t), dir: t.TempDir(), holdAt: 5}
	grace := func(c *Config, a *rankagent.Config) { c.JoinGrace = 10 * time.Minute }
	for r := 0; r < 3; r++ {
		tc.startRank(r, 4, grace) // rank 3 of 4 has not started: a window waits for it
	}
	tc.holding()
	asker := tc.client()
	waiting := make(chan string, 16)
	planned := make(chan struct{})
	go func() {
		defer close(planned)
		asker.Snapshot(testutil.Context(t, 15*time.Minute), 2, func(u Update) {
			if u.Rank < 0 && strings.Contains(u.Reason, "waiting for ranks 3 to join") {
				select {
				case waiting <- u.Reason:
				default:
				}
			}
		}, nil)
	}()
	select {
	case <-waiting:
	case <-planned:
		t.Fatal("the window was answered without waiting for rank 3")
	case <-time.After(2 * time.Minute):
		t.Fatal("the leader never said it waits for rank 3")
	}
	watcher := tc.client()
	leader := tc.ranks[0].Coord.name
	env := watcher.envelope(7)
	env.Body = &pb.Envelope_Request{Request: &pb.SnapshotRequest{Kind: pb.WindowKind_WINDOW_KIND_WINDOW}}
	r, err := watcher.request(testutil.Context(t, time.Minute), leader, env, true)
	if err != nil {
		t.Fatalf("no answer to the watch while the leader waits for rank 3: %v", err)
	}
	res := r.GetWindowResult()
	if res == nil || res.Window != 7 || !strings.Contains(res.Error, "holds no window 7") {
		t.Fatalf("the watch's answer: %+v", r)
	}
	select {
	case <-planned:
		t.Fatal("the window asked for ended before the watch was answered")
	default:
	}
}
