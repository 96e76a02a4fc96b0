package rankside

import (
	"context"
	"sync"
	"time"

	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/retry"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/runlog"
)

// reporter writes what this rank stored for each window into the run's log
// (runlog reports), so that a leader that starts later (after the old one died,
// or after the whole job was relaunched) can finish the window from the store
// alone. It runs on its own goroutine with a bounded queue, retries a store that
// is away with jittered backoff, and never blocks the caller.
type reporter struct {
	c    *Rank
	mu   sync.Mutex
	q    []runlog.Report
	busy bool
	wake chan struct{}
	log  *runlog.Log
}

const (
	maxReportQueue = 1024
	reportTries    = 12
)

func newReporter(c *Rank) *reporter { return &reporter{c: c, wake: make(chan struct{}, 1)} }

// put queues rank's result for window.
func (r *reporter) put(window uint64, res *pb.RankResult) {
	if window == 0 || (res.Key == "" && res.Error == "") || r.c.cfg.OpenStore == nil {
		return
	}
	rep := wire.ReportOf(window, r.c.cfg.Identity.Rank, res)
	r.mu.Lock()
	if len(r.q) < maxReportQueue {
		r.q = append(r.q, rep)
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *reporter) idle() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.q) == 0 && !r.busy
}

func (r *reporter) run(ctx context.Context) {
	defer func() {
		if r.log != nil {
			r.log.Store().Close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		}
		for {
			r.mu.Lock()
			if len(r.q) == 0 {
				r.mu.Unlock()
				break
			}
			rep := r.q[0]
			r.q = r.q[1:]
			r.busy = true
			r.mu.Unlock()
			r.write(ctx, rep)
			r.mu.Lock()
			r.busy = false
			r.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
		}
	}
}

// write stores one report, retrying a store that is away.
func (r *reporter) write(ctx context.Context, rep runlog.Report) {
	wait := retry.Backoff{Min: 200 * time.Millisecond, Max: 10 * time.Second}
	for try := 1; ; try++ {
		err := r.writeOnce(ctx, rep)
		if err == nil || ctx.Err() != nil {
			return
		}
		if store.Permanent(err) || try >= reportTries {
			r.c.log.Warn("could not write this rank's report into the run's log; the leader has it from the message", "window", rep.Window, "err", err)
			return
		}
		if !wait.Wait(ctx) {
			return
		}
	}
}

func (r *reporter) writeOnce(ctx context.Context, rep runlog.Report) error {
	if r.log == nil {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := r.c.cfg.OpenStore(octx)
		cancel()
		if err != nil {
			return err
		}
		r.log = runlog.New(st, r.c.cfg.Identity.RunName)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return r.log.PutReport(wctx, rep)
}
