package leader

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/runlog"
)

// fakeMember is a member with no cluster behind it, for the leader's unit
// tests: ranks 0 to world-1 are members, none answers, and every message the
// leader sends is kept.
type fakeMember struct {
	name  string
	world int

	mu   sync.Mutex
	term uint64
	sent []*pb.Envelope // replies and gossip, in order
	to   []string       // the members replied to, in order
}

var _ Member = (*fakeMember)(nil)

func (f *fakeMember) Name() string { return f.name }
func (f *fakeMember) Rank() int32  { return 0 }
func (f *fakeMember) Term() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.term
}
func (f *fakeMember) Believe(t uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t < f.term {
		return false
	}
	f.term = t
	return true
}
func (f *fakeMember) BelieveTerm(context.Context, *runlog.Log)    {}
func (f *fakeMember) UpdateMeta()                                 {}
func (f *fakeMember) SawWindow(uint64) bool                       { return false }
func (f *fakeMember) Began() time.Time                            { return time.Now().Add(-time.Hour) }
func (f *fakeMember) GoneAt(_ string, now time.Time) time.Time    { return now }
func (f *fakeMember) LastHeard(_ string, now time.Time) time.Time { return now }
func (f *fakeMember) AbsentRanks() (gone, never []int)            { return nil, nil }
func (f *fakeMember) RankNodes() map[int]*memberlist.Node {
	out := map[int]*memberlist.Node{}
	for r := 0; r < f.world; r++ {
		out[r] = &memberlist.Node{Name: "job/rank" + strconv.Itoa(r)}
	}
	return out
}
func (f *fakeMember) RankAgents() map[int]string         { return map[int]string{} }
func (f *fakeMember) Node(string) *memberlist.Node       { return nil }
func (f *fakeMember) IsRankMember(env *pb.Envelope) bool { return env.SenderRank >= 0 }
func (f *fakeMember) Envelope(window uint64) *pb.Envelope {
	return &pb.Envelope{Sender: f.name, WindowId: window}
}
func (f *fakeMember) Forget(uint64)                                  {}
func (f *fakeMember) HandleLocal(*pb.Envelope)                       {}
func (f *fakeMember) Spawn(fn func()) bool                           { go fn(); return true }
func (f *fakeMember) StillCrossing(int) string                       { return "" }
func (f *fakeMember) SendBytes(*memberlist.Node, []byte, bool) error { return nil }
func (f *fakeMember) ExpectRanks(buf int) (chan *pb.Envelope, uint64) {
	return make(chan *pb.Envelope, buf), 1
}
func (f *fakeMember) Reply(req, env *pb.Envelope, _ bool) {
	f.keep(env)
	f.mu.Lock()
	f.to = append(f.to, req.Sender)
	f.mu.Unlock()
}
func (f *fakeMember) Gossip(env *pb.Envelope) { f.keep(env) }

// Status: no rank answers; the wait ends with ctx (or at once when it has ended).
func (f *fakeMember) Status(ctx context.Context, ranks []int) map[int]Status {
	return map[int]Status{}
}

func (f *fakeMember) keep(env *pb.Envelope) {
	f.mu.Lock()
	f.sent = append(f.sent, env)
	f.mu.Unlock()
}

func (f *fakeMember) told() []*pb.Envelope {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pb.Envelope(nil), f.sent...)
}

// folderLog is a run's log ("job") on a folder store of the test's own, and a
// context that ends with the test (at most a minute).
func folderLog(t *testing.T) (store.Store, *runlog.Log, context.Context) {
	t.Helper()
	st, err := store.OpenDir(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	return st, runlog.New(st, "job"), testutil.Context(t, time.Minute)
}
