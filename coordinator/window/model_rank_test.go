package window_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/runlog"
)

// oldRouting plays the uploader as it was before stored meant reported: the
// job left the spool once its snapshot was stored, the report of a window came
// later from the agent's memory (lost with the agent), and a crash's snapshot
// was never reported under the window it cut short. The model must fail with
// it (MEMSNAP_MODEL_OLD_ROUTING=1).
var oldRouting = os.Getenv("MEMSNAP_MODEL_OLD_ROUTING") != ""

// mjob is one upload job in a rank's spool: durable, it outlives the agent.
type mjob struct {
	key         string
	start, stop int64
	reason      string // "window" or "crash"
	partial     string
	stored      bool // job.json says its snapshot is in the store
}

// mrank is one rank as the model plays it: an agent beside a trainer.
type mrank struct {
	id       int
	took     bool // its agent has the window (in memory)
	refuse   pb.AckCode
	readyAt  time.Time // when its trainer's snapshot is taken (zero: never)
	recorded bool      // its trainer recorded the window (or part of it): its batch is past it
	dead     bool      // its agent is not running
	restarts bool      // a killed agent comes back (chosen when it is killed)
	gone     bool      // torn down: no member any more; its agent only drains its spool
	jobs     []*mjob   // its spool's pending jobs
	ended    []*mjob   // jobs that left the spool
	incident bool      // the first job's incident is written (the agent's memory)
	said     bool      // it told the leader its snapshot waits in its spool
	memory   *mjob     // oldRouting: a report the agent holds in memory
	result   *pb.RankResult
}

func (r *mrank) member() bool { return !r.dead && !r.gone }

// busy reports whether the rank has an upload step to take.
func (r *mrank) busy() bool { return !r.dead && (len(r.jobs) > 0 || r.memory != nil) }

// record spools what the trainer recorded of the window.
func (m *model) record(r *mrank, j *mjob) {
	r.recorded = true
	r.jobs = append(r.jobs, j)
	m.trace("rank %d spools its snapshot %s [%d, %d) %s", r.id, j.key, j.start, j.stop, j.partial)
}

// upload is one step of rank r's uploader: one store write, as rankagent's
// uploader makes them (storeObjects, then report; the job ends after the
// report). The store failing leaves the job for a later step.
func (m *model) upload(r *mrank) {
	ctx := context.Background()
	if r.memory != nil { // oldRouting: the report from memory
		j := r.memory
		if m.putReport(ctx, r, j) == nil {
			r.memory = nil
			m.trace("rank %d reports %s from memory", r.id, j.key)
		}
		return
	}
	j := r.jobs[0]
	var err error
	switch {
	case !j.stored:
		_, err = m.st.Put(ctx, j.key, bytes.NewReader([]byte(j.key)), store.PutOptions{Overwrite: true})
		if err == nil {
			j.stored = true
			m.trace("rank %d stores %s", r.id, j.key)
			if oldRouting {
				m.endJob(r, j)
				if j.reason == "window" {
					r.memory = j
				}
			}
		}
	case j.reason == "crash" && !r.incident:
		err = m.rl.PutIncident(ctx, m.reportOf(r, j, true))
		r.incident = err == nil
	default:
		if err = m.putReport(ctx, r, j); err == nil {
			m.trace("rank %d reports %s", r.id, j.key)
			m.endJob(r, j)
		}
	}
	if err != nil && !r.said && r.member() {
		r.said = true
		m.trace("rank %d: its snapshot waits in its spool (%v)", r.id, err)
		m.send(m.current().n, window.Progress{Rank: r.id, Step: pb.Step_STEP_SPOOLED, At: m.now, Reason: err.Error()})
	}
}

func (m *model) reportOf(r *mrank, j *mjob, incident bool) runlog.Report {
	rep := runlog.Report{Window: m.plan.ID, Rank: r.id, Key: j.key, Start: j.start, Stop: j.stop, Size: 1, Reason: j.reason, Partial: j.partial}
	if incident {
		rep.Start, rep.Stop, rep.Partial, rep.At = 0, 0, "", t0
	}
	return rep
}

func (m *model) putReport(ctx context.Context, r *mrank, j *mjob) error {
	return m.rl.PutReport(ctx, m.reportOf(r, j, false))
}

// endJob takes a job out of the spool; the agent tells the leader its result.
func (m *model) endJob(r *mrank, j *mjob) {
	r.jobs = r.jobs[1:]
	r.ended = append(r.ended, j)
	r.incident, r.said = false, false
	res := &pb.RankResult{Key: j.key, Start: j.start, Stop: j.stop, Size: 1, Partial: j.partial, Reason: j.reason}
	if r.member() {
		r.result = res
		m.send(m.current().n, window.Stored{Rank: r.id, Result: res, At: m.now})
	}
	if r.gone && !r.busy() {
		r.dead = true
		m.trace("rank %d's agent exits, its spool drained", r.id)
	}
}

// kill stops rank r's agent between two of its steps; whether it comes back
// is chosen now.
func (m *model) kill(r *mrank) {
	r.dead, r.restarts = true, m.rng.IntN(2) == 0
	m.trace("rank %d's agent is killed (it comes back: %v)", r.id, r.restarts)
}

// restart brings a killed agent back on the same spool: it remembers nothing
// of the window, and finishes the jobs its spool holds. After the teardown it
// is the next launch's agent: it drains the spool, and is no member.
func (m *model) restart(r *mrank) {
	r.dead, r.restarts, r.took, r.incident, r.said, r.memory = false, false, false, false, false, nil
	r.gone = m.torn
	m.trace("rank %d's agent restarts (%d jobs in its spool, torn down: %v)", r.id, len(r.jobs), r.gone)
	if r.gone && !r.busy() {
		r.dead = true
	}
}

// teardown is the launcher stopping the job: every live rank's trainer is
// stopped at once; one in the middle of the window dumps what it recorded
// (partial, its incident too), and every agent drains its spool, then exits.
func (m *model) teardown() {
	m.torn = true
	m.trace("the launcher tears the job down")
	for _, r := range m.ranks {
		if r.dead {
			continue
		}
		if r.took && !r.recorded {
			stop := int64(6 + m.rng.IntN(2))
			m.record(r, &mjob{key: fmt.Sprintf("%s/snapshots/rank%d.crash.pickle", modelRun, r.id), start: 5, stop: stop, reason: "crash",
				partial: fmt.Sprintf("the trainer was stopped at batch %d (crash)", stop)})
		}
		r.gone = true
		if !r.busy() {
			r.dead = true
		}
	}
}

// rankStep is one step of a rank, chosen at random: an upload step, its agent
// killed, or a killed agent back.
func (m *model) rankStep() {
	r := m.ranks[m.rng.IntN(len(m.ranks))]
	switch n := m.rng.IntN(20); {
	case n < 17 && r.busy():
		m.upload(r)
	case n == 17 && !r.dead:
		m.kill(r)
	case n >= 18 && r.dead && r.restarts:
		m.restart(r)
	}
}

// status is a rank's answer to a poll.
func (m *model) status(r *mrank) *window.Status {
	st := &window.Status{Batch: 4, Step: pb.Step_STEP_RECORDING}
	if r.recorded {
		st.Batch = 8
	}
	if r.took {
		st.Window, st.Seen = m.plan.ID, m.plan.ID
		if r.result != nil {
			st.Step, st.Result = pb.Step_STEP_UPLOADED, r.result
		}
	}
	st.Spooled = len(r.jobs) > 0
	return st
}
