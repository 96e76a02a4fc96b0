package coordinator

import (
	"context"
	"errors"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/runlog"
)

// A member believes a leadership term only once the run's log holds it: terms
// are taken by a conditional create in the store (runlog.NewTerm), so a term a
// message or a member's metadata claims is a hint, looked up in the log before
// it changes anything. A forged term (one message naming the leader with term
// 2^53) is then ignored, where believed it would make every member refuse the
// real leader for good. A command whose term is newer than the one believed is
// still obeyed when it comes from the member this one sees as leader: its term
// is looked up meanwhile.

// believe records t as a term the run's log holds; it reports whether it was newer.
func (c *Coordinator) believe(t uint64) bool {
	c.mu.Lock()
	newer := t > c.term
	if newer {
		c.term = t
	}
	c.mu.Unlock()
	if newer {
		c.termBumped()
	}
	return newer
}

// believeTerm believes the newest term in rl.
func (c *Coordinator) believeTerm(ctx context.Context, rl *runlog.Log) {
	if t, err := rl.LatestTerm(ctx); err == nil {
		c.believe(t)
	}
}

// claimTerm notes a term another member claims: it is looked up in the run's
// log (verifyTerms) and believed only if there.
func (c *Coordinator) claimTerm(t uint64) {
	c.mu.Lock()
	if t <= c.term || t <= c.claimed {
		c.mu.Unlock()
		return
	}
	c.claimed = t
	c.mu.Unlock()
	select {
	case c.claims <- struct{}{}:
	default:
	}
}

// claimRetry is how soon a claimed term is looked up again when the store could
// not say; claimEvery is the least time between two lookups.
const (
	claimRetry = 2 * time.Second
	claimEvery = time.Second
)

// verifyTerms looks up the terms other members claim, one at a time, and
// believes those the run's log holds.
func (c *Coordinator) verifyTerms(ctx context.Context) {
	var rl *runlog.Log
	defer func() {
		if rl != nil {
			rl.Store().Close()
		}
	}()
	var retry <-chan time.Time
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.claims:
		case <-retry:
		}
		retry = nil
		// one lookup a second at most: a member sending claim after claim
		// cannot make every member read the store as fast as it sends
		if d := time.Until(last.Add(claimEvery)); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		last = time.Now()
		c.mu.Lock()
		t, have := c.claimed, c.term
		c.mu.Unlock()
		if t <= have {
			continue
		}
		if rl == nil {
			octx, cancel := context.WithTimeout(ctx, 10*time.Second)
			st, err := c.cfg.OpenStore(octx)
			cancel()
			if err != nil {
				retry = time.After(claimRetry)
				continue
			}
			rl = runlog.New(st, c.cfg.Identity.RunName)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := rl.ReadTerm(rctx, t)
		cancel()
		switch {
		case err == nil:
			c.believe(t)
		case errors.Is(err, store.ErrNotFound) || errors.Is(err, runlog.ErrMalformed):
			c.refuseTerm(t)
			// a real newer term may be in the log all the same
			if latest, err := rl.LatestTerm(ctx); err == nil && latest < t {
				c.believe(latest)
			}
		default:
			if ctx.Err() == nil {
				retry = time.After(claimRetry)
			}
		}
	}
}

// refuseTerm forgets a claimed term the run's log does not hold.
func (c *Coordinator) refuseTerm(t uint64) {
	c.mu.Lock()
	if c.claimed == t {
		c.claimed = c.term
	}
	c.mu.Unlock()
	c.log.Warn("a member claims a leadership term the run's log does not hold; ignored", "term", t)
}
