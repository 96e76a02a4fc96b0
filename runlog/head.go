package runlog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/memsnap/memsnap/internal/store"
)

// maxOpen bounds how many window ids given out and not yet seen planned the
// head keeps (ids dropped past it are the oldest, of writers long failed).
const maxOpen = 256

// Head is the log's head: the current term and the window ids given out. Every
// term and every window id passes through it, and it is only ever replaced
// with If-Match on the version read, so of two writers that read one version
// one wins, and a leader whose term was superseded finds the head changed.
type Head struct {
	Version int    `json:"version"`
	Term    uint64 `json:"term"`
	Leader  string `json:"leader,omitempty"`
	// Window is the highest window id given out.
	Window uint64 `json:"window"`
	// Open are ids given out under Term whose plans were not yet seen; the next
	// term voids those still missing when it takes over.
	Open []uint64 `json:"open,omitempty"`
	// Low is the lowest window that may be unfinished: every window below it has
	// an outcome, and none of those outcomes is a claim.
	Low uint64 `json:"low"`
	// Seq counts the head's replacements.
	Seq uint64    `json:"seq"`
	At  time.Time `json:"at"`
}

// HeadKey names the head's record.
func (l *Log) HeadKey() string { return l.root + "head.json" }

// readHead reads the head and its version (store.ErrNotFound in a log that has
// none: one a previous version wrote, or a new one).
func (l *Log) readHead(ctx context.Context) (*Head, string, error) {
	b, info, err := l.readObject(ctx, l.HeadKey())
	if errors.Is(err, store.ErrTooLarge) {
		return nil, "", fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if err != nil {
		return nil, "", err
	}
	h, err := ParseHead(b)
	if err != nil {
		return nil, "", err
	}
	return h, info.ETag, nil
}

// head reads the head, creating it first in a log that has none, from what
// the log's listing says (created once: of two writers, one creates it).
func (l *Log) head(ctx context.Context) (*Head, string, error) {
	h, etag, err := l.readHead(ctx)
	if !errors.Is(err, store.ErrNotFound) {
		return h, etag, err
	}
	term, err := l.listedTerm(ctx)
	if err != nil {
		return nil, "", err
	}
	ids, err := l.PlanIDs(ctx)
	if err != nil {
		return nil, "", err
	}
	top, err := l.newestPlan(ctx, ids)
	if err != nil {
		return nil, "", err
	}
	if err := l.restampSchedule(ctx, 0, term); err != nil {
		return nil, "", err
	}
	h = &Head{Version: Version, Term: term, Window: top, Low: 1, At: time.Now().UTC()}
	if err := l.put(ctx, l.HeadKey(), h, store.PutOptions{}); err != nil && !errors.Is(err, store.ErrExists) {
		return nil, "", err
	}
	return l.readHead(ctx)
}

// casHead replaces the head read at version etag with h (store.ErrChanged
// when another writer replaced it first).
func (l *Log) casHead(ctx context.Context, h *Head, prev *Head, etag string) error {
	h.Version, h.Seq, h.At = Version, prev.Seq+1, time.Now().UTC()
	return l.put(ctx, l.HeadKey(), h, store.PutOptions{IfMatch: etag})
}

// newestPlan is the newest of the plans ids (ascending) that reads (a
// malformed object under plans/ is not one: an id past it is not taken for its
// name's sake), or 0.
func (l *Log) newestPlan(ctx context.Context, ids []uint64) (uint64, error) {
	for skip := 0; len(ids) > 0 && skip < 8; skip++ {
		_, err := l.ReadPlan(ctx, ids[len(ids)-1])
		if err == nil || errors.Is(err, store.ErrNotFound) {
			break
		}
		if !errors.Is(err, ErrMalformed) {
			return 0, err
		}
		ids = ids[:len(ids)-1]
	}
	if len(ids) == 0 {
		return 0, nil
	}
	return ids[len(ids)-1], nil
}

// allocate gives out the next window id under term: newer than every id
// given out and every plan listed, and at least atLeast. It refuses with
// ErrSuperseded once the head holds a newer term.
func (l *Log) allocate(ctx context.Context, term, atLeast uint64) (uint64, error) {
	for try := 0; try < maxConflicts; try++ {
		h, etag, err := l.head(ctx)
		if err != nil {
			return 0, err
		}
		if err := l.fenced(ctx, h, term); err != nil {
			return 0, err
		}
		ids, err := l.PlanIDs(ctx)
		if err != nil {
			return 0, err
		}
		top, err := l.newestPlan(ctx, ids)
		if err != nil {
			return 0, err
		}
		id := max(atLeast, 1, h.Window+1, top+1)
		if id > MaxID {
			return 0, fmt.Errorf("runlog: window id %d is past the largest allowed", id)
		}
		nh := *h
		nh.Window, nh.Open = id, append(unseen(h.Open, ids), id)
		if len(nh.Open) > maxOpen {
			nh.Open = nh.Open[len(nh.Open)-maxOpen:]
		}
		err = l.casHead(ctx, &nh, h, etag)
		if err == nil {
			return id, nil
		}
		if !errors.Is(err, store.ErrChanged) {
			return 0, err
		}
	}
	return 0, ErrConflict
}

// unseen is open less the ids listed.
func unseen(open, listed []uint64) []uint64 {
	var out []uint64
	for _, id := range open {
		if _, found := slices.BinarySearch(listed, id); !found {
			out = append(out, id)
		}
	}
	return out
}

// fenced refuses term when the head h or the terms listed hold a newer one.
func (l *Log) fenced(ctx context.Context, h *Head, term uint64) error {
	latest, err := l.listedTerm(ctx)
	if err != nil {
		return err
	}
	if latest = max(latest, h.Term); latest > term {
		return fmt.Errorf("%w: term %d, the run's log holds term %d", ErrSuperseded, term, latest)
	}
	return nil
}

// ParseHead parses and checks the head.
func ParseHead(b []byte) (*Head, error) {
	h, err := decodeRecord(b, "head", func(h *Head) int { return h.Version })
	if err != nil {
		return nil, err
	}
	switch {
	case h.Term > MaxID || h.Window > MaxID || h.Low > MaxID+1:
		return nil, bad("head of term %d, window %d", h.Term, h.Window)
	case len(h.Open) > maxOpen:
		return nil, bad("head with %d open windows", len(h.Open))
	}
	for _, id := range h.Open {
		if id == 0 || id > h.Window {
			return nil, bad("head with open window %d past window %d", id, h.Window)
		}
	}
	return h, checkText(h.Leader)
}
