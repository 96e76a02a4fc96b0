package coordinator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/coordinator/view"
	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/merge/analysis"
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

// incidentKeep is how long the view carries a rank's incident (its latest OOM
// or crash) after this member heard of it.
const incidentKeep = 10 * time.Minute

// incident is a rank's latest OOM or crash, from its post-mortem request.
type incident struct {
	inc   *pb.RankIncident // (its age set as the view is answered)
	heard time.Time
}

// noteIncident keeps, on the leader, what a rank's post-mortem request says of
// its OOM or crash (only that rank may say it), for the view: memsnap top says
// "out of memory at batch N" or "crashed: CAUSE" of it.
func (c *Coordinator) noteIncident(env *pb.Envelope, r *pb.SnapshotRequest) {
	oomOrCrash := r.Kind == pb.WindowKind_WINDOW_KIND_OOM || r.Kind == pb.WindowKind_WINDOW_KIND_CRASH
	if !oomOrCrash || r.FailedRank != env.SenderRank || !c.isRankMember(env) {
		return
	}
	inc := &pb.RankIncident{Rank: r.FailedRank, Kind: r.Kind, Cause: analysis.CutUTF8(r.Cause, wire.MaxIncidentCause), Batch: -1, AtUs: max(r.AtUs, 0)}
	if r.Batch != nil {
		inc.Batch = *r.Batch
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ws := c.cfg.Identity.WorldSize; c.lead == nil || ws > 0 && int(r.FailedRank) >= ws {
		return
	}
	if c.incidents == nil {
		c.incidents = map[int]incident{}
	}
	c.incidents[int(r.FailedRank)] = incident{inc: inc, heard: time.Now()}
}

// viewIncidents are the incidents heard of within incidentKeep, at most
// wire.MaxViewIncidents of them (the latest), by rank. Called with c.mu held.
func (c *Coordinator) viewIncidents(now time.Time) []*pb.RankIncident {
	var keep []incident
	for r, ri := range c.incidents {
		if now.Sub(ri.heard) > incidentKeep {
			delete(c.incidents, r)
			continue
		}
		keep = append(keep, ri)
	}
	sort.Slice(keep, func(i, j int) bool { return keep[i].heard.After(keep[j].heard) })
	keep = keep[:min(len(keep), wire.MaxViewIncidents)]
	out := make([]*pb.RankIncident, len(keep))
	for i, ri := range keep {
		in := proto.Clone(ri.inc).(*pb.RankIncident)
		in.AgeMs = now.Sub(ri.heard).Milliseconds()
		out[i] = in
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rank < out[j].Rank })
	return out
}

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
// the lowest headroom first, and the ranks' latest incidents.
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
	v.Incidents = c.viewIncidents(now)
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
