// Package runlog is a run's log in the object store: the one place where the fate
// of every window is decided, because the store already gives the one primitive
// that survives restarts, partitions and stalls, a conditional write (of writers
// creating one name, or replacing one version, exactly one wins), as Delta Lake
// and Iceberg commit on S3.
//
// The log of run R lives under R/memsnap/ in the store the ranks upload to:
//
//	head.json                         the current term and the window ids given out (replaced with If-Match)
//	terms/term{T}.json                a leadership: who led from when (created once)
//	plans/window{ID}.json             a window planned by a leader, or a void id (created once)
//	reports/window{ID}/rank{R}.json   what rank R stored for that window
//	outcomes/window{ID}.json          how the window ended, or a claim on it (created once; a claim replaced with If-Match)
//	schedule.json                     where the run's schedule stands (created once, then replaced with If-Match)
//
// The fence holds between writers, not only at each writer's check: a store
// has no transaction over two objects, so every record a stale leader could
// still write is one the newer term conditions before the head names it. Taking
// a term voids the ids given out and never planned (a late plan is refused as
// existing), claims the outcome slot of every unfinished window (a late outcome
// finds the claim, of a newer term, and is refused), and stamps the schedule (a
// late replacement finds it changed); a window id is given out by replacing the
// head, which fails once a newer term replaced it. A schedule of a term older
// than the head's can only have been created after that term took over, so
// readers take none. Window ids and terms are unique over the run's whole life,
// across relaunches and partitions; a plan without an outcome is unfinished work
// that any leader finishes from the reports and the ranks that still live.
package runlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/memsnap/memsnap/internal/store"
)

// Version is the format version of every record.
const Version = 1

// maxRecord bounds how much of one record is read (a plan lists up to 65,536
// ranks; an outcome up to as many reasons, each at most MaxReason bytes).
const maxRecord = 16 << 20

// MaxReason and MaxError bound the text of one missing rank's reason and of an
// outcome's error, as written: longer ones are cut (a rank's reasons are its
// own words, and a rank that lies must not make the outcome unreadable).
const (
	MaxReason = 200
	MaxError  = 4096
)

// Cut shortens s to at most n bytes on a rune boundary, marking the cut.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n - len("…")
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// MaxID bounds window ids and terms, as the cluster's messages do.
const MaxID = uint64(1) << 53

// maxRanks bounds rank numbers, as the merge does.
const maxRanks = 1 << 16

// maxConflicts bounds how many times a create retries after another writer took
// the name it chose.
const maxConflicts = 64

// Kinds of windows.
const (
	KindWindow = "window" // batches recorded in lockstep (on demand or on a schedule)
	KindOOM    = "oom"    // an OOM post-mortem: every rank's state when one ran out of memory
	KindCrash  = "crash"  // a crash post-mortem: every rank's state when the job was stopped
	// KindTrigger: batches recorded in lockstep because a rank crossed a trigger
	// (too little headroom, too much growth), before an OOM
	KindTrigger = "trigger"
)

// States of a finished window.
const (
	Published = "published"
	Failed    = "failed"
)

var (
	// ErrMalformed wraps every refusal of a record read from the store.
	ErrMalformed = errors.New("runlog: malformed record")
	// ErrConflict: other writers kept taking the names a create chose.
	ErrConflict = errors.New("runlog: too many concurrent writers")
	// ErrSuperseded: the log holds a newer leadership term than the writer's: a
	// leader of an older term writes nothing more (it stalled, or was cut off).
	ErrSuperseded = errors.New("runlog: a newer leadership term exists")
)

// Fence returns an error wrapping ErrSuperseded when the log holds a term newer
// than term. A merge asks it before its claim and its manifest, so that a
// leader whose term was superseded stops at its next write; the log's own
// records are fenced by the head and the claims, which hold between writers.
func (l *Log) Fence(ctx context.Context, term uint64) error {
	h, _, err := l.readHead(ctx)
	if errors.Is(err, store.ErrNotFound) {
		h, err = &Head{}, nil
	}
	if err != nil {
		return err
	}
	return l.fenced(ctx, h, term)
}

// Root is the log's folder for run.
func Root(run string) string { return strings.TrimSuffix(run, "/") + "/memsnap/" }

// Term is one leadership.
type Term struct {
	Version int       `json:"version"`
	Term    uint64    `json:"term"`
	Leader  string    `json:"leader"` // the leader's member name
	Rank    int       `json:"rank"`
	Started time.Time `json:"started"`
}

// Plan is a window as its leader planned it.
type Plan struct {
	Version    int    `json:"version"`
	Run        string `json:"run"` // the run's name: the log is at <store>/<run>/memsnap/
	ID         uint64 `json:"window"`
	Term       uint64 `json:"term"`
	Leader     string `json:"leader"`
	LeaderRank int    `json:"leader_rank"`
	Kind       string `json:"kind"`
	Reason     string `json:"reason,omitempty"`
	// Start and Stop are the batches every rank records, [Start, Stop); zero for a
	// post-mortem, which has no batches.
	Start     int64 `json:"start"`
	Stop      int64 `json:"stop"`
	WorldSize int   `json:"world_size"`
	Ranks     []int `json:"ranks"` // the ranks asked to record it
	// Manifest is where the window's manifest goes once published (a key in the
	// store the log is in, relative to the store's root as the agents open it).
	Manifest string    `json:"manifest"`
	Created  time.Time `json:"created"`
	// Deadline is when the window should have ended; a leader that finds it
	// unfinished later finishes it from what the store holds.
	Deadline time.Time `json:"deadline"`
	// FailedRank and Cause name, for a post-mortem, the rank that failed first and
	// how (nil and "" otherwise).
	FailedRank *int   `json:"failed_rank,omitempty"`
	Cause      string `json:"cause,omitempty"`
	// Dump: every rank gives what its trainer holds when asked (its --record-always
	// history), as a post-mortem does, rather than recording planned batches; a
	// trigger window taken so has no batches.
	Dump bool `json:"dump,omitempty"`
	// Request names the request the window serves (the asking member and its
	// request's id), so a leader that finds it served already does not plan it again
	Request string `json:"request,omitempty"`
	// Agents names, by rank, the agent each rank asked had when the window was
	// planned (its own id, new at each start): a later leader never sends the
	// window to another agent of that rank that never heard of it (a later
	// launch of the run records other batches than the ones planned)
	Agents map[string]string `json:"agents,omitempty"`
	// Void, on a record under an id given out and never planned, says why: a
	// newer term filled the id so that the plan, written late, is refused.
	Void string `json:"void,omitempty"`
}

// Report is what one rank stored for one window.
type Report struct {
	Version     int       `json:"version"`
	Window      uint64    `json:"window"`
	Rank        int       `json:"rank"`
	Key         string    `json:"key,omitempty"`
	MetaKey     string    `json:"meta_key,omitempty"`
	AnalysisKey string    `json:"analysis_key,omitempty"`
	Size        int64     `json:"size"`
	SHA256      string    `json:"sha256,omitempty"`
	Events      int64     `json:"events"`
	Start       int64     `json:"start"`
	Stop        int64     `json:"stop"`
	Reason      string    `json:"reason,omitempty"`  // window, oom, postmortem, crash
	Partial     string    `json:"partial,omitempty"` // why it does not cover the window
	Error       string    `json:"error,omitempty"`   // why it could not be stored
	Cause       string    `json:"cause,omitempty"`   // for a crash: how the trainer stopped
	At          time.Time `json:"at"`
}

// Outcome is how a window ended.
type Outcome struct {
	Version  int               `json:"version"`
	ID       uint64            `json:"window"`
	Term     uint64            `json:"term"`
	Kind     string            `json:"kind"`
	State    string            `json:"state"`
	Manifest string            `json:"manifest,omitempty"` // the manifest's key, when published
	Error    string            `json:"error,omitempty"`    // why, when failed
	Ranks    []int             `json:"ranks"`              // the ranks merged
	Missing  map[string]string `json:"missing,omitempty"`  // rank -> why it is missing
	Leader   string            `json:"leader"`
	Finished time.Time         `json:"finished"`
}

// MissingOf is the missing ranks and why, as an Outcome keeps them (keyed by
// the rank's decimal number).
func MissingOf(m map[int]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for r, why := range m {
		out[strconv.Itoa(r)] = why
	}
	return out
}

// Schedule is where a run's schedule stands, so that a leader that starts
// later (restarted, or a relaunched job) neither repeats a once-only window nor
// loses its place on the grid.
type Schedule struct {
	Version int `json:"version"`
	// Next is the next scheduled window's start; -1 once a once-only schedule is done.
	Next int64     `json:"next"`
	Term uint64    `json:"term"`
	At   time.Time `json:"at"`
}

// Log is one run's log in a store.
type Log struct {
	st   store.Store
	root string
}

// New opens run's log in st (it reads and writes lazily).
func New(st store.Store, run string) *Log { return &Log{st: st, root: Root(run)} }

// Store is the store the log lives in.
func (l *Log) Store() store.Store { return l.st }

// TermKey, PlanKey, ReportKey and OutcomeKey name the log's records.
func (l *Log) TermKey(t uint64) string {
	return l.root + "terms/term" + strconv.FormatUint(t, 10) + ".json"
}
func (l *Log) PlanKey(id uint64) string {
	return l.root + "plans/window" + strconv.FormatUint(id, 10) + ".json"
}
func (l *Log) OutcomeKey(id uint64) string {
	return l.root + "outcomes/window" + strconv.FormatUint(id, 10) + ".json"
}
func (l *Log) reportsKey(id uint64) string {
	return l.root + "reports/window" + strconv.FormatUint(id, 10) + "/"
}
func (l *Log) ReportKey(id uint64, r int) string {
	return l.reportsKey(id) + "rank" + strconv.Itoa(r) + ".json"
}

// ids lists the numbers of the records under sub whose names are
// <stem><number>.json, ascending.
func (l *Log) ids(ctx context.Context, sub, stem string) ([]uint64, error) {
	objs, err := l.st.List(ctx, l.root+sub)
	if err != nil {
		return nil, err
	}
	var out []uint64
	for _, o := range objs {
		name := strings.TrimPrefix(o.Key, l.root+sub)
		if n, ok := parseName(name, stem); ok && n > 0 {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

// parseName reads <stem><number>.json, refusing anything else (leading zeros too,
// so one number has one name).
func parseName(name, stem string) (uint64, bool) {
	s, ok := strings.CutPrefix(name, stem)
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, ".json")
	if !ok || s == "" || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > MaxID {
		return 0, false
	}
	return n, true
}

// put stores v under key as opts say: once, replacing a version (IfMatch), or
// (a rank's report) replacing it.
func (l *Log) put(ctx context.Context, key string, v any, opts store.PutOptions) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	opts.Size, opts.ContentType = int64(len(b)), "application/json"
	_, err = l.st.Put(ctx, key, strings.NewReader(string(b)), opts)
	return err
}

// readObject reads key whole (bounded) with its version, again where it was
// replaced while being read.
func (l *Log) readObject(ctx context.Context, key string) ([]byte, store.ObjectInfo, error) {
	for try := 0; ; try++ {
		b, info, err := store.ReadObject(ctx, l.st, key, maxRecord)
		if !errors.Is(err, store.ErrChanged) || try == maxConflicts {
			return b, info, err
		}
	}
}

// read reads and parses the record under key into v (bounded).
func (l *Log) read(ctx context.Context, key string) ([]byte, error) {
	b, _, err := l.readObject(ctx, key)
	if errors.Is(err, store.ErrTooLarge) {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return b, err
}

// ScheduleKey names the schedule's record.
func (l *Log) ScheduleKey() string { return l.root + "schedule.json" }

// ReadSchedule reads where the run's schedule stands (store.ErrNotFound before
// any scheduled window, and where the schedule stored is a stale leader's: of a
// term older than the head's, written after that term took over).
func (l *Log) ReadSchedule(ctx context.Context) (*Schedule, error) {
	b, err := l.read(ctx, l.ScheduleKey())
	if err != nil {
		return nil, err
	}
	sc, err := parseSchedule(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, l.ScheduleKey())
	}
	h, _, err := l.readHead(ctx)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if err == nil && sc.Term < h.Term {
		return nil, fmt.Errorf("%w: %s is of term %d, written after term %d took over", store.ErrNotFound, l.ScheduleKey(), sc.Term, h.Term)
	}
	return sc, nil
}

// parseSchedule parses and checks a schedule.
func parseSchedule(b []byte) (*Schedule, error) {
	var sc Schedule
	if err := json.Unmarshal(b, &sc); err != nil || sc.Version != Version || sc.Next < -1 || sc.Term > MaxID {
		return nil, bad("schedule")
	}
	return &sc, nil
}

// PutSchedule records where the run's schedule stands, under the leader's term
// (ErrSuperseded when a newer one is in the log): created once, or replacing
// the version read (If-Match), never unconditionally.
func (l *Log) PutSchedule(ctx context.Context, sc Schedule) error {
	sc.Version = Version
	if sc.At.IsZero() {
		sc.At = time.Now().UTC()
	}
	for try := 0; try < maxConflicts; try++ {
		h, _, err := l.head(ctx)
		if err != nil {
			return err
		}
		if err := l.fenced(ctx, h, sc.Term); err != nil {
			return err
		}
		b, info, err := l.readObject(ctx, l.ScheduleKey())
		if err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrTooLarge) {
			return err
		}
		if err == nil {
			if cur, perr := parseSchedule(b); perr == nil && cur.Term > sc.Term {
				return fmt.Errorf("%w: the schedule is of term %d", ErrSuperseded, cur.Term)
			}
		}
		err = l.put(ctx, l.ScheduleKey(), sc, store.PutOptions{IfMatch: info.ETag})
		if !errors.Is(err, store.ErrExists) && !errors.Is(err, store.ErrChanged) {
			return err
		}
	}
	return ErrConflict
}

// Terms lists the terms in the log, ascending.
func (l *Log) Terms(ctx context.Context) ([]uint64, error) { return l.ids(ctx, "terms/", "term") }

// LatestTerm is the highest term in the log (0 when there is none): in its
// head or its term records.
func (l *Log) LatestTerm(ctx context.Context) (uint64, error) {
	h, _, err := l.readHead(ctx)
	if errors.Is(err, store.ErrNotFound) {
		h, err = &Head{}, nil
	}
	if err != nil {
		return 0, err
	}
	latest, err := l.listedTerm(ctx)
	return max(latest, h.Term), err
}

// listedTerm is the highest term record in the log (0 when there is none).
func (l *Log) listedTerm(ctx context.Context) (uint64, error) {
	ts, err := l.Terms(ctx)
	if err != nil || len(ts) == 0 {
		return 0, err
	}
	return ts[len(ts)-1], nil
}

// NewTerm creates the next term, newer than every term in the log and at least
// atLeast, for t's leader; it returns the record created. The term is taken
// once the head names it, after the term has voided, claimed and stamped what
// older terms left open (takeOver). A term whose head another writer replaced
// with a newer one first is returned as it is: superseded, it writes nothing.
func (l *Log) NewTerm(ctx context.Context, t Term, atLeast uint64) (Term, error) {
	t.Version = Version
	if t.Started.IsZero() {
		t.Started = time.Now().UTC()
	}
	if err := l.createTerm(ctx, &t, atLeast); err != nil {
		return Term{}, err
	}
	for try := 0; try < maxConflicts; try++ {
		h, etag, err := l.head(ctx)
		if err != nil {
			return Term{}, err
		}
		if h.Term >= t.Term {
			return t, nil
		}
		low, err := l.takeOver(ctx, h, t.Term)
		if errors.Is(err, ErrSuperseded) {
			return t, nil
		}
		if err != nil {
			return Term{}, err
		}
		nh := Head{Term: t.Term, Leader: t.Leader, Window: h.Window, Low: low}
		err = l.casHead(ctx, &nh, h, etag)
		if err == nil {
			return t, nil
		}
		if !errors.Is(err, store.ErrChanged) {
			return Term{}, err
		}
	}
	return Term{}, ErrConflict
}

// createTerm creates t's record under the next term, newer than the head's and
// every record's and at least atLeast (once: of two writers, one takes it).
func (l *Log) createTerm(ctx context.Context, t *Term, atLeast uint64) error {
	for try := 0; try < maxConflicts; try++ {
		latest, err := l.LatestTerm(ctx)
		if err != nil {
			return err
		}
		t.Term = max(latest+1, atLeast, 1)
		if t.Term > MaxID {
			return fmt.Errorf("runlog: term %d is past the largest allowed", t.Term)
		}
		err = l.put(ctx, l.TermKey(t.Term), t, store.PutOptions{})
		if !errors.Is(err, store.ErrExists) {
			return err
		}
	}
	return ErrConflict
}

// ReadTerm reads one term record.
func (l *Log) ReadTerm(ctx context.Context, term uint64) (*Term, error) {
	b, err := l.read(ctx, l.TermKey(term))
	if err != nil {
		return nil, err
	}
	return ParseTerm(b)
}

// PlanIDs lists the planned windows' ids, ascending.
func (l *Log) PlanIDs(ctx context.Context) ([]uint64, error) { return l.ids(ctx, "plans/", "window") }

// OutcomeIDs lists the finished windows' ids, ascending.
func (l *Log) OutcomeIDs(ctx context.Context) ([]uint64, error) {
	return l.ids(ctx, "outcomes/", "window")
}

// CreatePlan stores p under the next window id: newer than every plan in the log
// and at least atLeast. manifest, when not nil, names the window's manifest from
// its id. It returns the plan as stored, or ErrSuperseded when the log holds a
// term newer than p.Term. The id is given out by the head (allocate), then the
// plan is created under it: a newer term that took over first voided the id,
// and the plan is refused.
func (l *Log) CreatePlan(ctx context.Context, p Plan, atLeast uint64, manifest func(id uint64) (string, error)) (Plan, error) {
	p.Version = Version
	if p.Created.IsZero() {
		p.Created = time.Now().UTC()
	}
	for try := 0; try < maxConflicts; try++ {
		id, err := l.allocate(ctx, p.Term, atLeast)
		if err != nil {
			return Plan{}, err
		}
		p.ID = id
		if manifest != nil {
			if p.Manifest, err = manifest(p.ID); err != nil {
				return Plan{}, err
			}
		}
		err = l.put(ctx, l.PlanKey(p.ID), p, store.PutOptions{})
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, store.ErrExists) {
			return Plan{}, err
		}
		atLeast = p.ID + 1
	}
	return Plan{}, ErrConflict
}

// ReadPlan reads one plan.
func (l *Log) ReadPlan(ctx context.Context, id uint64) (*Plan, error) {
	b, err := l.read(ctx, l.PlanKey(id))
	if err != nil {
		return nil, err
	}
	p, err := ParsePlan(b)
	if err != nil {
		return nil, err
	}
	if p.ID != id {
		return nil, fmt.Errorf("%w: %s names window %d", ErrMalformed, l.PlanKey(id), p.ID)
	}
	if p.Void != "" {
		return nil, fmt.Errorf("%w: window %d: %w: %s", store.ErrNotFound, id, ErrVoid, p.Void)
	}
	return p, nil
}

// Latest reads the n newest plans (by id), newest first; a plan that does not
// read is left out.
func (l *Log) Latest(ctx context.Context, n int) ([]*Plan, error) {
	ids, err := l.PlanIDs(ctx)
	if err != nil {
		return nil, err
	}
	var out []*Plan
	for i := len(ids) - 1; i >= 0 && len(out) < n; i-- {
		if p, err := l.ReadPlan(ctx, ids[i]); err == nil {
			out = append(out, p)
		} else if !errors.Is(err, ErrMalformed) && !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
	}
	return out, nil
}

// NewestOf is the newest plan of one of kinds created after since (nil: none):
// the plans are read newest first, back past every plan of the time asked, so
// a cooldown or a quiet time is read whole however many windows came after the
// last of its kind. Plans are not in the order of their times (another
// leader's clock; a post-mortem of orphaned incidents dated by its oldest), so
// the walk ends only after olderRun plans in a row older than since, and the
// newest is the one created last, not the last planned. A plan dated more than
// Skew past this host's clock is passed over: its time cannot be judged here,
// and a cooldown or a quiet time from it would outlast its own length. A plan
// that does not read is passed over; a failed read of the log is an error.
func (l *Log) NewestOf(ctx context.Context, since time.Time, kinds ...string) (*Plan, error) {
	ahead := time.Now().Add(Skew)
	var newest *Plan
	older := 0
	err := l.Backwards(ctx, func(p *Plan) bool {
		switch {
		case p.Created.After(ahead):
			return true
		case !p.Created.After(since):
			older++
			return older < olderRun
		}
		older = 0
		if slices.Contains(kinds, p.Kind) && (newest == nil || p.Created.After(newest.Created)) {
			newest = p
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	return newest, nil
}

// Backwards hands each plan of the log to each, the last planned first, until
// each returns false. A plan that does not read (malformed, gone, an id never
// planned) is passed over; a failed read of the log is an error.
func (l *Log) Backwards(ctx context.Context, each func(*Plan) bool) error {
	ids, err := l.PlanIDs(ctx)
	if err != nil {
		return err
	}
	for i := len(ids) - 1; i >= 0; i-- {
		p, err := l.ReadPlan(ctx, ids[i])
		switch {
		case errors.Is(err, ErrMalformed) || errors.Is(err, store.ErrNotFound):
			continue
		case err != nil:
			return err
		}
		if !each(p) {
			return nil
		}
	}
	return nil
}

// Skew is how far past a reader's clock a record's time may be and still be
// taken as it says (hosts' clocks differ by that much at most; NTP keeps them
// within milliseconds).
const Skew = 10 * time.Second

// olderRun is how many plans in a row older than the time asked end NewestOf's
// walk.
const olderRun = 16

// Unfinished lists the plans without an outcome (or whose outcome slot a
// newer term claimed), oldest first. A plan that does not read, and an id
// voided and left without its outcome, is finished as failed, under term.
func (l *Log) Unfinished(ctx context.Context, term uint64) ([]*Plan, error) {
	low := MaxID + 1 // (a log with no head holds no claim)
	h, _, err := l.readHead(ctx)
	switch {
	case err == nil:
		low = h.Low
	case !errors.Is(err, store.ErrNotFound):
		return nil, err
	}
	ids, err := l.unfinishedIDs(ctx, low)
	if err != nil {
		return nil, err
	}
	var out []*Plan
	for _, id := range ids {
		p, err := l.ReadPlan(ctx, id)
		if errors.Is(err, ErrVoid) {
			if err := l.failVoid(ctx, id, term, err.Error()); err != nil {
				return nil, err
			}
			continue
		}
		if errors.Is(err, ErrMalformed) {
			// a record no leader can act on: it is finished as failed, with the reason
			o := Outcome{ID: id, Term: term, State: Failed, Error: err.Error()}
			if _, ferr := l.Finish(ctx, o); ferr != nil {
				return nil, ferr
			}
			continue
		}
		if errors.Is(err, store.ErrNotFound) {
			continue // removed since the listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// PutReport stores (or replaces) rank r's report for window r.Window.
func (l *Log) PutReport(ctx context.Context, r Report) error {
	r.prepare()
	if err := r.check(); err != nil {
		return err
	}
	return l.put(ctx, l.ReportKey(r.Window, r.Rank), r, store.PutOptions{Overwrite: true})
}

// Reports reads every rank's report for window id, by rank. A report that does not
// parse is left out (and named in the error list returned beside); a store that
// fails to read one is an error.
func (l *Log) Reports(ctx context.Context, id uint64) (map[int]*Report, []error, error) {
	objs, err := l.st.List(ctx, l.reportsKey(id))
	if err != nil {
		return nil, nil, err
	}
	out := map[int]*Report{}
	var bad []error
	for _, o := range objs {
		r, ok := parseName(strings.TrimPrefix(o.Key, l.reportsKey(id)), "rank")
		rank := int(r)
		if !ok || r >= maxRanks {
			continue
		}
		b, err := l.read(ctx, o.Key)
		if errors.Is(err, store.ErrNotFound) {
			continue // removed since the listing
		}
		if err != nil && !errors.Is(err, ErrMalformed) {
			return nil, nil, err // the store failed: a report not read is not a report absent
		}
		if err != nil {
			bad = append(bad, err)
			continue
		}
		rep, err := ParseReport(b)
		if err == nil && (rep.Window != id || rep.Rank != rank) {
			err = fmt.Errorf("%w: %s names window %d rank %d", ErrMalformed, o.Key, rep.Window, rep.Rank)
		}
		if err != nil {
			bad = append(bad, err)
			continue
		}
		out[rank] = rep
	}
	return out, bad, nil
}

// Report reads rank's report for window id (store.ErrNotFound when it has none).
func (l *Log) Report(ctx context.Context, id uint64, rank int) (*Report, error) {
	b, err := l.read(ctx, l.ReportKey(id, rank))
	if err != nil {
		return nil, err
	}
	rep, err := ParseReport(b)
	if err == nil && (rep.Window != id || rep.Rank != rank) {
		err = fmt.Errorf("%w: %s names window %d rank %d", ErrMalformed, l.ReportKey(id, rank), rep.Window, rep.Rank)
	}
	if err != nil {
		return nil, err
	}
	return rep, nil
}

// Finish stores how window o.ID ended, once: when another leader finished it
// first, Finish returns that outcome (and no error), which is the truth. The
// outcome is an index of the window's commit (its manifest), written after it.
// A leader whose term o.Term was superseded writes none (ErrSuperseded): the
// window's outcome slot is claimed by the newer term that took it over, or the
// window was planned by a newer term.
func (l *Log) Finish(ctx context.Context, o Outcome) (Outcome, error) {
	o.Version = Version
	if o.Finished.IsZero() {
		o.Finished = time.Now().UTC()
	}
	if o.Ranks == nil {
		o.Ranks = []int{}
	}
	o.Error = Cut(o.Error, MaxError)
	if len(o.Missing) > 0 {
		m := make(map[string]string, len(o.Missing))
		for k, v := range o.Missing {
			m[k] = Cut(v, MaxReason)
		}
		o.Missing = m
	}
	if err := l.Fence(ctx, o.Term); err != nil {
		return Outcome{}, err
	}
	p, err := l.ReadPlan(ctx, o.ID)
	switch {
	case err == nil && p.Term > o.Term:
		return Outcome{}, fmt.Errorf("%w: window %d was planned under term %d", ErrSuperseded, o.ID, p.Term)
	case err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, ErrMalformed):
		return Outcome{}, err
	}
	return l.finishSlot(ctx, o)
}

// finishSlot stores o in its window's outcome slot: created where there is
// none, or replacing a claim of o's term or an older one (If-Match).
func (l *Log) finishSlot(ctx context.Context, o Outcome) (Outcome, error) {
	for try := 0; try < maxConflicts; try++ {
		cur, etag, err := l.readSlot(ctx, o.ID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return Outcome{}, err
		}
		if err == nil && cur.State != claimed {
			return *cur, nil
		}
		if err == nil && cur.Term > o.Term {
			return Outcome{}, fmt.Errorf("%w: window %d was taken over by term %d", ErrSuperseded, o.ID, cur.Term)
		}
		err = l.put(ctx, l.OutcomeKey(o.ID), o, store.PutOptions{IfMatch: etag})
		if err == nil {
			return o, nil
		}
		if !errors.Is(err, store.ErrExists) && !errors.Is(err, store.ErrChanged) {
			return Outcome{}, err
		}
	}
	return Outcome{}, ErrConflict
}

// ReadOutcome reads how window id ended (store.ErrNotFound while it has not,
// its slot claimed by a leader that took it over included).
func (l *Log) ReadOutcome(ctx context.Context, id uint64) (*Outcome, error) {
	o, _, err := l.readSlot(ctx, id)
	if err != nil {
		return nil, err
	}
	if o.State == claimed {
		return nil, fmt.Errorf("%w: window %d is unfinished, taken over by term %d", store.ErrNotFound, id, o.Term)
	}
	return o, nil
}
