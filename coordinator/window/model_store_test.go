package window_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"strconv"
	"strings"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/runlog"
)

// The model's store is where the actors meet, one store call at a time. A
// leader's work runs as a task (a coroutine): before each of its writes the
// task may pause, and the scheduler runs other steps (another leader's, a
// rank's, a new term taken) before it lets the write go on. A leader's fence
// check and its write are so two steps with anything between them, as they are
// for a leader that stalls (GC, SIGSTOP, a partition) between the two.

// actor is who calls the store: a leader's task, or nobody in particular (a
// rank, the model's own reads).
type actor struct {
	l       *mleader
	yield   func(string) bool // pauses the task before a write; false: the leader is gone
	noFault bool              // taking a term: the store answers
}

type actorKey struct{}

func actorOf(ctx context.Context) *actor {
	a, _ := ctx.Value(actorKey{}).(*actor)
	return a
}

// task is a leader's work in progress, paused before a write.
type task struct {
	next func() (string, bool)
	stop func()
}

// act runs fn as leader l's work: at once, up to its first paused write.
func (m *model) act(l *mleader, fn func(ctx context.Context)) {
	if l.task != nil {
		m.fatalf("leader %d is given work while it waits on a write", l.n)
	}
	a := &actor{l: l}
	next, stop := iter.Pull(func(yield func(string) bool) {
		a.yield = yield
		fn(context.WithValue(context.Background(), actorKey{}, a))
	})
	l.task = &task{next: next, stop: stop}
	m.step(l)
}

// resume lets leader l's paused write go on, up to its next pause or the end
// of its work.
func (m *model) resume(l *mleader) {
	if head := m.headTerm(); l.term != 0 && head > l.term {
		m.trace("leader %d (term %d) goes on with its write; term %d took over meanwhile", l.n, l.term, head)
	}
	m.step(l)
}

// step runs leader l's task up to its next pause or its end.
func (m *model) step(l *mleader) {
	key, ok := l.task.next()
	if !ok {
		l.task = nil
		return
	}
	m.trace("leader %d (term %d) pauses before it writes %s", l.n, l.term, strings.TrimPrefix(key, modelRun+"/"))
}

// abort ends leader l's work where it is paused: its write never happens.
func (m *model) abort(l *mleader) {
	if t := l.task; t != nil {
		l.task = nil
		t.stop()
	}
}

var errGone = errors.New("the model's leader is gone")

// modelStore is a folder store that can be taken away, that pauses a leader's
// writes, and that keeps what the invariants need: every version of the
// window's manifest, when each report was written, the records written under
// a term older than the head's.
type modelStore struct {
	store.Store
	m        *model
	down     bool
	flaky    float64 // the chance that one call fails while up
	manifest string
	versions [][]byte
}

func (s *modelStore) fail(ctx context.Context) error {
	a := actorOf(ctx)
	switch {
	case a != nil && a.l.dead:
		return errGone
	case a != nil && a.noFault:
		return nil
	case s.down || (s.flaky > 0 && s.m.rng.Float64() < s.flaky):
		return fmt.Errorf("%w: the model's store is away", store.ErrUnreachable)
	}
	return nil
}

// pause holds a leader's write until the scheduler lets it go on.
func (s *modelStore) pause(ctx context.Context, key string) error {
	a := actorOf(ctx)
	if a == nil || a.noFault || s.m.rng.Float64() >= s.m.pause {
		return nil
	}
	if a.l.dead || !a.yield(key) || a.l.dead {
		return errGone
	}
	return nil
}

func (s *modelStore) Put(ctx context.Context, key string, r io.Reader, o store.PutOptions) (store.ObjectInfo, error) {
	if err := s.pause(ctx, key); err != nil {
		return store.ObjectInfo{}, err
	}
	if err := s.fail(ctx); err != nil {
		return store.ObjectInfo{}, err
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return store.ObjectInfo{}, err
	}
	info, err := s.Store.Put(ctx, key, bytes.NewReader(b), o)
	if err == nil {
		s.m.wrote(actorOf(ctx), key, b)
	}
	return info, err
}

func (s *modelStore) Get(ctx context.Context, key string) (io.ReadCloser, store.ObjectInfo, error) {
	if err := s.fail(ctx); err != nil {
		return nil, store.ObjectInfo{}, err
	}
	return s.Store.Get(ctx, key)
}

func (s *modelStore) Stat(ctx context.Context, key string) (store.ObjectInfo, error) {
	if err := s.fail(ctx); err != nil {
		return store.ObjectInfo{}, err
	}
	return s.Store.Stat(ctx, key)
}

func (s *modelStore) List(ctx context.Context, prefix string) ([]store.ObjectInfo, error) {
	if err := s.fail(ctx); err != nil {
		return nil, err
	}
	return s.Store.List(ctx, prefix)
}

// readOnly is the folder store for the invariants' readers: a reader that
// would write (Unfinished finishing a void id) is told no.
type readOnly struct{ store.Store }

func (readOnly) Put(context.Context, string, io.Reader, store.PutOptions) (store.ObjectInfo, error) {
	return store.ObjectInfo{}, errors.New("the model's checks only read")
}

// staleRec is a record of the run's log written under a term older than the
// head's, after that term took over.
type staleRec struct {
	key  string
	kind string // "plan", "outcome" or "schedule"
	id   uint64
	term uint64
	body []byte
}

// wrote notes a write that the store took: a report's time, a commit's
// decision checked against the reports its leader read (invariant b), a
// record written under a superseded term (kept for invariant c).
func (m *model) wrote(a *actor, key string, b []byte) {
	m.seq++
	root := runlog.Root(modelRun)
	switch {
	case key == m.st.manifest:
		mf, err := publish.ParseManifest(b)
		if err == nil && mf.State == publish.ManifestClaimed {
			m.trace("  store: the manifest's key claimed by %s", mf.Attempt)
			return
		}
		m.st.versions = append(m.st.versions, b)
		m.trace("  store: manifest version %d written", len(m.st.versions))
		if err == nil && a != nil {
			m.checkDecision(a.l, mf)
		}
		// a commit created by a term older than the one that took over: the
		// newer term's claim must have refused it
		if t, perr := strconv.ParseUint(strings.TrimPrefix(mf.Attempt, "t"), 10, 64); err == nil && perr == nil && len(m.st.versions) == 1 && t < m.headTerm() {
			m.stale = append(m.stale, staleRec{key: key, kind: "manifest", term: t, body: b})
			m.trace("  store: the manifest created under term %d after term %d took over", t, m.headTerm())
		}
	case strings.HasPrefix(key, root+"reports/"):
		var rep runlog.Report
		if json.Unmarshal(b, &rep) == nil && rep.Error == "" && rep.Window == m.plan.ID {
			if _, ok := m.reportSeq[rep.Rank]; !ok {
				m.reportSeq[rep.Rank] = m.seq
			}
		}
	case strings.HasPrefix(key, root+"plans/"), strings.HasPrefix(key, root+"outcomes/"), key == root+"schedule.json":
		var rec struct {
			ID    uint64 `json:"window"`
			Term  uint64 `json:"term"`
			State string `json:"state"`
		}
		if json.Unmarshal(b, &rec) != nil {
			return
		}
		if head := m.headTerm(); rec.Term < head {
			kind := map[bool]string{true: "plan", false: "outcome"}[strings.HasPrefix(key, root+"plans/")]
			if key == root+"schedule.json" {
				kind = "schedule"
			}
			m.stale = append(m.stale, staleRec{key: key, kind: kind, id: rec.ID, term: rec.Term, body: b})
			m.trace("  store: %s written under term %d after term %d took over", strings.TrimPrefix(key, root), rec.Term, head)
		}
	}
}

// headTerm is the term that took over last: the one the head names (in a log
// with no head, the newest term record).
func (m *model) headTerm() uint64 {
	ctx := context.Background()
	b, _, err := store.ReadObject(ctx, m.st.Store, runlog.Root(modelRun)+"head.json", 1<<20)
	var h struct {
		Term uint64 `json:"term"`
	}
	if err == nil && json.Unmarshal(b, &h) == nil {
		return h.Term
	}
	t, _ := m.raw.LatestTerm(ctx)
	return t
}
