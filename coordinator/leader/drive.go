package leader

import (
	"context"
	"errors"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge"
)

// The leader runs a window by handing what happens to its state machine
// (coordinator/window) and carrying out the effects the machine returns: this
// file is that loop. The machine decides; nothing here decides a window's fate.

// step hands ev to w's state machine and carries out the effects.
func (l *Leader) step(ctx context.Context, w *win, ev window.Event) {
	l.exec(ctx, w, w.m.Step(ev))
}

// exec carries out effects in order. Effects that answer at once (a poll, a
// read of the log, a send that failed) step their answer before the next.
func (l *Leader) exec(ctx context.Context, w *win, fx []window.Effect) {
	for _, f := range fx {
		if ctx.Err() != nil {
			return
		}
		switch e := f.(type) {
		case window.Tell:
			l.tell(w, e.Rank, e.Step, e.Batch, e.Reason)
		case window.Send:
			if fs := l.send(w.cmd, e.Ranks); len(fs) > 0 {
				l.step(ctx, w, window.SendFailed{At: time.Now(), Unreachable: unreachableOf(fs)})
			}
		case window.Poll:
			l.step(ctx, w, window.Polled{At: time.Now(), Status: statusesOf(l.m.Status(ctx, e.Ranks), w.id())})
		case window.ReadLog:
			reps, ok := l.readReports(ctx, w.id(), e.Ranks)
			if ok && w.m.Postmortem() {
				ok = l.addIncidents(ctx, reps, e.Ranks, w.m.Planned, w.m.Deadline)
			}
			l.step(ctx, w, window.LogRead{At: time.Now(), Ranks: e.Ranks, Reports: reps, OK: ok})
		case window.CheckTerm:
			if latest, err := l.rl.LatestTerm(ctx); err == nil && latest > l.term {
				l.m.Believe(latest)
				l.step(ctx, w, window.Superseded{Term: latest})
			}
		case window.Replan:
			// (the machine's Exit says it; ended plans the window again)
		case window.Publish:
			l.publish(ctx, w, e.Ranks)
		case window.Complete:
			l.complete(ctx, w)
		case window.CommitFailure:
			l.commitFailure(ctx, w, e)
		case window.WriteOutcome:
			l.writeOutcome(ctx, w, e)
		case window.TellAnswer:
			if w.answer == nil {
				w.answer = l.resultOfCommit(ctx, w)
			}
			if w.answer != nil { // (the machine tells no answer of a window abandoned)
				l.tellAnswer(w.id(), w.watchers, w.answer)
			}
		case window.TellEnd:
			l.tellEnd(ctx, w)
		case window.Retry:
			w.retry = e.After
		case window.Defer:
			l.log.Error("the window is left unfinished for now", "window", w.id(), "why", e.Why)
			l.tellDeferred(w, e.Why)
		case window.StepDown:
			l.log.Warn("a newer leadership term is in the run's log; this leader writes nothing more for the window", "window", w.id(), "term", l.term, "newer", e.Term)
			l.m.BelieveTerm(ctx, l.rl)
		}
	}
}

// tellDeferred tells the members waiting for w what is true of a window left
// for later: its answer, with the rest pending and why, or that it is
// unfinished and why (never that it failed).
func (l *Leader) tellDeferred(w *win, why string) {
	if w.m.Quiet() {
		return
	}
	var res *pb.WindowResult
	if w.answer != nil {
		res = proto.Clone(w.answer).(*pb.WindowResult)
		res.Pending, res.Error = true, why
	} else {
		res = &pb.WindowResult{State: pb.Outcome_OUTCOME_UNFINISHED, Window: w.id(), Kind: w.m.Kind, Start: w.m.Start, Stop: w.m.Stop,
			Store: l.st.String(), Error: why, Missing: map[int32]string{}}
		for r, x := range w.m.MissingReasons() {
			res.Missing[int32(r)] = x
		}
	}
	l.tellResult(w.id(), w.watchers, res, false)
	w.watchers = nil
}

// drive carries the window on once its collection is over: it waits out the
// retries the machine asks for, until the window ends, is left for later, or
// the leader steps down.
func (l *Leader) drive(ctx context.Context, w *win) {
	for w.running() && ctx.Err() == nil && w.retry > 0 {
		d := w.retry
		w.retry = 0
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		l.step(ctx, w, window.RetryDue{At: time.Now()})
	}
}

// statusesOf is the ranks' status answers as the machine reads them.
func statusesOf(sts map[int]Status, id uint64) map[int]window.Status {
	out := make(map[int]window.Status, len(sts))
	for r, s := range sts {
		out[r] = window.Status{Window: s.St.Window, Step: s.St.State, Batch: s.St.Batch, Result: s.St.Result,
			Spooled: slices.Contains(s.St.Spooled, id), Term: s.St.Term, Seen: s.St.Seen}
	}
	return out
}

// collect hands the machine what happens while w is collected: the command
// going out, the ranks' acks, steps and results, requests that arrive meanwhile,
// and the leader's clock. It returns once the window is merged, or the machine
// stopped collecting.
func (l *Leader) collect(ctx context.Context, w *win, acks chan *pb.Envelope, sent <-chan []sendFailure) {
	c := l.m
	tick := time.NewTicker(min(l.cfg.StatusTimeout, 500*time.Millisecond))
	defer tick.Stop()
	flush := time.NewTicker(stepsEvery)
	defer flush.Stop()
	w.gather = true
	defer func() {
		w.gather = false
		l.flushSteps(w)
	}()
	defer func() {
		// the command has gone out to every rank before the window is given up,
		// planned again or merged: a cancel must not overtake it
		if sent != nil {
			select {
			case <-sent:
			case <-ctx.Done():
			}
		}
	}()
	isMember := func() func(int) bool {
		var nodes map[int]bool
		return func(r int) bool {
			if nodes == nil {
				nodes = map[int]bool{int(c.Rank()): true}
				for rk := range c.RankNodes() {
					nodes[rk] = true
				}
			}
			return nodes[r]
		}
	}
	collecting := func() bool {
		p := w.m.Phase
		return (p == window.Planned || p == window.Collecting) && w.running() && ctx.Err() == nil
	}
	if w.m.Phase == window.Collecting {
		l.step(ctx, w, window.Tick{At: time.Now(), IsMember: isMember()}) // taken over: what the log said may end it at once
	}
	for collecting() {
		select {
		case <-ctx.Done():
			return
		case <-flush.C:
			l.flushSteps(w)
		case fs := <-sent:
			sent = nil
			// at 1,024 ranks the plan takes a moment to go out: the ranks have
			// AckTimeout from the moment it has
			l.step(ctx, w, window.Sent{At: time.Now(), Unreachable: unreachableOf(fs)})
		case env := <-acks:
			if a := env.GetAck(); a != nil && env.WindowId == w.id() {
				l.step(ctx, w, window.Ack{Rank: int(env.SenderRank), Code: a.Code, Batch: a.Batch, Message: a.Message, Term: a.Term, At: time.Now()})
			}
			l.preload(ctx, w, int(env.SenderRank))
		case env := <-l.msgs:
			l.onMessage(ctx, w, env)
		case <-tick.C:
			l.step(ctx, w, window.Tick{At: time.Now(), IsMember: isMember()})
			for r := range w.m.Ranks {
				l.preload(ctx, w, r)
			}
		}
	}
}

// onMessage takes a message that reaches the leader while w is collected.
func (l *Leader) onMessage(ctx context.Context, w *win, env *pb.Envelope) {
	if env.GetRequest() != nil {
		if l.onRequestDuring(ctx, w, env) {
			// a post-mortem now, while the window goes on: every rank's state at
			// the failure, not when the window ends (in a synchronous job the
			// other ranks hang in their next collective)
			l.postmortem(ctx, env, w)
			if ctx.Err() == nil {
				l.unstash(ctx, w)
			}
		}
		return
	}
	switch {
	case env.WindowId == w.id():
		l.stepMessage(ctx, w, env)
		l.preload(ctx, w, int(env.SenderRank))
	case env.GetAck() != nil && env.GetAck().Code == pb.AckCode_ACK_STALE_TERM:
		l.step(ctx, w, window.Ack{Rank: int(env.SenderRank), Code: pb.AckCode_ACK_STALE_TERM, Term: env.GetAck().Term, At: time.Now()})
	case w.outer != nil && env.WindowId == w.outer.id() && len(w.outer.inbox) < maxInbox:
		w.outer.inbox = append(w.outer.inbox, env) // for the window this post-mortem interrupted
	case w.outer != nil && env.WindowId == w.outer.id() && len(w.outer.inbox) == maxInbox:
		w.outer.inbox = append(w.outer.inbox, nil) // (said once)
		l.log.Warn("too many messages for the window a post-mortem interrupted; the rest are left to its polls", "window", w.outer.id(), "kept", maxInbox)
	}
}

// stepMessage hands a rank's message about w to the machine.
func (l *Leader) stepMessage(ctx context.Context, w *win, env *pb.Envelope) {
	r, now := int(env.SenderRank), time.Now()
	switch b := env.Body.(type) {
	case *pb.Envelope_Ack:
		a := b.Ack
		l.step(ctx, w, window.Ack{Rank: r, Code: a.Code, Batch: a.Batch, Message: a.Message, Term: a.Term, At: now})
	case *pb.Envelope_Result:
		l.step(ctx, w, window.Stored{Rank: r, Result: b.Result, At: now})
	case *pb.Envelope_Progress:
		p := b.Progress
		l.step(ctx, w, window.Progress{Rank: r, Step: p.State, Batch: p.Batch, Reason: p.Reason, At: now})
	}
}

// maxInbox bounds the messages kept for a window a post-mortem interrupted (a
// rank's ack, progress and result: a few per rank).
const maxInbox = 1 << 16

// unstash hands w what arrived for it while a post-mortem interrupted it.
func (l *Leader) unstash(ctx context.Context, w *win) {
	in := w.inbox
	w.inbox = nil
	for _, env := range in {
		if env != nil {
			l.stepMessage(ctx, w, env)
		}
	}
}

// preloaders is how many ranks' sidecars and analyses a leader reads at once
// while it collects.
const preloaders = 16

// preload starts reading and parsing rank r's sidecar and analysis once its
// snapshot is stored, preloaders at a time, while the other ranks still record
// and upload: at 1,024 ranks the answer then waits for none of it (merge.Preload).
// What cannot be read now is read again when the window is merged.
func (l *Leader) preload(ctx context.Context, w *win, r int) {
	s := w.m.Ranks[r]
	if s == nil || w.pre[r] != nil || s.Phase != window.Uploaded || s.Result.MetaKey == "" || w.m.Dumps() ||
		s.Result.Partial != "" || s.Result.Start != w.m.Start || s.Result.Stop != w.m.Stop { // the merge leaves these out
		return
	}
	if w.preSem == nil {
		w.preSem = make(chan struct{}, preloaders)
	}
	ch, in, sem := make(chan merge.Input, 1), l.input(s.Result, r), w.preSem
	w.pre[r] = ch
	if !l.m.Spawn(func() {
		select {
		case sem <- struct{}{}:
			defer func() { <-sem }()
			in = merge.Preload(ctx, in)
		case <-ctx.Done():
		}
		ch <- in
	}) {
		ch <- in
	}
}

// readReports reads the given ranks' reports of window id from the run's log:
// a few one by one, more in one listing. ok is false when the log could not be
// read.
func (l *Leader) readReports(ctx context.Context, id uint64, ranks []int) (map[int]*pb.RankResult, bool) {
	out := map[int]*pb.RankResult{}
	if l.rl == nil || len(ranks) == 0 {
		return out, true
	}
	if len(ranks) <= 8 {
		ok := true
		for _, r := range ranks {
			rep, err := l.rl.Report(ctx, id, r)
			switch {
			case err == nil:
				out[r] = wire.ResultOfReport(rep)
			case !errors.Is(err, store.ErrNotFound):
				l.log.Warn("cannot read a rank's report from the run's log", "window", id, "of_rank", r, "err", err)
				ok = false
			}
		}
		return out, ok
	}
	reps, _, err := l.rl.Reports(ctx, id)
	if err != nil {
		l.log.Warn("cannot read the ranks' reports from the run's log", "window", id, "err", err)
		return out, false
	}
	for _, r := range ranks {
		if rep := reps[r]; rep != nil {
			out[r] = wire.ResultOfReport(rep)
		}
	}
	return out, true
}

// addIncidents adds to reps, for the ranks of a post-mortem planned at planned
// that have no report of it, the snapshot each stored of its own OOM or crash
// around then (the run's log keeps it as the rank's incident): a rank that died,
// or whose hand-over never reached a leader, is part of the post-mortem all the
// same. It reports false when the log could not be read.
func (l *Leader) addIncidents(ctx context.Context, reps map[int]*pb.RankResult, ranks []int, planned, deadline time.Time) bool {
	if l.rl == nil {
		return true
	}
	hold := l.cfg.IncidentHold()
	for _, r := range ranks {
		if reps[r] != nil {
			continue
		}
		incs, bad, err := l.rl.Incidents(ctx, r, planned.Add(-hold), deadline.Add(hold))
		if err != nil {
			l.log.Warn("cannot read a rank's incidents from the run's log", "of_rank", r, "err", err)
			return false
		}
		for _, e := range bad {
			l.log.Warn("a rank's incident in the run's log is malformed; ignored", "err", e)
		}
		if n := len(incs); n > 0 {
			reps[r] = wire.ResultOfReport(incs[n-1])
		}
	}
	return true
}
