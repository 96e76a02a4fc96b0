// Package commit finishes a run's windows from what the store alone holds: the
// plans, the ranks' reports and incidents in the run's log, and the snapshots
// they name. It is what `memsnap finish` runs when no agent is left to lead (the
// job was torn down before a new leader was elected): every rank that stored a
// recording of a window is merged, as partial where it says so, and the window
// is committed (its manifest) and its outcome written under a term of its own,
// which fences any leader that was still writing. Finish runs on its caller's
// goroutine and keeps no state between calls.
package commit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/naming"
	"github.com/memsnap/memsnap/runlog"
)

// IncidentSpan is how far before a post-mortem's plan, and after its deadline, a
// rank's incident counts as its part of the post-mortem.
const IncidentSpan = 2 * time.Minute

// Config says which run to finish.
type Config struct {
	// Store holds the run's snapshots and its log.
	Store store.Store
	// Run is the run's name: its log is at <store>/<run>/memsnap/.
	Run string
	// Windows, when not empty, are the only windows finished.
	Windows []uint64
	// Holder names who finishes, in the term it takes ("memsnap finish" when empty).
	Holder string
	// Force finishes windows whose planned deadline has not passed yet (a live
	// leader may still be recording them): only when their agents are known gone.
	Force bool
	// MergedName is the template of a window's merged outputs' names (the
	// agents' --merged-name), for a post-mortem planned here of the incidents no
	// post-mortem took; empty plans none.
	MergedName string
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
}

// Result is how one window was finished.
type Result struct {
	Window   uint64
	Kind     string
	State    string // runlog.Published or runlog.Failed
	Manifest string
	Ranks    []int          // the ranks merged
	Partial  map[int]string // merged ranks that recorded part of the window, and why
	Missing  map[int]string // ranks not merged, and why
	Error    string         // why it failed, or why it was left as it is
	// Left: the window was not finished (Error says why): it is still within
	// its deadline, or it could not be read or merged
	Left bool
}

// ErrNoLog: the store holds no log of the run (a wrong store, prefix or run name).
var ErrNoLog = errors.New("commit: no run's log there")

// ErrTakenOver: another leader or finisher took a newer term in the run's log
// while this one finished it; what it left is for that one to finish.
var ErrTakenOver = errors.New("commit: another leader or finisher took the run's log over")

// Unfinished lists the windows of the run that have a plan and no outcome,
// oldest first, without writing anything.
func Unfinished(ctx context.Context, st store.Store, run string) ([]uint64, error) {
	return runlog.New(st, run).UnfinishedIDs(ctx)
}

// Finish finishes the run's unfinished windows (or those of cfg.Windows) under a
// new term, and says how each ended. A window whose commit another writer made
// first ends as that commit says. A window that cannot be finished is left
// (Result.Left, with why) and the others are finished all the same; the error
// returned names every window left for an error.
func Finish(ctx context.Context, cfg Config) ([]Result, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	rl := runlog.New(cfg.Store, cfg.Run)
	ids, orphans, err := cfg.work(ctx, rl)
	if err != nil || (len(ids) == 0 && len(orphans) == 0) {
		return nil, err
	}
	term, err := rl.NewTerm(ctx, runlog.Term{Leader: cfg.Holder, Rank: -1}, 0)
	if err != nil {
		return nil, fmt.Errorf("commit: taking a term in the run's log: %w", err)
	}
	f := &finisher{cfg: cfg, rl: rl, term: term.Term, log: cfg.Logger.With("term", term.Term)}
	if len(orphans) > 0 {
		// again under this term: another finisher may have taken them meanwhile
		if orphans, err = Orphans(ctx, rl, time.Now()); err != nil {
			return nil, fmt.Errorf("commit: reading the run's incidents: %w", err)
		}
		if id, err := f.planPostmortem(ctx, orphans); err != nil {
			return nil, f.taken(fmt.Errorf("commit: planning a post-mortem of the incidents in the run's log: %w", err))
		} else if id != 0 {
			ids = append(ids, id)
		}
	}
	// the log's own list, now under this term: a void or malformed plan is
	// finished as failed there
	plans, err := rl.Unfinished(ctx, f.term)
	if err != nil {
		return nil, f.taken(fmt.Errorf("commit: reading the run's log: %w", err))
	}
	var out []Result
	var errs []error
	for _, p := range plans {
		if !slices.Contains(ids, p.ID) {
			continue
		}
		if !cfg.Force && time.Now().Before(p.Deadline) {
			out = append(out, Result{Window: p.ID, Kind: p.Kind, Manifest: p.Manifest, Left: true,
				Error: fmt.Sprintf("within its planned deadline (%s): a live leader may still be recording it; once the job's agents are gone, --force finishes it now",
					p.Deadline.UTC().Format(time.RFC3339))})
			continue
		}
		r, err := f.window(ctx, p)
		if errors.Is(err, runlog.ErrSuperseded) {
			return out, f.taken(err)
		}
		if err != nil {
			r = Result{Window: p.ID, Kind: p.Kind, Manifest: p.Manifest, Left: true, Error: err.Error()}
			errs = append(errs, fmt.Errorf("window %d: %w", p.ID, err))
		}
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}

// check fills cfg's defaults and refuses what cannot be right.
func (cfg *Config) check() error {
	if cfg.Store == nil {
		return errors.New("commit: no store")
	}
	if err := naming.CheckRunName(cfg.Run); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Holder == "" {
		cfg.Holder = "memsnap finish"
	}
	if cfg.MergedName == "" {
		return nil
	}
	if err := publish.CheckWindowName(cfg.MergedName); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// work is what there is to finish: the unfinished windows (of cfg.Windows) and,
// with a merged name to publish them under, the incidents no post-mortem took.
func (cfg *Config) work(ctx context.Context, rl *runlog.Log) ([]uint64, []*runlog.Report, error) {
	plans, err := rl.PlanIDs(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("commit: reading the run's log: %w", err)
	}
	incs, _, err := rl.AllIncidents(ctx, time.Time{}, time.Now())
	if err != nil {
		return nil, nil, fmt.Errorf("commit: reading the run's incidents: %w", err)
	}
	if len(plans) == 0 && len(incs) == 0 {
		return nil, nil, fmt.Errorf("%w: %s holds no plan and no incident of run %q", ErrNoLog, runlog.Root(cfg.Run), cfg.Run)
	}
	ids, err := rl.UnfinishedIDs(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("commit: reading the run's log: %w", err)
	}
	var orphans []*runlog.Report
	if len(cfg.Windows) > 0 {
		ids = slices.DeleteFunc(ids, func(id uint64) bool { return !slices.Contains(cfg.Windows, id) })
	} else if cfg.MergedName != "" && len(incs) > 0 {
		if orphans, err = Orphans(ctx, rl, time.Now()); err != nil {
			return nil, nil, fmt.Errorf("commit: reading the run's incidents: %w", err)
		}
	}
	return ids, orphans, nil
}

// taken says, of an error that a newer term caused, that another leader or
// finisher took the run's log over.
func (f *finisher) taken(err error) error {
	if errors.Is(err, runlog.ErrSuperseded) {
		return fmt.Errorf("%w (a newer term than this finisher's %d): what is left is its to finish; run memsnap finish again once it is done: %w", ErrTakenOver, f.term, err)
	}
	return err
}

type finisher struct {
	cfg  Config
	rl   *runlog.Log
	term uint64
	log  *slog.Logger
}

func (f *finisher) fence(ctx context.Context) error { return f.rl.Fence(ctx, f.term) }

// planPostmortem records the plan of a post-mortem of incidents no post-mortem
// took, for the world of the run's newest plan.
func (f *finisher) planPostmortem(ctx context.Context, incs []*runlog.Report) (uint64, error) {
	world := 0
	newest, err := f.rl.Latest(ctx, 1)
	switch {
	case err != nil:
		return 0, err
	case len(newest) == 1:
		// the run's world as its newest plan has it: an incident of a rank
		// outside it is no rank of this run's
		world = newest[0].WorldSize
		incs = slices.DeleteFunc(incs, func(in *runlog.Report) bool { return in.Rank >= world })
	default:
		for _, in := range incs {
			world = max(world, in.Rank+1)
		}
	}
	if len(incs) == 0 || world == 0 {
		return 0, nil
	}
	p := PostmortemPlan(incs, world)
	// (a plan names a leader's rank; the finisher is none, its name says so)
	p.Run, p.Term, p.Leader, p.LeaderRank = f.cfg.Run, f.term, f.cfg.Holder, 0
	pl, err := f.rl.CreatePlan(ctx, p, 0, func(id uint64) (string, error) {
		keys, err := publish.OutputKeys(f.cfg.MergedName, naming.Vars{"run_name": f.cfg.Run, "window": int64(id), "batch": int64(0), "world_size": world})
		return keys[publish.OutManifest], err
	})
	if err != nil {
		return 0, err
	}
	f.log.Info("planned a post-mortem of the incidents no post-mortem took", "window", pl.ID, "kind", pl.Kind, "incidents", len(incs))
	return pl.ID, nil
}

// window finishes one window from its plan, its commit if it has one, and the
// ranks' reports.
func (f *finisher) window(ctx context.Context, p *runlog.Plan) (Result, error) {
	res := Result{Window: p.ID, Kind: p.Kind, Manifest: p.Manifest, Missing: map[int]string{}, Partial: map[int]string{}}
	if p.Manifest != "" {
		m, err := publish.ReadManifest(ctx, f.cfg.Store, p.Manifest)
		switch {
		case err == nil && (m.Window == nil || m.Window.ID != p.ID):
			return Result{}, fmt.Errorf("%s, the window's manifest name, holds another window's manifest", p.Manifest)
		case err == nil:
			// committed, and its outcome never written: an answer whose pickle
			// and timeline were never written stays an answer (as a leader that
			// gives its detail up leaves it)
			return f.outcome(ctx, fromManifest(res, m))
		case !errors.Is(err, store.ErrNotFound):
			return Result{}, err
		}
	}
	inputs, err := f.inputs(ctx, p, &res)
	if err != nil {
		return Result{}, err
	}
	if len(inputs) == 0 {
		return f.fail(ctx, p, res, "no rank's snapshot of the window is in the run's log")
	}
	if p.Manifest == "" {
		return f.fail(ctx, p, res, "its plan names no manifest (an earlier version's): it cannot be published from the store alone")
	}
	return f.merge(ctx, p, res, inputs)
}

// inputs are the snapshots the log reports for p's ranks; the ranks without one
// go into res.Missing, those that recorded part of the window into res.Partial.
func (f *finisher) inputs(ctx context.Context, p *runlog.Plan, res *Result) ([]merge.Input, error) {
	reports, bad, err := f.rl.Reports(ctx, p.ID)
	if err != nil {
		return nil, err
	}
	for _, e := range bad {
		f.log.Warn("a rank's report in the run's log is malformed; ignored", "window", p.ID, "err", e)
	}
	post := p.Kind == runlog.KindOOM || p.Kind == runlog.KindCrash
	var ins []merge.Input
	for _, r := range p.Ranks {
		if r < 0 || r >= p.WorldSize {
			continue
		}
		rep := reports[r]
		if rep == nil && post {
			if rep, err = f.incident(ctx, p, r); err != nil {
				return nil, err
			}
		}
		switch {
		case rep == nil:
			res.Missing[r] = "no report of it in the run's log"
		case rep.Error != "" || rep.Key == "":
			res.Missing[r] = "its snapshot was not stored: " + rep.Error
		default:
			partial := partialOf(p, rep, post)
			if why, err := f.belongs(ctx, p, rep, r, post, partial != ""); err != nil {
				return nil, err
			} else if why != "" {
				res.Missing[r] = why
				f.log.Warn("a rank's report does not name its snapshot of the window; left out", "window", p.ID, "of_rank", r, "why", why)
				continue
			}
			if partial != "" {
				res.Partial[r] = partial
			}
			in := merge.StoreInput(f.cfg.Store, rep.Key, rep.MetaKey, r)
			if rep.AnalysisKey != "" {
				in = in.WithAnalysis(merge.StoreAnalysis(f.cfg.Store, rep.AnalysisKey))
			}
			ins = append(ins, in)
		}
	}
	return ins, nil
}

// belongs says why the snapshot rep names is not rank r's of window p ("" when
// it is): its size in the store is not the reported one, or its sidecar is
// another rank's, run's or window's. The log is no one's to trust blindly.
func (f *finisher) belongs(ctx context.Context, p *runlog.Plan, rep *runlog.Report, r int, post, partial bool) (string, error) {
	info, err := f.cfg.Store.Stat(ctx, rep.Key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return "its report names " + rep.Key + ", which the store lacks", nil
	case err != nil:
		return "", err
	case info.Size != rep.Size:
		return fmt.Sprintf("its snapshot %s is %d bytes in the store, its report says %d", rep.Key, info.Size, rep.Size), nil
	case rep.MetaKey == "":
		return "its report names no sidecar", nil
	}
	b, _, err := store.ReadObject(ctx, f.cfg.Store, rep.MetaKey, sidecar.MaxMetaBytes)
	if err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrTooLarge) {
		return "", err
	}
	if err != nil {
		return "its sidecar cannot be read: " + err.Error(), nil
	}
	m, err := sidecar.ParseRankMeta(b)
	if err != nil {
		return "its sidecar is malformed: " + err.Error(), nil
	}
	return m.Fits(r, f.cfg.Run, p.ID, p.Start, p.Stop, partial, post || p.Dump), nil
}

// incident is the snapshot rank r stored of its own OOM or crash around
// post-mortem p's time (nil when none).
func (f *finisher) incident(ctx context.Context, p *runlog.Plan, r int) (*runlog.Report, error) {
	incs, _, err := f.rl.Incidents(ctx, r, p.Created.Add(-IncidentSpan), p.Deadline.Add(IncidentSpan))
	if err != nil || len(incs) == 0 {
		return nil, err
	}
	return incs[len(incs)-1], nil
}

// partialOf says what a rank's report covers of window p and why, when that is
// not the whole window ("" when it is, and for a post-mortem's).
func partialOf(p *runlog.Plan, rep *runlog.Report, post bool) string {
	if post || p.Dump {
		return ""
	}
	if rep.Partial == "" && rep.Start == p.Start && rep.Stop == p.Stop {
		return ""
	}
	why := rep.Partial
	if why == "" {
		why = fmt.Sprintf("it covers [%d, %d), the window is [%d, %d)", rep.Start, rep.Stop, p.Start, p.Stop)
	}
	if rep.Stop <= rep.Start {
		return "no whole batch: " + why
	}
	return fmt.Sprintf("batches %d-%d: %s", rep.Start, rep.Stop-1, why)
}

// merge publishes p from inputs, under p's manifest and this finisher's term.
func (f *finisher) merge(ctx context.Context, p *runlog.Plan, res Result, inputs []merge.Input) (Result, error) {
	base, ok := strings.CutSuffix(p.Manifest, publish.OutSuffix[publish.OutManifest])
	if !ok || strings.ContainsAny(base, "{}") {
		return f.fail(ctx, p, res, "its plan's manifest name "+strconv.Quote(p.Manifest)+" is not a merge's")
	}
	cfg := merge.Config{Inputs: inputs, Out: f.cfg.Store, OutputBase: base, WorldSize: p.WorldSize, Align: merge.AlignOffsets,
		Title:  fmt.Sprintf("%s, %s %d (finished from the store)", f.cfg.Run, p.Kind, p.ID),
		Window: &sidecar.WindowInfo{ID: p.ID, Start: p.Start, Stop: p.Stop}, MissingReasons: res.Missing, Partial: res.Partial,
		Reason: p.Reason, Kind: p.Kind, FromAnalyses: true, Supersede: true, Attempt: publish.AttemptOf(f.term),
		Fence: f.fence, Logger: f.log.With("window", p.ID)}
	if p.FailedRank != nil && (p.Kind == runlog.KindOOM || p.Kind == runlog.KindCrash) {
		cfg.Focus = &analysis.Focus{Rank: *p.FailedRank, Why: "failed first: " + p.Cause}
		cfg.Reason = fmt.Sprintf("%s post-mortem: rank %d failed first (%s)", p.Kind, *p.FailedRank, p.Cause)
	}
	out, err := merge.Merge(ctx, cfg)
	for ie := (*merge.InputError)(nil); errors.As(err, &ie) && ie.Rank >= 0 && len(cfg.Inputs) > 1 && ctx.Err() == nil; {
		// a snapshot that cannot be merged (it does not decode, say): the
		// window is published without it, its reason named
		f.log.Warn("a rank's snapshot cannot be merged; merging without it", "window", p.ID, "of_rank", ie.Rank, "err", err)
		res.Missing[ie.Rank] = "its snapshot cannot be merged: " + ie.Err.Error()
		delete(res.Partial, ie.Rank)
		cfg.Inputs = slices.DeleteFunc(cfg.Inputs, func(in merge.Input) bool { return in.Rank == ie.Rank })
		out, err = merge.Merge(ctx, cfg)
	}
	if errors.Is(err, runlog.ErrSuperseded) {
		return Result{}, err
	}
	if err != nil {
		if m, rerr := publish.ReadManifest(ctx, f.cfg.Store, p.Manifest); rerr == nil {
			return f.outcome(ctx, fromManifest(res, m)) // another writer committed it first
		}
		return Result{}, err
	}
	return f.outcome(ctx, fromManifest(res, out.Manifest))
}

// fail commits p as failed, for why.
func (f *finisher) fail(ctx context.Context, p *runlog.Plan, res Result, why string) (Result, error) {
	res.State, res.Error = runlog.Failed, why
	if p.Manifest == "" {
		return f.outcome(ctx, res)
	}
	fw := publish.FailedWindow{Error: why, WorldSize: p.WorldSize, MissingReasons: res.Missing, Reason: p.Reason, Kind: p.Kind,
		Attempt: publish.AttemptOf(f.term), Window: &sidecar.WindowInfo{ID: p.ID, Start: p.Start, Stop: p.Stop}}
	held, err := publish.CommitFailed(ctx, f.cfg.Store, p.Manifest, fw, f.fence)
	if err != nil {
		return Result{}, err
	}
	return f.outcome(ctx, fromManifest(res, held))
}

// fromManifest is res as the window's commit m says it ended.
func fromManifest(res Result, m *publish.Manifest) Result {
	if m.Failed() {
		res.State, res.Error, res.Ranks = runlog.Failed, m.Error, nil
		return res
	}
	res.State, res.Error, res.Ranks = runlog.Published, "", append([]int(nil), m.RanksMerged...)
	if len(m.Pending) > 0 {
		res.Error = "its answer only: its " + strings.Join(m.Pending, " and ") + " were never written"
	}
	for k, why := range m.MissingReasons {
		if r, err := strconv.Atoi(k); err == nil {
			res.Missing[r] = why
		}
	}
	return res
}

// outcome writes how the window ended into the run's log; the outcome another
// writer wrote first is the truth.
func (f *finisher) outcome(ctx context.Context, res Result) (Result, error) {
	o := runlog.Outcome{ID: res.Window, Term: f.term, Kind: res.Kind, State: res.State, Error: res.Error, Ranks: res.Ranks,
		Missing: runlog.MissingOf(res.Missing), Leader: f.cfg.Holder}
	if res.State == runlog.Published {
		o.Manifest = res.Manifest
	}
	got, err := f.rl.Finish(ctx, o)
	if err != nil {
		return Result{}, err
	}
	if got.Term != f.term {
		res.State, res.Error = got.State, got.Error
	}
	f.log.Info("window finished", "window", res.Window, "state", res.State, "ranks", len(res.Ranks), "partial", len(res.Partial), "missing", len(res.Missing))
	return res, nil
}
