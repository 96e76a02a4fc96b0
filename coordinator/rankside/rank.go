package rankside

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
)

// stepOf is a rank's window state as it travels (the agent's states are the
// steps' names).
func stepOf(s rankagent.WindowState) pb.Step {
	step, _ := pb.Parse[pb.Step](string(s))
	return step
}

// --- the rank's side --------------------------------------------------------------

func (c *Rank) AnswerStatus(req *pb.Envelope) {
	st := &pb.Status{Batch: -1, TimeUs: c.cfg.Now().UnixMicro()}
	if c.rec != nil {
		b, step := c.rec.Progress()
		st.Batch, st.StepUs, st.Trainer = b, step.Microseconds(), b >= 0
		if a, ok := c.rec.(interface{ Connected() bool }); ok {
			st.Trainer = a.Connected()
		}
		if a, ok := c.rec.(interface{ SpooledWindows() []uint64 }); ok {
			st.Spooled = a.SpooledWindows()
		}
	}
	c.mu.Lock()
	l := c.side.Latest
	c.mu.Unlock()
	st.Seen, st.Term = c.cl.Seen(), c.cl.Term()
	if l.ID != 0 {
		st.Window, st.Start, st.Stop, st.State, st.Result = l.ID, l.Start, l.Stop, l.Step, l.Result
	}
	r := c.cl.Envelope(st.Window)
	r.Body = &pb.Envelope_Status{Status: st}
	c.cl.Reply(req, r, true)
}

// refuseCommand answers a command this member will not obey.
func (c *Rank) refuseCommand(env *pb.Envelope, code pb.AckCode, why string) {
	c.cl.Refuse(env, why)
	if env.Seq == 0 {
		return
	}
	r := c.cl.Envelope(env.WindowId)
	r.Body = &pb.Envelope_Ack{Ack: &pb.Ack{Code: code, Message: why, Term: c.cl.Term()}}
	c.cl.Reply(env, r, true)
}

// obeys says whether this rank takes a window's command (a plan, a dump): it
// has a recorder, the command names a window, and commandAllowed lets it (else
// it is refused).
func (c *Rank) obeys(env *pb.Envelope) bool {
	if c.rec == nil || env.WindowId == 0 {
		return false
	}
	if code, why := c.cl.CommandAllowed(env); code != pb.AckCode_ACK_OK {
		c.refuseCommand(env, code, why)
		return false
	}
	return true
}

func (c *Rank) OnPlan(env *pb.Envelope, p *pb.Plan) {
	if !c.obeys(env) {
		return
	}
	if len(p.Ranks) > 0 && !slices.Contains(p.Ranks, int32(c.cfg.Identity.Rank)) {
		// a plan that leaves this rank out (it reached it through gossip)
		c.log.Debug("a window planned without this rank", "window", env.WindowId)
		return
	}
	w := rankagent.Window{ID: env.WindowId, Start: p.Start, Stop: p.Stop}
	batch, _ := c.rec.Progress()
	ack := &pb.Ack{Ok: true, Batch: batch}
	err := c.rec.Arm(w)
	if errors.Is(err, rankagent.ErrBusy) {
		// busy with a window another leader planned (one that stalled, died or
		// flapped), or this leader under an older term: the current leader's plan
		// wins, and the old window is finished from the run's log without this rank
		c.mu.Lock()
		old := c.side.Latest
		c.mu.Unlock()
		if old.ID != 0 && old.ID < w.ID && (old.Leader != env.Sender || old.Term < env.Term) {
			c.log.Warn("a window of another leader is in progress; the current leader's plan replaces it", "old_window", old.ID, "window", w.ID)
			c.rec.Cancel(old.ID, fmt.Sprintf("replaced by window %d of the current leader", w.ID))
			err = c.rec.Arm(w)
		}
	}
	if errors.Is(err, rankagent.ErrStale) {
		c.mu.Lock()
		l := c.side.Latest
		again := l.ID == w.ID && l.Start == w.Start && l.Stop == w.Stop
		c.mu.Unlock()
		if again {
			// the plan comes directly and through gossip: a copy that arrives after
			// the window ended here is the window this rank took, not a stale one
			err = nil
		}
	}
	if (errors.Is(err, rankagent.ErrStale) || errors.Is(err, rankagent.ErrBusy)) && c.checkNewest(env, w) {
		return // the newest window this rank has seen is looked up in the log first; the ack comes then
	}
	switch {
	case err == nil:
		c.mu.Lock()
		c.side.Planned(w.ID, w.Start, w.Stop, env.Sender, env.Term)
		// the window id is not gossiped from here: a metadata update by every rank
		// for every window costs the cluster O(n^2) messages; a new leader learns
		// the newest id from the run's log and the ranks' status answers
		c.mu.Unlock()
		bump := c.cl.SawWindow(w.ID)
		if bump {
			c.log.Info("window planned", "window", w.ID, "start", w.Start, "stop", w.Stop, "batch", batch, "reason", p.Reason, "term", env.Term)
		}
	case errors.Is(err, rankagent.ErrPassed):
		ack.Code = pb.AckCode_ACK_PASSED
	case errors.Is(err, rankagent.ErrBusy):
		ack.Code = pb.AckCode_ACK_BUSY
	case errors.Is(err, rankagent.ErrStale):
		ack.Code = pb.AckCode_ACK_STALE
	default:
		ack.Code = pb.AckCode_ACK_ERROR
	}
	if err != nil {
		ack.Ok, ack.Message = false, err.Error()
		c.log.Warn("window refused", "window", w.ID, "code", ack.Code, "err", err)
	}
	r := c.cl.Envelope(w.ID)
	r.Body = &pb.Envelope_Ack{Ack: ack}
	c.cl.Reply(env, r, true)
}

// forgetter is what of the agent undoes a forged plan (rankagent.Agent).
type forgetter interface {
	LastWindow() uint64
	Forget(id, floor uint64)
}

// checkNewest looks up, when the leader's plan w is refused as older than a
// window this rank has seen, whether the run's log holds that window: a plan a
// member forged under the leader's name (with a far id) would otherwise make
// this rank refuse every real window after it. It reports whether a lookup was
// started: the lookup answers the plan.
func (c *Rank) checkNewest(env *pb.Envelope, w rankagent.Window) bool {
	f, ok := c.rec.(forgetter)
	if !ok || c.cfg.OpenStore == nil {
		return false
	}
	newest := f.LastWindow()
	if cur, _, ok := c.rec.Current(); ok {
		newest = max(newest, cur.ID)
	}
	c.mu.Lock()
	if newest <= w.ID || newest <= c.inLog || c.looking[newest] {
		c.mu.Unlock()
		return false
	}
	if c.looking == nil {
		c.looking = map[uint64]bool{}
	}
	c.looking[newest] = true
	c.mu.Unlock()
	return c.cl.Spawn(func() {
		defer func() {
			c.mu.Lock()
			delete(c.looking, newest)
			c.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := c.cfg.OpenStore(ctx)
		var p *runlog.Plan
		if err == nil {
			p, err = runlog.New(st, c.cfg.Identity.RunName).ReadPlan(ctx, newest)
			st.Close()
		}
		switch {
		case err == nil && p.ID == newest:
			c.mu.Lock()
			c.inLog = max(c.inLog, newest)
			c.mu.Unlock()
		case errors.Is(err, store.ErrNotFound) || errors.Is(err, runlog.ErrMalformed):
			c.log.Warn("a window this rank took is not in the run's log (a forged plan); it is withdrawn", "window", newest, "plan", w.ID)
			f.Forget(newest, w.ID-1)
			c.mu.Lock()
			c.side.Withdrawn(newest)
			c.mu.Unlock()
		default:
			c.log.Warn("cannot look up in the run's log a window newer than the leader's plan", "window", newest, "plan", w.ID, "err", err)
			c.mu.Lock()
			c.inLog = max(c.inLog, newest) // not looked up again: the plan is refused as before
			c.mu.Unlock()
		}
		c.cl.HandleLocal(env) // the plan again, now against what the log holds
	})
}

func (c *Rank) OnCancel(env *pb.Envelope, x *pb.Cancel) {
	if c.rec == nil {
		return
	}
	if code, why := c.cl.CommandAllowed(env); code != pb.AckCode_ACK_OK {
		c.cl.Refuse(env, "cancel: "+why)
		return
	}
	c.rec.Cancel(env.WindowId, x.Reason)
	c.mu.Lock()
	c.side.Cancelled(env.WindowId)
	c.mu.Unlock()
	c.cl.SawWindow(env.WindowId)
}

// OnDump answers a post-mortem: the snapshot this rank's trainer took when it hit
// an OOM or was being stopped (when that is recent), else its snapshot now.
func (c *Rank) OnDump(env *pb.Envelope, d *pb.Dump) {
	if !c.obeys(env) {
		return
	}
	ack := &pb.Ack{Ok: true}
	w := rankagent.Window{ID: env.WindowId}
	var have *pb.RankResult
	c.mu.Lock()
	inc := c.inc
	// the snapshot the trainer took when it failed or was stopped is this rank's
	// part of the post-mortem (also when the dump comes again: the leader asks
	// once more when the rank's own report of its failure reaches it)
	mine := inc != nil && inc.fresh(c.cfg.IncidentHold()) && (inc.handedTo == 0 || inc.handedTo == w.ID) && !(inc.sent && inc.handedTo == w.ID) &&
		d.Kind != pb.WindowKind_WINDOW_KIND_TRIGGER // (a trigger's dump is of the history now)
	dup := c.side.Dumped(w.ID, env.Sender)
	if mine {
		inc.handedTo, inc.leader = w.ID, env.Sender
		if inc.result != nil {
			have = proto.Clone(inc.result).(*pb.RankResult)
			inc.sent = true
			c.side.Handed(w.ID, have, true)
		} else if inc.noSnapshot != "" {
			have = &pb.RankResult{Error: inc.noSnapshot, Reason: "crash", Cause: inc.cause}
			inc.sent = true
			c.side.Handed(w.ID, have, false)
		} else {
			inc.sent = false // it goes to this post-mortem once stored
		}
	}
	c.mu.Unlock()
	c.cl.SawWindow(w.ID)
	if !dup && !mine {
		if err := c.rec.Dump(w.ID); err != nil {
			ack.Ok, ack.Code, ack.Message = false, pb.AckCode_ACK_ERROR, err.Error()
		}
	}
	r := c.cl.Envelope(w.ID)
	r.Body = &pb.Envelope_Ack{Ack: ack}
	c.cl.Reply(env, r, true)
	if have != nil {
		c.sendResult(env.Sender, w.ID, have)
	}
}

// sendResult gives a post-mortem's leader this rank's snapshot, and writes it
// into the run's log.
func (c *Rank) sendResult(leader string, window uint64, r *pb.RankResult) {
	env := c.cl.Envelope(window)
	env.Body = &pb.Envelope_Result{Result: r}
	c.cl.Post(leader, env, true)
	c.rep.put(window, r)
}

// --- incidents: this rank's trainer hit an OOM or is being stopped -----------------

// incident is this rank's trainer's latest OOM or crash, until a post-mortem has
// its snapshot.
type incident struct {
	kind       pb.WindowKind
	cause      string
	batch      int64          // the batch it failed at (-1: not known)
	at         time.Time      // when, on this host's clock
	result     *pb.RankResult // the snapshot the trainer took, once stored
	noSnapshot string         // why there will be none
	handedTo   uint64         // the post-mortem window it belongs to (0: none yet)
	leader     string
	sent       bool // the post-mortem's leader has it, or said it takes none
	asked      string
	askedAt    time.Time
	seq        uint64 // the request's id, for the leader's answer
}

// incidentRetry is how long a rank waits for the leader to take (or decline)
// its incident before it asks again (a request lost to a leader that was
// leaving, or that had not started leading yet).
const incidentRetry = 2 * time.Second

// IncidentLoop asks again, while this rank's incident is neither taken nor
// declined.
func (c *Rank) IncidentLoop(ctx context.Context) {
	t := time.NewTicker(incidentRetry / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		inc := c.inc
		again := inc != nil && inc.fresh(c.cfg.IncidentHold()) && inc.handedTo == 0 && !inc.sent && time.Since(inc.askedAt) >= incidentRetry
		if again {
			inc.asked = "" // whoever leads now
		}
		off := c.offset.offset
		c.mu.Unlock()
		if again {
			c.askPostmortem(inc, inc.at.Add(-off))
		}
	}
}

func (i *incident) fresh(hold time.Duration) bool { return time.Since(i.at) < hold }

// Settled reports whether this rank has nothing left to hand on: no snapshot of an
// OOM or a crash that a post-mortem has not taken yet (within the hold time), and
// no report waiting to be written. An agent whose trainer exited waits for it
// before it stops.
func (c *Rank) Settled() bool {
	c.mu.Lock()
	inc := c.inc
	pending := inc != nil && inc.fresh(c.cfg.IncidentHold()) && !inc.sent
	c.mu.Unlock()
	return !pending && c.rep.idle() && c.cl.OutIdle()
}

// Observe takes the agent's window events (rankagent.Config.OnWindow) and tells the
// leader: every step as progress, and the stored snapshot as the rank's result.
func (c *Rank) Observe(ev rankagent.WindowEvent) {
	switch {
	case ev.State == rankagent.WindowOOM:
		c.incidentStart(pb.WindowKind_WINDOW_KIND_OOM, "out of memory", ev)
		return
	case ev.State == rankagent.WindowStopping:
		c.incidentStart(pb.WindowKind_WINDOW_KIND_CRASH, ev.Reason, ev)
		if ev.Window.ID == 0 {
			return
		}
	case ev.Upload != nil && (ev.Upload.Reason == "oom" || ev.Upload.Reason == "crash"):
		c.incidentSnapshot(resultOf(ev.Upload), "")
		if ev.Upload.Window.ID == 0 || len(ev.Upload.Covers) != 2 {
			return
		}
		// a crash in the middle of a window: what it recorded is also this
		// rank's (partial) part of that window, told to its leader as its result
		ev.Upload = windowPart(ev.Upload)
		ev.Window = ev.Upload.Window
	case ev.State == rankagent.WindowFailed && ev.Window.ID == 0:
		c.incidentSnapshot(nil, ev.Reason)
		return
	case ev.Window.ID == 0:
		return
	}
	var res *pb.RankResult
	if ev.Upload != nil {
		res = resultOf(ev.Upload)
	}
	c.mu.Lock()
	// (a post-mortem's steps go to its own record: the window a post-mortem
	// interrupted goes on, and status answers keep saying where it stands)
	c.side.Observed(ev.Window.ID, ev.Window.Start, ev.Window.Stop, stepOf(ev.State), res)
	c.mu.Unlock()
	leader := c.cl.LeaderName()
	if res != nil && !c.reportsUploads() {
		c.rep.put(ev.Window.ID, res)
	}
	if leader == "" {
		return
	}
	env := c.cl.Envelope(ev.Window.ID)
	if res != nil {
		env.Body = &pb.Envelope_Result{Result: res}
	} else {
		env.Body = &pb.Envelope_Progress{Progress: &pb.Progress{State: stepOf(ev.State), Batch: ev.Batch, Reason: ev.Reason, Rank: c.rank()}}
	}
	reliable := ev.Upload != nil || window.Terminal(stepOf(ev.State)) || ev.State == rankagent.WindowPartial || ev.State == rankagent.WindowStopping
	c.cl.Post(leader, env, reliable)
}

// incidentStart records that the trainer hit an OOM or is being stopped, and asks
// the leader for a post-mortem of every rank.
func (c *Rank) incidentStart(kind pb.WindowKind, cause string, ev rankagent.WindowEvent) {
	at := ev.Time
	if at.IsZero() {
		at = time.Now()
	}
	c.mu.Lock()
	inc := c.inc
	if inc == nil || !inc.fresh(c.cfg.IncidentHold()) || inc.sent {
		inc = &incident{kind: kind, cause: cause, batch: ev.Batch, at: at}
		c.inc = inc
	} else if kind == pb.WindowKind_WINDOW_KIND_CRASH && inc.kind == pb.WindowKind_WINDOW_KIND_OOM {
		// an OOM the trainer did not survive: one incident, now a crash
		inc.kind, inc.cause = kind, cause
	}
	off := c.offset.offset
	c.mu.Unlock()
	what := "the trainer is being stopped; asking the leader for a crash post-mortem of every rank"
	if kind == pb.WindowKind_WINDOW_KIND_OOM {
		what = "the trainer hit an OOM; asking the leader for a post-mortem of every rank"
	}
	c.log.Warn(what, "cause", cause, "batch", ev.Batch)
	c.askPostmortem(inc, at.Add(-off))
}

// askPostmortem sends the incident to the leader (again, to a new leader).
func (c *Rank) askPostmortem(inc *incident, at time.Time) {
	leader := c.cl.LeaderName()
	c.mu.Lock()
	if leader == "" || inc.handedTo != 0 || inc.sent || inc.asked == leader {
		c.mu.Unlock()
		return
	}
	inc.asked, inc.askedAt = leader, time.Now()
	inc.seq = wire.NewSeq()
	req := &pb.SnapshotRequest{Kind: inc.kind, FailedRank: c.rank(), Cause: inc.cause, AtUs: at.UnixMicro(), Reason: inc.cause}
	if b := inc.batch; b >= 0 {
		req.Batch = &b
	}
	seq := inc.seq
	c.mu.Unlock()
	env := c.cl.Envelope(0)
	env.Seq = seq
	env.Body = &pb.Envelope_Request{Request: req}
	c.cl.Post(leader, env, true)
}

// IncidentAck takes the leader's answer to this rank's request for a
// post-mortem: a refusal (post-mortems are off, or the failure is part of one
// taken already) means no post-mortem will take this rank's snapshot, so the rank
// has nothing left to hand on. It reports whether env was that answer.
func (c *Rank) IncidentAck(env *pb.Envelope) bool {
	a := env.GetAck()
	c.mu.Lock()
	defer c.mu.Unlock()
	inc := c.inc
	if a == nil || inc == nil || env.Seq != inc.seq || env.Sender != inc.asked {
		return false
	}
	switch {
	case a.Ok || inc.handedTo != 0:
	case a.Code == pb.AckCode_ACK_BAD_REQUEST:
		// declined: post-mortems are off, or the failure is part of one taken
		inc.sent = true
		c.log.Info("no post-mortem takes this rank's snapshot", "why", a.Message)
	default:
		// not the leader (any more, or yet: its successor is taking over), or
		// a leader that cannot plan now: asked again, of whoever leads then
		inc.asked = ""
		c.log.Info("the post-mortem was not taken yet; asking again", "code", a.Code, "why", a.Message)
	}
	return true
}

// incidentSnapshot records the incident's snapshot once stored (r), or why there
// is none, and hands it to the post-mortem that asked for it.
func (c *Rank) incidentSnapshot(r *pb.RankResult, none string) {
	c.mu.Lock()
	inc := c.inc
	if inc == nil || !inc.fresh(c.cfg.IncidentHold()) {
		kind := pb.WindowKind_WINDOW_KIND_CRASH
		cause := ""
		if r != nil {
			cause = r.Cause
			if r.Reason == "oom" {
				kind, cause = pb.WindowKind_WINDOW_KIND_OOM, "out of memory"
			}
		}
		inc = &incident{kind: kind, at: time.Now(), cause: cause, batch: -1}
		c.inc = inc
	}
	var send *pb.RankResult
	if r != nil {
		inc.result = r
	} else if inc.result == nil {
		inc.noSnapshot = none
	}
	if inc.handedTo != 0 && !inc.sent {
		if inc.result != nil {
			send = proto.Clone(inc.result).(*pb.RankResult)
		} else {
			send = &pb.RankResult{Error: inc.noSnapshot, Reason: "crash", Cause: inc.cause}
		}
		inc.sent = true
		c.side.Handed(inc.handedTo, send, true) // (as it was sent: the post-mortem's leader has it)
	}
	window, leader := inc.handedTo, inc.leader
	c.mu.Unlock()
	if send != nil {
		c.sendResult(leader, window, send)
	}
}

// reportsUploads says whether the rank's agent writes the report of each upload
// into the run's log itself (rankagent's does, before its job ends): the
// coordinator then writes it no second time.
func (c *Rank) reportsUploads() bool {
	a, ok := c.rec.(interface{ ReportsUploads() bool })
	return ok && a.ReportsUploads()
}

// windowPart is a crash's snapshot as the rank's part of the window it was
// recording: the batches it covers, partial, with why.
func windowPart(u *rankagent.UploadResult) *rankagent.UploadResult {
	w := *u
	w.Window = rankagent.Window{ID: u.Window.ID, Start: u.Covers[0], Stop: u.Covers[1]}
	w.Partial = u.WindowPartial
	return &w
}

func resultOf(u *rankagent.UploadResult) *pb.RankResult {
	r := &pb.RankResult{Key: u.Key, MetaKey: u.MetaKey, AnalysisKey: u.AnalysisKey, Size: u.Size, Sha256: u.SHA256, Events: int64(u.Events),
		Partial: u.Partial, Start: u.Window.Start, Stop: u.Window.Stop, Reason: u.Reason, Cause: u.Cause}
	if u.Err != nil {
		r.Error = u.Err.Error()
	}
	return r
}

// --- clocks -------------------------------------------------------------------

// clockLoop measures this host's clock against the leader's: right after joining,
// whenever the leader changes, and every ClockInterval; a few probes, keeping the
// one with the shortest round trip.
func (c *Rank) ClockLoop(ctx context.Context, leaderChanged <-chan struct{}) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-leaderChanged:
		}
		c.measureClock(ctx)
		c.cl.UpdateMeta() // gossiped only when it changed: the trainer's GPU, say
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(c.cfg.ClockInterval)
	}
}

func (c *Rank) measureClock(ctx context.Context) {
	leader := c.cl.LeaderName()
	if leader == "" {
		return
	}
	if leader == c.cl.Name() {
		c.setOffset(0, 0)
		return
	}
	best := time.Duration(-1)
	var off time.Duration
	for i := 0; i < 5; i++ {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		t0 := c.cfg.Now()
		probe := c.cl.Envelope(0)
		probe.Body = &pb.Envelope_ClockProbe{ClockProbe: &pb.ClockProbe{T0Us: t0.UnixMicro()}}
		r, err := c.cl.Request(pctx, leader, probe, false)
		t1 := c.cfg.Now()
		cancel()
		if err != nil || r.GetClockReply() == nil || r.GetClockReply().T0Us != t0.UnixMicro() {
			continue
		}
		rtt := t1.Sub(t0)
		if best < 0 || rtt < best {
			mid := t0.Add(rtt / 2)
			best = rtt
			// this host's clock minus the leader's
			off = mid.Sub(time.UnixMicro(r.GetClockReply().TUs))
		}
	}
	if best >= 0 {
		c.setOffset(off, best)
	}
}

func (c *Rank) setOffset(off, rtt time.Duration) {
	c.mu.Lock()
	c.offset = clockState{offset: off, rtt: rtt, ok: true, at: time.Now()}
	c.mu.Unlock()
	if c.rec != nil {
		c.rec.SetClockOffset(off, rtt)
	}
}

// ReaskPostmortem asks a new leader for the post-mortem the old one never took.
func (c *Rank) ReaskPostmortem() {
	c.mu.Lock()
	inc := c.inc
	live := inc != nil && inc.fresh(c.cfg.IncidentHold()) && inc.handedTo == 0 && !inc.sent
	off := c.offset.offset
	c.mu.Unlock()
	if live {
		c.askPostmortem(inc, inc.at.Add(-off))
	}
}
