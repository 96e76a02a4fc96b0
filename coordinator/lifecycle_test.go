package coordinator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
)

// tripStore is a store that, at its n-th write of a window's publication (the
// plan, the claim, each output, the manifest, the outcome), stores it and then
// stops answering: tripped is closed, and the call waits until release is closed
// (the leader wakes from a stall) or its context ends (the leader dies).
type tripStore struct {
	store.Store
	*trip
}

// trip is what every tripStore of one member shares (the leader and the
// reporter open a store each).
type trip struct {
	n       int32
	writes  atomic.Int32
	tripped chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *tripStore) Put(ctx context.Context, key string, r io.Reader, opts store.PutOptions) (store.ObjectInfo, error) {
	info, err := s.Store.Put(ctx, key, r, opts)
	if err != nil || strings.Contains(key, "/memsnap/reports/") || strings.Contains(key, "/memsnap/terms/") || strings.HasSuffix(key, "/memsnap/head.json") {
		return info, err
	}
	if s.writes.Add(1) != s.n {
		return info, err
	}
	s.once.Do(func() { close(s.tripped) })
	select {
	case <-ctx.Done():
		return info, ctx.Err()
	case <-s.release:
		return info, nil
	}
}

// wrap makes every store the member opens a tripStore of this trip.
func (tr *trip) wrap(c *Config) {
	wrapStores(c, func(st store.Store) store.Store { return &tripStore{Store: st, trip: tr} })
}

// wrapStores makes every store the member opens the one wrap makes of it.
func wrapStores(c *Config, wrap func(store.Store) store.Store) {
	open := c.OpenStore
	c.OpenStore = func(ctx context.Context) (store.Store, error) {
		st, err := open(ctx)
		if err != nil {
			return nil, err
		}
		return wrap(st), nil
	}
}

// publicationWrites are a window's writes by its leader, in order: the plan, the
// answer (claim, trace, summary, report, and its manifest), the detail (the
// pickle, the timeline, and the manifest that names them), and the outcome in the
// run's log.
var publicationWrites = []string{"plan", "claim", "trace", "summary", "html", "answer", "pickle", "pb", "manifest", "outcome"}

// TestLeaderDiesDuringPublication: the leader stops (dies, or stalls and later
// wakes) after each write of a window's publication in turn. The next leader
// completes or supersedes the publication; exactly one published set results,
// every file of it whole; a leader that wakes never mixes its outputs into it;
// and the old leader, back (restarted, or awake), leads the next window.
func TestLeaderDiesDuringPublication(t *testing.T) {
	for k, what := range publicationWrites {
		// the old leader comes back in a few cases (each takes a while)
		back := what == "claim" || what == "answer" || what == "manifest"
		t.Run("dies after the "+what, func(t *testing.T) { leaderStopsDuringPublication(t, int32(k+1), false, back) })
	}
	for _, k := range []int{2, 6, 7, 9} {
		t.Run("stalls after the "+publicationWrites[k-1], func(t *testing.T) { leaderStopsDuringPublication(t, int32(k), true, true) })
	}
	// the fence and the conditional writes hold on MinIO as on a folder
	for _, k := range []int{2, 6, 7} {
		t.Run("on MinIO, stalls after the "+publicationWrites[k-1], func(t *testing.T) {
			leaderStopsDuringPublication(t, int32(k), true, true, withMinIO(t, testutil.RequireMinIO(t)))
		})
	}
	t.Run("on MinIO, dies after the pickle", func(t *testing.T) {
		leaderStopsDuringPublication(t, int32(slices.Index(publicationWrites, "pickle")+1), false, false, withMinIO(t, testutil.RequireMinIO(t)))
	})
}

func leaderStopsDuringPublication(t *testing.T, n int32, stall, back bool, opts ...clusterOpt) {
	trip := &trip{n: n, tripped: make(chan struct{}), release: make(chan struct{})}
	p := &partition{group: map[string]int{}}
	tc := startCluster(t, 3, append(opts, func(c *Config, a *rankagent.Config) {
		if c.Client {
			return
		}
		if stall { // a stalled leader is cut off from everyone, as a SIGSTOPped one is
			c.Memberlist.Transport = newCutTransport(t, p, min(c.Identity.Rank, 1))
		}
		if c.Identity.Rank == 0 {
			trip.wrap(c)
		}
	})...)
	tc.holding()
	st := tc.storeOf(t, 1)
	ccfg := DefaultLocalConfig(rankagent.Identity{RunName: tc.run})
	ccfg.Client, ccfg.SecretKey, ccfg.Logger = true, tc.key, testutil.Logger(t).With("member", "client")
	if stall {
		ccfg.Memberlist.Transport = newCutTransport(t, p, 1)
	}
	for _, r := range tc.ranks {
		ccfg.Join = append(ccfg.Join, r.Coord.Addr())
	}
	c, stopClient := runMember(t, ccfg)
	t.Cleanup(stopClient)
	testutil.Eventually(t, 20*time.Second, "the client to see rank 0 lead", func() bool { l, ok := c.Leader(); return ok && l == 0 })

	type result struct {
		res *pb.WindowResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := c.Snapshot(testutil.Context(t, 3*time.Minute), 3, nil, nil)
		done <- result{res, err}
	}()
	var early *result
	select {
	case <-trip.tripped:
	case r := <-done:
		// the members waiting hear how the window ended before the leader writes
		// its outcome into the run's log: the last write may come after
		if publicationWrites[n-1] != "outcome" {
			t.Fatalf("the window ended before the leader's write %d: %+v %v", n, r.res, r.err)
		}
		early = &r
		<-trip.tripped
	}
	if stall {
		p.mu.Lock()
		p.cut = true
		p.mu.Unlock()
	} else {
		tc.ranks[0].Coord.Shutdown() // no goodbye: it dies
		tc.stops[0]()
	}
	var r result
	if early != nil {
		r = *early
	} else {
		r = <-done
	}
	if r.err != nil || r.res.State != pb.Outcome_OUTCOME_PUBLISHED {
		t.Fatalf("the window after the leader stopped: %+v %v", r.res, r.err)
	}
	if len(r.res.Ranks) < 2 {
		t.Fatalf("ranks merged %v", r.res.Ranks)
	}
	// the window published is the one asked for; a leader that died before it told
	// the client the window's id leaves that window failed (nobody recorded it),
	// and the client's request was planned again by the next leader
	folder := fmt.Sprintf("%s/torch_memory_traces/window%d/", tc.run, r.res.Window)
	checkOnePublication(t, st, folder)
	rl := runlog.New(st, tc.run)
	// the outcome is written just after the members waiting were told
	var o *runlog.Outcome
	testutil.Eventually(t, 30*time.Second, "the window's outcome in the run's log", func() bool {
		var err error
		o, err = rl.ReadOutcome(context.Background(), r.res.Window)
		return err == nil
	})
	if o.State != runlog.Published {
		t.Fatalf("window %d's outcome in the run's log: %+v", r.res.Window, o)
	}
	if !back {
		return
	}

	if stall {
		// the old leader wakes: it finishes its writes, finds the window published,
		// takes a newer term and leads again
		p.mu.Lock()
		p.cut = false
		p.mu.Unlock()
		close(trip.release)
		testutil.Eventually(t, time.Minute, "the woken leader to lead under a newer term", func() bool {
			l, ok := c.Leader()
			return ok && l == 0 && tc.ranks[0].Coord.IsLeader() && tc.ranks[0].Coord.Busy() == false && tc.ranks[0].Coord.Term() >= 3
		})
	} else {
		tc.startRank(0, 3)
		testutil.Eventually(t, time.Minute, "the restarted rank 0 to lead under a newer term", func() bool {
			l, ok := c.Leader()
			return ok && l == 0 && tc.ranks[0].Coord.IsLeader() && tc.ranks[0].Coord.Term() >= 3
		})
	}
	// nothing the old leader wrote after waking mixes into the published set
	testutil.Eventually(t, 30*time.Second, "only the published set in the window's folder", func() bool {
		return extraFiles(t, st, folder) == nil
	})
	checkOnePublication(t, st, folder)
	checkLog(t, st, tc.run)
	if un, err := rl.Unfinished(context.Background(), runlog.MaxID); err != nil || len(un) != 0 {
		t.Fatalf("unfinished windows in the run's log: %v %v", un, err)
	}
	// and the cluster records the next window, under a newer id (a restarted
	// member may flap once while gossip of its old self's death runs out)
	res, err := c.Snapshot(testutil.Context(t, 2*time.Minute), 2, nil, nil)
	if err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED || res.Window <= r.res.Window {
		t.Fatalf("the next window: %+v %v", res, err)
	}
}

// checkOnePublication: the window's folder (a prefix in st) holds one
// manifest, and every output it names is there, whole.
func checkOnePublication(t *testing.T, st store.Store, folder string) {
	t.Helper()
	ctx := testutil.Context(t, time.Minute)
	var ms []string
	objs, err := st.List(ctx, folder)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if strings.HasSuffix(o.Key, ".manifest.json") {
			ms = append(ms, o.Key)
		}
	}
	if len(ms) != 1 {
		t.Fatalf("manifests %v", ms)
	}
	m, err := publish.ReadManifest(ctx, st, ms[0])
	if err != nil {
		t.Fatal(err)
	}
	for kind, o := range m.Outputs {
		b, err := store.ReadAll(ctx, st, folder+o.Name)
		if err != nil {
			t.Fatalf("output %s: %v", kind, err)
		}
		if h := sha256.Sum256(b); hex.EncodeToString(h[:]) != o.SHA256 || int64(len(b)) != o.Size {
			t.Fatalf("output %s (%s) is not what the manifest says", kind, o.Name)
		}
	}
}

// extraFiles lists what the window's folder (a prefix in st) holds beyond the
// published set.
func extraFiles(t *testing.T, st store.Store, folder string) []string {
	ctx := testutil.Context(t, time.Minute)
	objs, err := st.List(ctx, folder)
	if err != nil {
		return []string{err.Error()}
	}
	var ms []string
	for _, o := range objs {
		if strings.HasSuffix(o.Key, ".manifest.json") {
			ms = append(ms, o.Key)
		}
	}
	if len(ms) != 1 {
		return ms
	}
	m, err := publish.ReadManifest(ctx, st, ms[0])
	if err != nil {
		return []string{err.Error()}
	}
	named := map[string]bool{path.Base(ms[0]): true, m.Claim.Name: true}
	for _, o := range m.Outputs {
		named[o.Name] = true
	}
	var extra []string
	for _, o := range objs {
		if name := strings.TrimPrefix(o.Key, folder); !named[name] && !strings.HasPrefix(name, ".") {
			extra = append(extra, name)
		}
	}
	sort.Strings(extra)
	return extra
}

var _ = publish.OutManifest
var _ = fmt.Sprint

// TestAnswerBeforeThePickles: the members waiting hear a window's answer while
// its leader is still writing the merged pickles (held here by a store that stops
// after storing the pickle), and the full result once the manifest names them.
func TestAnswerBeforeThePickles(t *testing.T) {
	pickle := int32(slices.Index(publicationWrites, "pickle") + 1)
	trip := &trip{n: pickle, tripped: make(chan struct{}), release: make(chan struct{})}
	tc := startCluster(t, 3, func(c *Config, a *rankagent.Config) {
		if !c.Client && c.Identity.Rank == 0 {
			trip.wrap(c)
		}
	})
	tc.holding()
	c := tc.client()
	answers := make(chan *pb.WindowResult, 4)
	done := make(chan *pb.WindowResult, 1)
	var late atomic.Value // a window-level publishing step told after the answer
	go func() {
		gotAnswer := false
		res, err := c.Request(testutil.Context(t, 2*time.Minute), 3, RequestOptions{Progress: func(u Update) {
			if u.Answer != nil {
				gotAnswer = true
				answers <- u.Answer
			} else if gotAnswer && u.Rank < 0 && u.State == pb.Step_STEP_PUBLISHING {
				late.Store(u.Reason)
			}
		}})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	var ans *pb.WindowResult
	select {
	case ans = <-answers:
	case res := <-done:
		t.Fatalf("the result came before the answer: %+v", res)
	case <-time.After(time.Minute):
		t.Fatal("no answer")
	}
	<-trip.tripped // the leader holds in its second step
	if !ans.Pending || ans.State != pb.Outcome_OUTCOME_PUBLISHED || len(ans.Outputs) != 3 || len(ans.Findings) == 0 || len(ans.Ranks) != 3 {
		t.Fatalf("the answer %+v", ans)
	}
	folder := filepath.Join(tc.dir, tc.run, "torch_memory_traces", fmt.Sprintf("window%d", ans.Window))
	m := readManifest(t, filepath.Join(folder, "merged.manifest.json"))
	st, _ := store.OpenDir(tc.dir, false)
	prefix := fmt.Sprintf("%s/torch_memory_traces/window%d/", tc.run, ans.Window)
	if len(m.Pending) != 2 || m.Outputs[publish.OutSummary].Name == "" || m.Outputs[publish.OutPickle].Name != "" {
		t.Fatalf("the manifest while the pickles are written: %+v", m)
	}
	select {
	case res := <-done:
		t.Fatalf("the result came while the leader still writes the pickles: %+v", res)
	default:
	}
	close(trip.release)
	res := <-done
	if res == nil || res.Pending || res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Outputs) != 5 || res.Window != ans.Window {
		t.Fatalf("the result %+v", res)
	}
	checkOnePublication(t, st, prefix)
	if extra := extraFiles(t, st, prefix); extra != nil {
		t.Fatalf("files no manifest names: %v", extra)
	}
	if r := late.Load(); r != nil {
		t.Errorf("told after the answer: %q", r)
	}
}
