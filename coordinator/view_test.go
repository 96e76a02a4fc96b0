package coordinator

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/coordinator/leader"
	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/rankagent"
)

// TestClusterView: every rank sends its trainer's memory figures to the leader,
// which answers a member's ViewRequest with the whole job, the lowest headroom
// first; each rank's figures are the ones its trainer reported. When the leader
// dies, the next one has the view of every live rank within a report period or
// so (each rank sends to whoever leads).
func TestClusterView(t *testing.T) {
	leak := []int64{0, 1 << 20, 2 << 20, 64 << 20}
	tc := &testCluster{t: t, run: fmt.Sprintf("run%d", time.Now().UnixNano()%1e6), key: newKey(t), dir: t.TempDir(), holdAt: 5,
		replay: func(rank int, rc *rankagent.ReplayConfig) {
			rc.LeakPerBatch, rc.MemoryEvery, rc.DeviceTotal = leak[rank], 10*time.Millisecond, 2<<30
		}}
	fast := func(c *Config, a *rankagent.Config) { c.FiguresInterval = 200 * time.Millisecond }
	for r := 0; r < 4; r++ {
		tc.startRank(r, 4, fast)
	}
	tc.holding()
	base := make([]int64, 4)
	for r := range base {
		b, err := os.ReadFile(testutil.Snapshot(t, fmt.Sprintf("ddp4/rank%d.5.memory_snapshot.pickle", r)))
		if err != nil {
			t.Fatal(err)
		}
		s, err := snapshot.DecodeAny(b)
		if err != nil {
			t.Fatal(err)
		}
		base[r] = s.AllocatedAtEnd(0)
	}
	c := tc.client()
	var v *pb.ClusterView
	var why string
	complete := func(leader int, ranks ...int) func() bool {
		return func() bool {
			got, err := c.AskView(testutil.Context(t, 10*time.Second))
			if err != nil {
				why = err.Error()
				return false
			}
			v = got
			if int(v.LeaderRank) != leader || len(v.Ranks) != len(ranks) || v.WorldSize != 4 {
				why = fmt.Sprintf("%v", v)
				return false
			}
			for _, rf := range v.Ranks {
				f := rf.Figures
				// the trainers hold before batch 5: their last report is of batch 4
				if f.Batch != 4 || f.Allocated != base[rf.Rank]+leak[rf.Rank]*5 || f.DeviceTotal != 2<<30 {
					why = fmt.Sprintf("rank %d: %v", rf.Rank, f)
					return false
				}
			}
			return true
		}
	}
	defer func() {
		if t.Failed() {
			t.Logf("the last view: %s", why)
		}
	}()
	testutil.Eventually(t, time.Minute, "the leader's view of every rank", complete(0, 0, 1, 2, 3))
	for i := 1; i < len(v.Ranks); i++ {
		if v.Ranks[i-1].Figures.Headroom > v.Ranks[i].Figures.Headroom {
			t.Fatalf("the view is not sorted by headroom: %v", v)
		}
	}
	if v.Ranks[0].Rank != 3 {
		t.Fatalf("rank 3 leaks 64 MiB a batch and should have the least headroom: %v", v)
	}
	if g := v.Ranks[0].Figures.Growth; g != float64(leak[3]) {
		t.Fatalf("rank 3 grows %v bytes a batch, want %d", g, leak[3])
	}
	host, _ := os.Hostname()
	if v.Ranks[0].Node != host {
		t.Fatalf("rank 3's node %q, want %q", v.Ranks[0].Node, host)
	}
	// the leader dies: the next one has the view of the live ranks
	tc.ranks[0].Coord.Shutdown()
	tc.stops[0]()
	testutil.Eventually(t, time.Minute, "the new leader's view", complete(1, 1, 2, 3))
}

// TestViewFitsAMessage: the leader's view of 16,384 ranks with long host names,
// every one crashed, fits one message (it holds the 4,096 lowest headrooms and
// says how many report, and the latest 1,024 incidents),
// and the member that asked can decode it.
func TestViewFitsAMessage(t *testing.T) {
	c := &Coordinator{cfg: Config{FiguresInterval: time.Second, Identity: rankagent.Identity{WorldSize: 16384}}, views: map[int]rankView{}}
	for r := 0; r < 16384; r++ {
		c.views[r] = rankView{at: time.Now(), node: fmt.Sprintf("gpu-node-%05d.cluster.example.org", r/8),
			f: &pb.Figures{Batch: 123456, Allocated: 70 << 30, Reserved: 75 << 30, Peak: 74 << 30, DeviceTotal: 80 << 30, DeviceUsed: 76 << 30,
				Headroom: int64(r) << 20, Growth: 1.5e6, AtUs: time.Now().UnixMicro()}}
	}
	// and every rank crashed, each with a cause as long as the view keeps
	c.incidents = map[int]incident{}
	for r := 0; r < 16384; r++ {
		c.incidents[r] = incident{heard: time.Now(), inc: &pb.RankIncident{Rank: int32(r), Kind: pb.WindowKind_WINDOW_KIND_CRASH,
			Cause: strings.Repeat("c", wire.MaxIncidentCause), Batch: 123456, AtUs: time.Now().UnixMicro()}}
	}
	env := &pb.Envelope{Sender: "run/rank0", Body: &pb.Envelope_View{View: c.boundedView()}}
	b, err := proto.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	got, err := wire.DecodeEnvelope(b)
	if err != nil {
		t.Fatalf("%d bytes: %v", len(b), err)
	}
	v := got.GetView()
	if v.Reporting != 16384 || len(v.Ranks) != maxViewRanks || v.Ranks[0].Figures.Headroom != 0 || len(v.Incidents) != wire.MaxViewIncidents {
		t.Fatalf("%d reporting, %d ranks, first %v", v.Reporting, len(v.Ranks), v.Ranks[0])
	}
}

// TestViewCarriesIncidents: the leader's view carries each rank's latest OOM or
// crash as its post-mortem request told it (only that rank's own request, only
// an OOM or a crash, only while leading, its cause cut short), whether or not
// the rank still reports figures, for incidentKeep; the view with them fits a
// message.
func TestViewCarriesIncidents(t *testing.T) {
	c := &Coordinator{cfg: Config{FiguresInterval: time.Second, Identity: rankagent.Identity{RunName: "run", WorldSize: 4}}, members: map[string]*member{}}
	for r := range 4 {
		name := NodeName("run", r)
		c.members[name] = &member{node: &memberlist.Node{Name: name}}
	}
	ask := func(from int32, req *pb.SnapshotRequest) {
		c.noteIncident(&pb.Envelope{Sender: NodeName("run", int(max(from, 0))), SenderRank: from, Body: &pb.Envelope_Request{Request: req}}, req)
	}
	oom := &pb.SnapshotRequest{Kind: pb.WindowKind_WINDOW_KIND_OOM, FailedRank: 2, Cause: "out of memory", AtUs: 1700000000000000, Batch: proto.Int64(120)}
	ask(2, oom)
	if v := c.View(); len(v.Incidents) != 0 {
		t.Fatalf("a member that does not lead keeps incidents: %v", v.Incidents)
	}
	c.lead = &leader.Leader{}
	ask(2, oom)
	ask(3, &pb.SnapshotRequest{Kind: pb.WindowKind_WINDOW_KIND_CRASH, FailedRank: 3, Cause: "SIGTERM " + strings.Repeat("x", 1000), AtUs: 1700000000000000})
	ask(3, &pb.SnapshotRequest{Kind: pb.WindowKind_WINDOW_KIND_OOM, FailedRank: 1, Cause: "out of memory"}) // another rank's
	ask(-1, &pb.SnapshotRequest{Kind: pb.WindowKind_WINDOW_KIND_CRASH, FailedRank: -1, Cause: "x"})         // not a rank
	ask(0, &pb.SnapshotRequest{Kind: pb.WindowKind_WINDOW_KIND_WINDOW, FailedRank: 0, Reason: "asked"})     // a window
	c.views = map[int]rankView{0: {f: &pb.Figures{Batch: 121, DeviceTotal: 80 << 30, Headroom: 9 << 30}, at: time.Now()}}
	v := c.View()
	if len(v.Ranks) != 1 || len(v.Incidents) != 2 {
		t.Fatalf("view %v", v)
	}
	a, b := v.Incidents[0], v.Incidents[1]
	if a.Rank != 2 || a.Kind != pb.WindowKind_WINDOW_KIND_OOM || a.Batch != 120 || a.Cause != "out of memory" || a.AtUs != 1700000000000000 || a.AgeMs < 0 {
		t.Fatalf("rank 2's OOM: %v", a)
	}
	if b.Rank != 3 || b.Kind != pb.WindowKind_WINDOW_KIND_CRASH || b.Batch != -1 || !strings.HasPrefix(b.Cause, "SIGTERM") || len(b.Cause) > wire.MaxIncidentCause {
		t.Fatalf("rank 3's crash: %v", b)
	}
	env := &pb.Envelope{Sender: "run/rank0", Body: &pb.Envelope_View{View: v}}
	if raw, err := proto.Marshal(env); err != nil {
		t.Fatal(err)
	} else if got, err := wire.DecodeEnvelope(raw); err != nil || len(got.GetView().Incidents) != 2 {
		t.Fatalf("the view does not decode: %v", err)
	}
	// kept for incidentKeep, then gone
	c.mu.Lock()
	c.incidents[2] = incident{inc: c.incidents[2].inc, heard: time.Now().Add(-incidentKeep - time.Second)}
	c.mu.Unlock()
	if v := c.View(); len(v.Incidents) != 1 || v.Incidents[0].Rank != 3 {
		t.Fatalf("after incidentKeep: %v", v.Incidents)
	}
}
