package coordinator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/memsnap/memsnap/coordinator/view"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/rankagent"
)

// The leader's view of the job's memory: every rank sends its trainer's figures
// (rankagent.MemoryView) to the member it sees as leader every FiguresInterval,
// one small packet; the leader keeps the last of each rank and answers a
// ViewRequest with all of them. Every rank sends to whoever leads, so a new
// leader has the whole view within one interval. Figures go nowhere else: not in
// node metadata, not in gossip.

// memoryReader is what a rank's recorder offers when it can tell its trainer's
// memory (the rank agent does).
type memoryReader interface {
	Memory() (rankagent.MemoryView, bool)
}

// viewStale is how many FiguresIntervals a rank's figures are kept without a
// newer report: after that the rank is out of the view (its agent or trainer is
// gone), not shown with its last figures forever.
const viewStale = 3

// rankView is one rank's last figures as this member received them.
type rankView struct {
	f    *pb.Figures
	at   time.Time
	node string
}

// figuresLoop sends this rank's figures to its leader every FiguresInterval
// (with a tenth of jitter, so a thousand ranks do not send at one moment).
func (c *Coordinator) figuresLoop(ctx context.Context) {
	mr, ok := c.rec.(memoryReader)
	every := c.cfg.FiguresInterval
	if !ok || every <= 0 {
		return
	}
	for {
		d := every + time.Duration(rand.Int64N(int64(every)/10+1))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		v, ok := mr.Memory()
		if !ok {
			continue
		}
		c.mu.Lock()
		leader := c.leaderName
		c.mu.Unlock()
		if leader == "" {
			continue
		}
		env := c.envelope(0)
		env.Body = &pb.Envelope_Figures{Figures: view.FiguresOf(v)}
		c.post(leader, "", env, false)
	}
}

// onFigures keeps a rank's figures (only that rank may send them), and on the
// leader checks them against the triggers.
func (c *Coordinator) onFigures(env *pb.Envelope, f *pb.Figures) {
	if !c.isRankMember(env) {
		c.refuse(env, "a rank's figures from a member that is not that rank")
		return
	}
	rank := int(env.SenderRank)
	c.mu.Lock()
	if ws := c.cfg.Identity.WorldSize; ws > 0 && rank >= ws {
		c.mu.Unlock()
		return
	}
	node := ""
	if m := c.members[env.Sender]; m != nil {
		node = m.meta.Hostname
	}
	if c.views == nil {
		c.views = map[int]rankView{}
	}
	c.views[rank] = rankView{f: f, at: time.Now(), node: node}
	c.mu.Unlock()
	c.checkTriggers(rank, f)
}

// View is this member's view of the job's memory: every rank's last figures,
// the lowest headroom first.
func (c *Coordinator) View() *pb.ClusterView {
	now := time.Now()
	c.mu.Lock()
	v := &pb.ClusterView{WorldSize: int32(c.cfg.Identity.WorldSize), LeaderRank: -1}
	if c.lead != nil {
		v.LeaderRank = int32(c.cfg.Identity.Rank)
	}
	stale := viewStale * max(c.cfg.FiguresInterval, time.Second)
	for r, rv := range c.views {
		if now.Sub(rv.at) > stale {
			delete(c.views, r) // a rank gone (or its trainer): a gap, not its last figures forever
			continue
		}
		v.Ranks = append(v.Ranks, &pb.RankFigures{Rank: int32(r), Figures: rv.f, AgeMs: now.Sub(rv.at).Milliseconds(), Node: rv.node})
	}
	c.mu.Unlock()
	// (a rank that leads keeps its own figures as the others send theirs)
	v.Reporting = int32(len(v.Ranks))
	view.Sort(v)
	return v
}

// maxViewRanks bounds the ranks a view message carries (the lowest headroom
// first): 4,096 ranks' figures are about half a megabyte, within a message's
// bound with room to spare.
const maxViewRanks = 4096

// answerView answers a ViewRequest with this member's view, the lowest
// headroom first, at most maxViewRanks of it.
func (c *Coordinator) answerView(env *pb.Envelope) {
	r := c.envelope(0)
	r.Body = &pb.Envelope_View{View: c.boundedView()}
	c.reply(env, r, true)
}

// boundedView is View cut to maxViewRanks.
func (c *Coordinator) boundedView() *pb.ClusterView {
	v := c.View()
	if len(v.Ranks) > maxViewRanks {
		v.Ranks = v.Ranks[:maxViewRanks]
	}
	return v
}

// AskView asks the leader for its view of the job's memory.
func (c *Coordinator) AskView(ctx context.Context) (*pb.ClusterView, error) {
	c.mu.Lock()
	leader := c.leaderName
	c.mu.Unlock()
	if leader == "" {
		return nil, ErrNoLeader
	}
	env := c.envelope(0)
	env.Body = &pb.Envelope_ViewRequest{ViewRequest: &pb.ViewRequest{}}
	rep, err := c.request(ctx, leader, env, true)
	if err != nil {
		return nil, fmt.Errorf("asking the leader (%s) for its view: %w", leader, err)
	}
	v := rep.GetView()
	if v == nil {
		return nil, fmt.Errorf("the leader (%s) answered with no view", leader)
	}
	return v, nil
}
