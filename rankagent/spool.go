package rankagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/memsnap/memsnap/internal/retry"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/runlog"
)

// The spool is a local folder (owner-only) that holds every snapshot until the
// store has it:
//
//	incoming/       the hook writes finished snapshots here: NAME.pickle, and beside
//	                it NAME.json, the snapshot message, so an agent that starts later
//	                can adopt the file even if it never heard of it
//	pending/<job>/  snapshot.pickle, meta.json and job.json, waiting for upload
//	failed/<job>/   jobs that can never be uploaded as they are (an existing object,
//	                a name the store refuses, a corrupt file), with error.txt
//
// A job is created under a hidden name and renamed into pending/ once complete, so
// a crash never leaves half a job there; an agent that restarts uploads what
// pending/ holds and adopts what incoming/ holds. Nothing is deleted before the
// store has confirmed it.
type spool struct {
	root string
}

// job is job.json: what to upload and where.
type job struct {
	Key       string    `json:"key"`
	MetaKey   string    `json:"meta_key"`
	SHA256    string    `json:"sha256"`
	Size      int64     `json:"size"`
	Events    int       `json:"events"`
	Overwrite bool      `json:"overwrite"`
	Created   time.Time `json:"created"`
	Window    uint64    `json:"window"`
	Start     int64     `json:"start"`
	Stop      int64     `json:"stop"`
	Reason    string    `json:"reason,omitempty"`  // "window", "oom", "postmortem" or "crash"
	Partial   string    `json:"partial,omitempty"` // why the snapshot does not cover the whole window
	Cause     string    `json:"cause,omitempty"`   // a crash: how the trainer was stopped
	// Renamed says the snapshot's own name was taken by another object (a job
	// relaunched under the same run name recorded the same batches), so Key is
	// that name with ".window<id>" before ".pickle"
	Renamed bool `json:"renamed,omitempty"`
	Rank    int  `json:"rank"`
	// AnalysisKey is where the rank's analysis of its snapshot goes ("" for none)
	AnalysisKey string `json:"analysis_key,omitempty"`
	// Covers and WindowPartial are, for a crash in the middle of window Window,
	// the batches its recording covers, [first, last+1), and why it is partial:
	// the rank's report of that window says so
	Covers        []int64 `json:"covers,omitempty"`
	WindowPartial string  `json:"window_partial,omitempty"`
	// Stored says the snapshot, its sidecar and its analysis are in the store;
	// the job ends once its report is in the run's log too
	Stored bool `json:"stored,omitempty"`
}

func openSpool(root string) (*spool, error) {
	if err := privateDir(root); err != nil {
		return nil, fmt.Errorf("rankagent: spool: %w", err)
	}
	for _, d := range []string{"incoming", "pending", "failed"} {
		if err := privateDir(filepath.Join(root, d)); err != nil {
			return nil, fmt.Errorf("rankagent: spool: %w", err)
		}
	}
	return &spool{root: root}, nil
}

func (s *spool) incoming() string { return filepath.Join(s.root, "incoming") }

// lock takes the spool for this agent alone (an exclusive lock on its lock
// file, which the system releases when the process ends): two agents on one
// spool would upload each other's jobs as their own rank's.
func (s *spool) lock() (unlock func(), err error) {
	p := filepath.Join(s.root, "lock")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("rankagent: spool: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("rankagent: the spool %s is in use by another agent (give each agent a spool of its own: --spool)", s.root)
		}
		return nil, fmt.Errorf("rankagent: locking the spool %s: %w", s.root, err)
	}
	return func() { f.Close() }, nil
}

// incomingFile resolves a name the hook sent, refusing anything but a regular file
// directly inside incoming/.
func (s *spool) incomingFile(name string) (string, error) {
	if err := checkSpoolName(name); err != nil {
		return "", err
	}
	p := filepath.Join(s.incoming(), name)
	st, err := os.Lstat(p)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", name)
	}
	return p, nil
}

// companion is the path of the snapshot message the hook writes beside NAME.pickle.
func companion(pickle string) string { return strings.TrimSuffix(pickle, ".pickle") + ".json" }

// incomingSnapshots lists the complete snapshots waiting in incoming/, oldest first
// (hidden files are still being written).
func (s *spool) incomingSnapshots() []string {
	ents, _ := os.ReadDir(s.incoming())
	type f struct {
		name string
		t    time.Time
	}
	var fs []f
	for _, e := range ents {
		if checkSpoolName(e.Name()) != nil || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		fs = append(fs, f{e.Name(), info.ModTime()})
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].t.Before(fs[j].t) })
	out := make([]string, len(fs))
	for i, x := range fs {
		out[i] = x.name
	}
	return out
}

// incomingMessage reads the snapshot message the hook left beside name, or returns
// nil when there is none.
func (s *spool) incomingMessage(name string) *Message {
	f, err := os.Open(companion(filepath.Join(s.incoming(), name)))
	if err != nil {
		return nil
	}
	defer f.Close()
	b, err := store.ReadLimited(f, name, MaxMessageFile)
	if err != nil {
		return nil
	}
	m, err := ParseMessageFile(b)
	if err != nil || m.Type != "snapshot" || m.File != name {
		return nil
	}
	return m
}

func writeFileSync(p string, b []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func jobID(rank int, window uint64) string {
	return fmt.Sprintf("r%d-w%d-%d", rank, window, time.Now().UnixNano())
}

// addJob moves a finished snapshot from incoming/ into a new pending job.
// jobWrite writes a job's files (a unit test makes it fail as a full disk does).
var jobWrite = writeFileSync

func (s *spool) addJob(src string, j job, meta, analysis []byte) (string, error) {
	id := jobID(j.Rank, j.Window)
	tmp := filepath.Join(s.root, "pending", ".tmp-"+id)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return "", err
	}
	if err := jobWrite(filepath.Join(tmp, "meta.json"), meta); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if analysis != nil {
		if err := jobWrite(filepath.Join(tmp, "analysis.json"), analysis); err != nil {
			os.RemoveAll(tmp)
			return "", err
		}
	}
	jb, _ := json.MarshalIndent(j, "", "  ")
	if err := jobWrite(filepath.Join(tmp, "job.json"), jb); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	// the snapshot moves last: until then, a crash leaves it in incoming/ to adopt
	if err := os.Rename(src, filepath.Join(tmp, "snapshot.pickle")); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if err := os.Rename(tmp, filepath.Join(s.root, "pending", id)); err != nil {
		return "", err
	}
	os.Remove(companion(src))
	return id, nil
}

// writeReason writes why a job failed into its folder's error.txt, whole or not
// at all (a full disk leaves no empty error.txt: the log said why).
func writeReason(dir string, why error) {
	tmp := filepath.Join(dir, ".error.txt")
	if err := writeFileSync(tmp, []byte(why.Error()+"\n")); err != nil {
		os.Remove(tmp)
		return
	}
	os.Rename(tmp, filepath.Join(dir, "error.txt"))
}

// reject moves a snapshot from incoming/ that can never be uploaded (it does not
// decode, say) into failed/ with the reason, so it is kept for a person to look at
// and not adopted again.
func (s *spool) reject(src string, rank int, window uint64, reason error) (string, error) {
	id := jobID(rank, window)
	dir := filepath.Join(s.root, "failed", id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	if err := os.Rename(src, filepath.Join(dir, "snapshot.pickle")); err != nil {
		return "", err
	}
	os.Rename(companion(src), filepath.Join(dir, "message.json"))
	writeReason(dir, reason)
	return dir, nil
}

// recover finishes jobs a crash left under their hidden names. A hidden job holds
// its snapshot only once job.json is written, so it is complete then; one without
// job.json never took its snapshot out of incoming/, and is removed.
func (s *spool) recover(log *slog.Logger) {
	ents, _ := os.ReadDir(filepath.Join(s.root, "pending"))
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ".tmp-") {
			continue
		}
		dir := filepath.Join(s.root, "pending", e.Name())
		if _, err := os.Stat(filepath.Join(dir, "snapshot.pickle")); err == nil {
			if err := os.Rename(dir, filepath.Join(s.root, "pending", strings.TrimPrefix(e.Name(), ".tmp-"))); err != nil {
				log.Warn("an interrupted spool job could not be finished", "dir", dir, "err", err)
			}
			continue
		}
		os.RemoveAll(dir)
	}
}

// pendingJobs lists the jobs waiting for upload, oldest first.
func (s *spool) pendingJobs() []string {
	return s.jobs("pending")
}

// failedJobs lists the jobs kept in failed/.
func (s *spool) failedJobs() []string {
	return s.jobs("failed")
}

func (s *spool) jobs(sub string) []string {
	ents, _ := os.ReadDir(filepath.Join(s.root, sub))
	var out []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// uploader uploads pending jobs. A job that fails for good goes to failed/ at once;
// one that fails for now is retried with jittered backoff of its own, so one failing
// job never holds up the others.
type uploader struct {
	sp       *spool
	runName  string // the run's name: its log is where each job's report goes
	open     func(context.Context) (store.Store, error)
	log      *slog.Logger
	minWait  time.Duration
	maxWait  time.Duration
	wake     chan struct{}
	onResult func(UploadResult)
	onRetry  func(UploadResult, error) // a job's first failed attempt, to be retried

	mu    sync.Mutex
	st    store.Store
	busy  bool
	tries map[string]*attempts
	stats uploadStats
}

// attempts is one job's backoff state.
type attempts struct {
	attempts int
	next     time.Time
}

// UploadResult reports one finished upload (or a job that failed for good).
type UploadResult struct {
	Key         string
	MetaKey     string
	AnalysisKey string // the rank's analysis of the snapshot ("" when there is none)
	Size        int64
	SHA256      string
	Events      int
	Window      Window
	Reason      string // "window", "oom", "postmortem" or "crash"
	Partial     string // why the snapshot does not cover its whole window ("" when it does)
	Cause       string // a crash: how the trainer was stopped
	Err         error  // set when the job failed for good; the snapshot is in the spool's failed/
	// Covers and WindowPartial are, for a crash in the middle of window
	// Window.ID, the batches its recording covers and why it is partial (the
	// rank's part of that window)
	Covers        []int64
	WindowPartial string
}

type uploadStats struct {
	uploaded, failed, retries int
}

// errSpoolCorrupt: a spooled file no longer has the checksum it was spooled with.
var errSpoolCorrupt = errors.New("rankagent: the spooled snapshot changed on disk")

// permanent reports whether retrying an upload cannot help: the store refuses the
// job for good, or the spooled files themselves are broken.
func permanent(err error) bool {
	var rep *reportError
	if errors.As(err, &rep) {
		return false // (the snapshot is stored: its report is written once the log takes it, however long)
	}
	return store.Permanent(err) || errors.Is(err, errSpoolCorrupt)
}

// reportError: a job's snapshot is stored and its report is not in the run's
// log yet. It is always retried, whatever the store said (an access denied can
// be credentials that expired and are renewed), and the window is never told
// the snapshot was not stored.
type reportError struct{ err error }

func (e *reportError) Error() string {
	return "the snapshot is stored, but its report is not in the run's log yet (retried): " + e.err.Error()
}
func (e *reportError) Unwrap() error { return e.err }

func (u *uploader) kick() {
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

func (u *uploader) store(ctx context.Context) (store.Store, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.st != nil {
		return u.st, nil
	}
	st, err := u.open(ctx)
	if err != nil {
		return nil, err
	}
	u.st = st
	return st, nil
}

func (u *uploader) run(ctx context.Context) {
	for {
		next := u.drain(ctx)
		var timer *time.Timer
		var t <-chan time.Time
		if !next.IsZero() {
			timer = time.NewTimer(max(time.Until(next), time.Millisecond))
			t = timer.C
		}
		select {
		case <-ctx.Done():
		case <-u.wake:
		case <-t:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// backoff is the wait before attempt n+1: doubling from minWait up to maxWait, with
// jitter, so agents that lost one store do not all come back at once.
func (u *uploader) backoff(attempts int) time.Duration {
	return retry.After(attempts, u.minWait, u.maxWait)
}

// drain tries every pending job that is due; it returns when the next one is due
// (zero when none waits).
func (u *uploader) drain(ctx context.Context) time.Time {
	u.mu.Lock()
	u.busy = true
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		u.busy = false
		u.mu.Unlock()
	}()
	var next time.Time
	ids := u.sp.pendingJobs()
	live := map[string]bool{}
	for _, id := range ids {
		live[id] = true
	}
	u.mu.Lock()
	for id := range u.tries {
		if !live[id] {
			delete(u.tries, id)
		}
	}
	u.mu.Unlock()
	for _, id := range ids {
		if ctx.Err() != nil {
			return time.Time{}
		}
		u.mu.Lock()
		r := u.tries[id]
		u.mu.Unlock()
		if r != nil && time.Now().Before(r.next) {
			if next.IsZero() || r.next.Before(next) {
				next = r.next
			}
			continue
		}
		res, err := u.upload(ctx, id)
		if err == nil {
			u.mu.Lock()
			delete(u.tries, id)
			u.mu.Unlock()
			continue
		}
		if ctx.Err() != nil {
			return time.Time{}
		}
		if permanent(err) {
			u.fail(id, err, res)
			continue
		}
		u.mu.Lock()
		if r == nil {
			r = &attempts{}
			u.tries[id] = r
		}
		r.attempts++
		wait := u.backoff(r.attempts)
		r.next = time.Now().Add(wait)
		u.stats.retries++
		if r.next.Before(next) || next.IsZero() {
			next = r.next
		}
		u.mu.Unlock()
		u.log.Warn("upload failed; the snapshot stays in the spool and is retried", "job", id, "err", err, "attempt", r.attempts, "retry_in", wait.Round(time.Millisecond))
		if r.attempts == 1 && u.onRetry != nil {
			u.onRetry(res, err)
		}
	}
	return next
}

func (u *uploader) upload(ctx context.Context, id string) (UploadResult, error) {
	dir := filepath.Join(u.sp.root, "pending", id)
	j, err := readJob(dir)
	if err != nil {
		return UploadResult{}, err
	}
	res := UploadResult{Key: j.Key, MetaKey: j.MetaKey, AnalysisKey: j.AnalysisKey, Size: j.Size, SHA256: j.SHA256, Events: j.Events,
		Window: Window{ID: j.Window, Start: j.Start, Stop: j.Stop}, Reason: j.Reason, Partial: j.Partial, Cause: j.Cause,
		Covers: j.Covers, WindowPartial: j.WindowPartial}
	snap := filepath.Join(dir, "snapshot.pickle")
	if sum, _, err := store.HashFile(snap); err != nil {
		return res, fmt.Errorf("%w: %w", errSpoolCorrupt, err)
	} else if !strings.EqualFold(sum, j.SHA256) {
		return res, fmt.Errorf("%w: %s has SHA-256 %s, spooled as %s", errSpoolCorrupt, snap, sum, j.SHA256)
	}
	st, err := u.store(ctx)
	if err != nil {
		return res, err
	}
	if !j.Stored {
		if j, err = u.storeObjects(ctx, st, dir, j, &res); err != nil {
			return res, err
		}
	}
	// stored means reported: the job ends only once the run's log has its report
	if err := u.report(ctx, st, j); err != nil {
		return res, &reportError{err}
	}
	if err := os.RemoveAll(dir); err != nil {
		u.log.Warn("uploaded, but the spool job could not be removed", "dir", dir, "err", err)
	}
	u.mu.Lock()
	u.stats.uploaded++
	u.mu.Unlock()
	u.log.Info("uploaded snapshot", "key", j.Key, "bytes", j.Size, "sha256", j.SHA256[:min(12, len(j.SHA256))], "events", j.Events, "window", j.Window, "store", st.String())
	if u.onResult != nil {
		u.onResult(res)
	}
	return res, nil
}

// storeObjects puts a job's snapshot, sidecar and analysis into the store and
// records in job.json that they are there (so a retry only writes the report).
func (u *uploader) storeObjects(ctx context.Context, st store.Store, dir string, j job, res *UploadResult) (job, error) {
	snap := filepath.Join(dir, "snapshot.pickle")
	err := putFile(ctx, st, j.Key, snap, j.SHA256, j.Overwrite)
	if errors.Is(err, store.ErrExists) && !j.Renamed && !j.Overwrite {
		// another object holds the name (a relaunch that recorded the same
		// batches): the snapshot goes under the window's own name, once and for
		// all (job.json remembers it, so a retry uses the same name)
		if j, err = u.rename(dir, j); err != nil {
			return j, err
		}
		res.Key, res.MetaKey, res.AnalysisKey = j.Key, j.MetaKey, j.AnalysisKey
		u.log.Warn("the snapshot's name is taken in the store; storing it under its window's name", "key", j.Key, "window", j.Window)
		err = putFile(ctx, st, j.Key, snap, j.SHA256, false)
	}
	if err != nil {
		return j, err
	}
	metaSum, _, err := store.HashFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return j, fmt.Errorf("%w: %w", errSpoolCorrupt, err)
	}
	if err := putFile(ctx, st, j.MetaKey, filepath.Join(dir, "meta.json"), metaSum, true); err != nil {
		return j, err
	}
	if j.AnalysisKey != "" {
		p := filepath.Join(dir, "analysis.json")
		anSum, _, err := store.HashFile(p)
		if err != nil {
			return j, fmt.Errorf("%w: %w", errSpoolCorrupt, err)
		}
		if err := putFile(ctx, st, j.AnalysisKey, p, anSum, true); err != nil {
			return j, err
		}
	}
	j.Stored = true
	if err := writeJob(dir, j); err != nil {
		u.log.Warn("could not note in the spool job that its snapshot is stored; a retry stores it again", "dir", dir, "err", err)
	}
	return j, nil
}

// report writes what job j stored into the run's log: the rank's report of its
// window (a crash in the middle of one reports what it recorded as partial), and,
// for an OOM's or a crash's snapshot, the rank's incident, which a post-mortem
// finds there.
func (u *uploader) report(ctx context.Context, st store.Store, j job) error {
	rl := runlog.New(st, u.runName)
	rep := runlog.Report{Window: j.Window, Rank: j.Rank, Key: j.Key, MetaKey: j.MetaKey, AnalysisKey: j.AnalysisKey, Size: j.Size, SHA256: j.SHA256,
		Events: int64(j.Events), Start: j.Start, Stop: j.Stop, Reason: j.Reason, Partial: j.Partial, Cause: j.Cause}
	if j.Reason == "oom" || j.Reason == "crash" {
		inc := rep
		inc.At = j.Created
		if err := rl.PutIncident(ctx, inc); err != nil {
			return err
		}
		if j.Window == 0 || len(j.Covers) != 2 {
			return nil
		}
		rep.Start, rep.Stop, rep.Partial = j.Covers[0], j.Covers[1], j.WindowPartial
	}
	if j.Window == 0 {
		return nil
	}
	return rl.PutReport(ctx, rep)
}

// reportFailure writes, once and as far as the store lets it, that job j's
// snapshot can never be stored, so that its window's leader need not wait for it.
func (u *uploader) reportFailure(j job, why error) {
	if j.Window == 0 || j.Stored || (j.Reason != "window" && j.Reason != "postmortem") {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := u.store(ctx)
	if err == nil {
		err = runlog.New(st, u.runName).PutReport(ctx, runlog.Report{Window: j.Window, Rank: j.Rank, Start: j.Start, Stop: j.Stop, Reason: j.Reason, Error: why.Error()})
	}
	if err != nil {
		u.log.Warn("could not write into the run's log that the snapshot cannot be stored", "window", j.Window, "err", err)
	}
}

// maxJobFile bounds a job.json read (one is a few hundred bytes; its window's
// partial reason is at most a few KiB).
const maxJobFile = 1 << 20

// readJob reads a pending job's job.json; a spool that lost it or holds a
// malformed one is corrupt.
func readJob(dir string) (job, error) {
	f, err := os.Open(filepath.Join(dir, "job.json"))
	if err != nil {
		return job{}, fmt.Errorf("%w: job.json: %w", errSpoolCorrupt, err)
	}
	defer f.Close()
	jb, err := store.ReadLimited(f, "job.json", maxJobFile)
	if err != nil {
		return job{}, fmt.Errorf("%w: %w", errSpoolCorrupt, err)
	}
	var j job
	if err := json.Unmarshal(jb, &j); err != nil {
		return job{}, fmt.Errorf("%w: job.json: %w", errSpoolCorrupt, err)
	}
	return j, nil
}

// putFile stores the file at path under key; an object already there with the
// same SHA-256 (an earlier attempt's) counts as stored.
func putFile(ctx context.Context, st store.Store, key, path, sum string, overwrite bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var size int64
	if fi, err := f.Stat(); err == nil {
		size = fi.Size()
	}
	_, err = st.Put(ctx, key, f, store.PutOptions{SHA256: sum, Overwrite: overwrite, Size: size})
	if errors.Is(err, store.ErrExists) {
		// an earlier attempt may have stored it before the agent stopped
		if info, serr := st.Stat(ctx, key); serr == nil && sum != "" && strings.EqualFold(info.SHA256, sum) {
			return nil
		}
	}
	return err
}

// RenamedKey is where a snapshot goes when its own name is taken in the store:
// ".window<id>" before ".pickle" (a window's id is unique over the run's life),
// or, for a snapshot of no window, ".at<UTC time>".
func RenamedKey(key string, window uint64, created time.Time) string {
	tag := fmt.Sprintf(".window%d", window)
	if window == 0 {
		tag = ".at" + created.UTC().Format("20060102T150405.000000000Z")
	}
	return strings.TrimSuffix(key, ".pickle") + tag + ".pickle"
}

// rename moves a job's keys to the renamed ones and records that in job.json.
func (u *uploader) rename(dir string, j job) (job, error) {
	j.Key = RenamedKey(j.Key, j.Window, j.Created)
	j.MetaKey = sidecar.MetaName(j.Key)
	if j.AnalysisKey != "" {
		j.AnalysisKey = analysis.AnalysisName(j.Key)
	}
	j.Renamed = true
	return j, writeJob(dir, j)
}

// writeJob replaces a job's job.json, whole or not at all.
func writeJob(dir string, j job) error {
	jb, _ := json.MarshalIndent(j, "", "  ")
	tmp := filepath.Join(dir, ".job.json")
	if err := writeFileSync(tmp, jb); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "job.json"))
}

// fail moves a job that can never succeed to failed/ and reports it.
func (u *uploader) fail(id string, err error, res UploadResult) {
	src := filepath.Join(u.sp.root, "pending", id)
	dst := filepath.Join(u.sp.root, "failed", id)
	if rerr := os.Rename(src, dst); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		u.log.Error("could not move a failed job aside", "dir", src, "err", rerr)
	}
	writeReason(dst, err)
	if j, jerr := readJob(dst); jerr == nil {
		u.reportFailure(j, err)
	}
	u.mu.Lock()
	u.stats.failed++
	delete(u.tries, id)
	u.mu.Unlock()
	u.log.Error("snapshot not uploaded; kept in the spool", "dir", dst, "err", err)
	res.Err = err
	if u.onResult != nil {
		u.onResult(res)
	}
}

// close releases the store, once the uploader has stopped.
func (u *uploader) close() {
	u.mu.Lock()
	st := u.st
	u.st = nil
	u.mu.Unlock()
	if st != nil {
		st.Close()
	}
}

func (u *uploader) idle() bool {
	u.mu.Lock()
	busy := u.busy
	u.mu.Unlock()
	return !busy && len(u.sp.pendingJobs()) == 0
}
