package runlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/naming"
)

// claimed is the state of an outcome record that holds no outcome yet: the
// window's slot, taken by a term that took the window over.
const claimed = "claimed"

// ErrVoid: a window id given out whose plan its leader never wrote before a
// newer term took over; the id holds a void record, and the window never was.
var ErrVoid = errors.New("runlog: a window id given out and never planned")

// takeOver makes term the only one that can still write what older terms left
// open, before the head names it: the ids given out and never planned are
// voided, the unfinished windows' outcomes are claimed, and a schedule still
// valid is stamped with term. It returns the new head's Low.
func (l *Log) takeOver(ctx context.Context, h *Head, term uint64) (uint64, error) {
	ids, err := l.PlanIDs(ctx)
	if err != nil {
		return 0, err
	}
	for _, id := range unseen(h.Open, ids) {
		if err := l.void(ctx, id, h.Term, term); err != nil {
			return 0, err
		}
	}
	un, err := l.unfinishedIDs(ctx, h.Low)
	if err != nil {
		return 0, err
	}
	for _, id := range un {
		if err := l.claim(ctx, id, term); err != nil {
			return 0, err
		}
		if err := l.claimCommit(ctx, id, term); err != nil {
			return 0, err
		}
	}
	if err := l.restampSchedule(ctx, h.Term, term); err != nil {
		return 0, err
	}
	if len(un) > 0 {
		return min(un[0], h.Window+1), nil
	}
	return h.Window + 1, nil
}

// claimCommit claims window id's commit point (its manifest's key) for term,
// unless it holds a commit already (publish.ClaimCommit): a leader of an older
// term that checked its term before a commit and stalled cannot commit the
// window after term took it over. A plan that does not read, or names no
// manifest (an earlier version's), has none to claim.
func (l *Log) claimCommit(ctx context.Context, id, term uint64) error {
	p, err := l.ReadPlan(ctx, id)
	if errors.Is(err, ErrMalformed) || errors.Is(err, store.ErrNotFound) || err == nil && p.Manifest == "" {
		return nil
	}
	if err != nil {
		return err
	}
	err = publish.ClaimCommit(ctx, l.st, p.Manifest, term, id, p.WorldSize)
	if errors.Is(err, publish.ErrUnclaimable) || errors.Is(err, naming.ErrBadKey) {
		return nil // (no commit can be made there either: a problem of that window alone, never of every term)
	}
	return err
}

// void fills id, given out under old and never planned, with a void plan and a
// failed outcome, so that its leader's plan, written late, is refused. A plan
// found there was written in time: it is unfinished, not void.
func (l *Log) void(ctx context.Context, id, old, term uint64) error {
	why := fmt.Sprintf("window id given out under term %d and never planned before term %d took over", old, term)
	now := time.Now().UTC()
	p := Plan{Version: Version, ID: id, Term: term, Void: why, Created: now}
	err := l.put(ctx, l.PlanKey(id), p, store.PutOptions{})
	if errors.Is(err, store.ErrExists) {
		return nil
	}
	if err != nil {
		return err
	}
	return l.failVoid(ctx, id, term, why)
}

// failVoid stores the failed outcome of a void window id (once).
func (l *Log) failVoid(ctx context.Context, id, term uint64, why string) error {
	o := Outcome{Version: Version, ID: id, Term: term, State: Failed, Error: why, Ranks: []int{}, Finished: time.Now().UTC()}
	err := l.put(ctx, l.OutcomeKey(id), o, store.PutOptions{})
	if errors.Is(err, store.ErrExists) {
		return nil
	}
	return err
}

// claim takes window id's outcome slot for term: created as a claim where the
// window has no outcome, or a claim of an older term replaced (If-Match). An
// outcome already there is left as it is; a newer term's claim is
// ErrSuperseded.
func (l *Log) claim(ctx context.Context, id, term uint64) error {
	for try := 0; try < maxConflicts; try++ {
		cur, etag, err := l.readSlot(ctx, id)
		if errors.Is(err, ErrMalformed) {
			return nil // finished, as far as any reader can tell
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if err == nil && (cur.State != claimed || cur.Term == term) {
			return nil
		}
		if err == nil && cur.Term > term {
			return fmt.Errorf("%w: window %d is claimed by term %d", ErrSuperseded, id, cur.Term)
		}
		c := Outcome{Version: Version, ID: id, Term: term, State: claimed, Ranks: []int{}, Finished: time.Now().UTC()}
		err = l.put(ctx, l.OutcomeKey(id), c, store.PutOptions{IfMatch: etag})
		if err == nil {
			return nil
		}
		if !errors.Is(err, store.ErrExists) && !errors.Is(err, store.ErrChanged) {
			return err
		}
	}
	return ErrConflict
}

// readSlot reads window id's outcome record as stored, a claim included, with
// its version.
func (l *Log) readSlot(ctx context.Context, id uint64) (*Outcome, string, error) {
	b, info, err := l.readObject(ctx, l.OutcomeKey(id))
	if errors.Is(err, store.ErrTooLarge) {
		return nil, "", fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if err != nil {
		return nil, "", err
	}
	o, err := ParseOutcome(b)
	if err == nil && o.ID != id {
		err = fmt.Errorf("%w: %s names window %d", ErrMalformed, l.OutcomeKey(id), o.ID)
	}
	if err != nil {
		return nil, "", err
	}
	return o, info.ETag, nil
}

// unfinishedIDs lists the planned windows without an outcome, or whose
// outcome is a claim (only windows from low on may hold one), ascending.
func (l *Log) unfinishedIDs(ctx context.Context, low uint64) ([]uint64, error) {
	plans, err := l.PlanIDs(ctx)
	if err != nil {
		return nil, err
	}
	done, err := l.OutcomeIDs(ctx)
	if err != nil {
		return nil, err
	}
	finished := make(map[uint64]bool, len(done))
	for _, id := range done {
		finished[id] = true
	}
	var out []uint64
	for _, id := range plans {
		if finished[id] && id >= low {
			o, _, err := l.readSlot(ctx, id)
			switch {
			case errors.Is(err, store.ErrNotFound):
				finished[id] = false
			case err != nil && !errors.Is(err, ErrMalformed):
				return nil, err // a slot not read is not a slot finished
			case err == nil && o.State == claimed:
				finished[id] = false
			}
		}
		if !finished[id] {
			out = append(out, id)
		}
	}
	return out, nil
}

// restampSchedule stamps the schedule with term, where it is still valid (of
// term from or newer), so that a writer of an older term that read it finds it
// changed. A stale schedule is left for the current leader to replace.
func (l *Log) restampSchedule(ctx context.Context, from, term uint64) error {
	for try := 0; try < maxConflicts; try++ {
		b, info, err := l.readObject(ctx, l.ScheduleKey())
		if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrTooLarge) {
			return nil
		}
		if err != nil {
			return err
		}
		sc, err := parseSchedule(b)
		if err != nil || sc.Term < from || sc.Term >= term {
			return nil
		}
		sc.Term = term
		err = l.put(ctx, l.ScheduleKey(), sc, store.PutOptions{IfMatch: info.ETag})
		if !errors.Is(err, store.ErrChanged) {
			return err
		}
	}
	return ErrConflict
}
