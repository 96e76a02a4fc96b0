package merge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/naming"
)

// progressiveWrites are a progressive merge's Puts, in order.
var progressiveWrites = []string{"claim", "trace", "summary", "html", "answer manifest", "pickle", "pb", "manifest"}

// readManifestIn reads and parses the manifest in dir, merged.manifest.json.
func readManifestIn(t *testing.T, dir string) (*publish.Manifest, []byte) {
	t.Helper()
	mb, err := os.ReadFile(filepath.Join(dir, "merged.manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := publish.ParseManifest(mb)
	if err != nil {
		t.Fatal(err)
	}
	return m, mb
}

// checkPublished checks the folder's manifest: every output it names is there,
// whole, nothing is pending, and the folder holds nothing else.
func checkPublished(t *testing.T, dir string) *publish.Manifest {
	t.Helper()
	m, mb := readManifestIn(t, dir)
	if len(m.Pending) != 0 || len(m.Outputs) != 5 || len(m.Pickles) != 1 {
		t.Fatalf("manifest %s", mb)
	}
	want := []string{"merged.manifest.json", m.Claim.Name}
	for kind, o := range m.Outputs {
		sum, size, err := store.HashFile(filepath.Join(dir, o.Name))
		if err != nil || sum != o.SHA256 || size != o.Size {
			t.Fatalf("%s: %s has %s (%d bytes), the manifest says %s (%d)", kind, o.Name, sum, size, o.SHA256, o.Size)
		}
		want = append(want, o.Name)
	}
	var got []string
	for k := range readAll(t, dir) {
		got = append(got, k)
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Fatalf("the folder holds %v; the manifest names %v", got, want)
	}
	return m
}

// TestProgressiveMerge: the answer (summary, report, trace) is published first,
// with a manifest that says the pickles and the timeline are coming; then they
// are, byte for byte those of a merge in one step, under a manifest that names
// them, and nothing else is left in the folder.
func TestProgressiveMerge(t *testing.T) {
	ins := resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)})
	one, oneDir := runMerge(t, Config{Inputs: ins, Title: "t"})
	dir := t.TempDir()
	d, _ := store.OpenDir(dir, true)
	var answers []Answer
	res, err := Merge(testutil.Context(t, time.Minute), Config{Inputs: ins, Title: "t", Out: d, Logger: testutil.Logger(t), Progressive: true,
		OnAnswer: func(a Answer) {
			answers = append(answers, a)
			// at this moment the answer is in the store, whole, and the pickles are not
			m, mb := readManifestIn(t, dir)
			if !slices.Equal(m.Pending, []string{publish.OutPickle, publish.OutPB}) || len(m.Outputs) != 3 || m.Outputs[publish.OutSummary].Name == "" || m.Outputs[publish.OutHTML].Name == "" || m.Outputs[publish.OutTrace].Name == "" {
				t.Fatalf("the answer's manifest: %s", mb)
			}
			if _, err := os.Stat(filepath.Join(dir, "merged.memory_snapshot.pickle")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the pickle is stored before the answer: %v", err)
			}
			if len(m.Findings) == 0 || m.OutlierRank == nil || *m.OutlierRank != 3 || len(m.RanksMerged) != 4 {
				t.Fatalf("the answer's manifest lacks the answer: %s", mb)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if len(answers) != 1 || answers[0].Summary.Spread == nil || answers[0].Summary.Spread.OutlierRank != 3 {
		t.Fatalf("answers %+v", answers)
	}
	m := checkPublished(t, dir)
	if res.Manifest == nil || res.Manifest.Outputs[publish.OutPickle] != m.Outputs[publish.OutPickle] || res.Outputs[publish.OutPickle] != "merged.memory_snapshot.pickle" {
		t.Fatalf("result %+v", res)
	}
	for _, k := range []string{"merged.memory_snapshot.pickle", "merged.memsnap.pb", "merged.trace.json", "merged.html"} {
		a, _ := os.ReadFile(filepath.Join(oneDir, k))
		b, _ := os.ReadFile(filepath.Join(dir, k))
		if len(a) == 0 || !bytes.Equal(a, b) {
			t.Fatalf("%s differs from a merge in one step (%d and %d bytes)", k, len(a), len(b))
		}
	}
	if one.Summary.Spread.OutlierRank != res.Summary.Spread.OutlierRank {
		t.Fatal("another outlier")
	}
	// published: a rerun is refused
	if _, err := Merge(context.Background(), Config{Inputs: ins, Out: d, Progressive: true}); !errors.Is(err, store.ErrExists) {
		t.Fatalf("merging a published name again: %v", err)
	}
	checkPublished(t, dir)
}

// TestProgressiveMergeIsCompleted: a merge that stops after each write in turn
// (its leader died, or the store failed) is completed by the next one, under
// another attempt or the same: the answer stays as it was published, the window
// ends published with every output whole, and nothing either left behind stays.
func TestProgressiveMergeIsCompleted(t *testing.T) {
	ins := resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)})
	for n := 1; n < len(progressiveWrites); n++ {
		for _, again := range []string{"t1", "t2"} {
			t.Run(fmt.Sprintf("after the %s, %s", progressiveWrites[n-1], again), func(t *testing.T) {
				dir := t.TempDir()
				d, _ := store.OpenDir(dir, true)
				fs := &failingStore{Store: struct{ store.Store }{d}, n: int64(n)}
				ctx := testutil.Context(t, time.Minute)
				cfg := Config{Inputs: ins, Title: "t", Out: fs, Logger: testutil.Logger(t), Progressive: true, Supersede: true, Attempt: "t1"}
				answered := false
				cfg.OnAnswer = func(Answer) { answered = true }
				if _, err := Merge(ctx, cfg); !errors.Is(err, context.Canceled) {
					t.Fatalf("the interrupted merge: %v", err)
				}
				if answered != (n >= 5) {
					t.Fatalf("answered %v after %d writes", answered, n)
				}
				var before *publish.Manifest
				if mb, err := os.ReadFile(filepath.Join(dir, "merged.manifest.json")); err == nil {
					before, _ = publish.ParseManifest(mb)
				}
				cfg.Out, cfg.Attempt = d, again
				var answer *publish.Manifest
				cfg.OnAnswer = func(a Answer) { answer = a.M }
				res, err := Merge(ctx, cfg)
				if err != nil {
					t.Fatalf("the merge after: %v", err)
				}
				m := checkPublished(t, dir)
				if answer == nil || len(answer.Pending) != 2 {
					t.Fatalf("the answer told: %+v", answer)
				}
				if before != nil {
					// the answer was published: it stays, and the rest is added
					for _, k := range []string{publish.OutSummary, publish.OutHTML, publish.OutTrace} {
						if m.Outputs[k] != before.Outputs[k] {
							t.Fatalf("%s changed from %+v to %+v", k, before.Outputs[k], m.Outputs[k])
						}
					}
					if m.Claim != before.Claim || m.Attempt != "t1" {
						t.Fatalf("the claim changed: %+v, attempt %s", m.Claim, m.Attempt)
					}
					// the second step is written under the answer's names, whoever writes it
					if m.Outputs[publish.OutPickle].Name != "merged.memory_snapshot.pickle" || m.Outputs[publish.OutPB].Name != "merged.memsnap.pb" {
						t.Fatalf("the second step's names: %+v", m.Outputs)
					}
				}
				if len(res.Summary.Ranks) != 4 || res.Outputs[publish.OutPickle] != m.Outputs[publish.OutPickle].Name {
					t.Fatalf("result %+v", res.Outputs)
				}
			})
		}
	}
}

// TestProgressiveMergeRefusesOtherInputs: an answer published from four ranks is
// not completed from other snapshots.
func TestProgressiveMergeRefusesOtherInputs(t *testing.T) {
	ins := resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)})
	dir := t.TempDir()
	d, _ := store.OpenDir(dir, true)
	ctx := testutil.Context(t, time.Minute)
	fs := &failingStore{Store: struct{ store.Store }{d}, n: 5}
	cfg := Config{Inputs: ins, Out: fs, Logger: testutil.Logger(t), Progressive: true, Supersede: true, Attempt: "t1"}
	if _, err := Merge(ctx, cfg); !errors.Is(err, context.Canceled) {
		t.Fatalf("the interrupted merge: %v", err)
	}
	cfg.Out, cfg.Attempt, cfg.Inputs = d, "t2", ins[:3]
	if _, err := Merge(ctx, cfg); !errors.Is(err, ErrOtherInputs) {
		t.Fatalf("completing from other inputs: %v", err)
	}
	mb, _ := os.ReadFile(filepath.Join(dir, "merged.manifest.json"))
	if m, err := publish.ParseManifest(mb); err != nil || len(m.Pending) != 2 {
		t.Fatalf("the answer's manifest changed: %s %v", mb, err)
	}
}

// TestProgressiveMergeRefusesAPendingManifestWithoutClaim: a manifest that waits
// for outputs but names no claim (nothing a merge writes) is not completed: the
// second step's names would come from nowhere.
func TestProgressiveMergeRefusesAPendingManifestWithoutClaim(t *testing.T) {
	ins := resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)})
	dir := t.TempDir()
	d, _ := store.OpenDir(dir, true)
	os.WriteFile(filepath.Join(dir, "merged.manifest.json"), []byte(`{"version":1,"pending":["pickle","pb"],"outputs":{}}`), 0o644)
	if _, err := Merge(context.Background(), Config{Inputs: ins, Out: d, Progressive: true}); !errors.Is(err, ErrOtherInputs) {
		t.Fatalf("completing a pending manifest with no claim: %v", err)
	}
	if left := readAll(t, dir); len(left) != 1 {
		t.Fatalf("the folder now holds %d objects", len(left))
	}
}

// TestProgressiveMergeLeavesOutAnUndecodableRank: a rank whose snapshot no
// longer reads as it did for the answer (changed in the store, or not decodable)
// is left out of the pickles and the timeline with the reason; the window is
// still published, every other rank's detail in it.
func TestProgressiveMergeLeavesOutAnUndecodableRank(t *testing.T) {
	ins := resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)})
	var reads atomic.Int32
	load := ins[2].load
	ins[2].load = func(ctx context.Context) ([]byte, error) {
		b, err := load(ctx)
		if reads.Add(1) > 1 {
			b = append(b, 0) // the answer read it whole; after, it changed
		}
		return b, err
	}
	dir := t.TempDir()
	d, _ := store.OpenDir(dir, true)
	res, err := Merge(testutil.Context(t, time.Minute), Config{Inputs: ins, Out: d, Logger: testutil.Logger(t), Progressive: true})
	if err != nil {
		t.Fatal(err)
	}
	m, mb := readManifestIn(t, dir)
	if len(m.Pending) != 0 || len(m.DetailMissing) != 1 || m.DetailMissing["2"] == "" || len(m.Pickles) != 1 || m.Pickles[0].Ranks != "0-1,3" {
		t.Fatalf("manifest %s", mb)
	}
	if len(res.Summary.Ranks) != 4 || len(m.RanksMerged) != 4 {
		t.Fatalf("the answer lost a rank: %v", m.RanksMerged)
	}
}

// TestCommitFailed: a failed window's manifest is its commit, as a published
// one is: created once, refused to a merge afterwards, never over a published
// one, and never written once the fence says no.
func TestCommitFailed(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	dir := t.TempDir()
	d, _ := store.OpenDir(dir, true)
	key := "merged.manifest.json"
	f := publish.FailedWindow{Error: "no rank stored a snapshot of the window", Window: &sidecar.WindowInfo{ID: 3, Start: 5, Stop: 8}, WorldSize: 4,
		MissingReasons: map[int]string{0: "no sign of life", 2: "refused the window"}, Kind: "window", Attempt: "t2"}
	no := errors.New("a newer term")
	if _, err := publish.CommitFailed(ctx, d, key, f, func(context.Context) error { return no }); !errors.Is(err, no) {
		t.Fatalf("a fenced commit: %v", err)
	}
	if left := readAll(t, dir); len(left) != 0 {
		t.Fatalf("a fenced commit wrote %v", left)
	}
	m, err := publish.CommitFailed(ctx, d, key, f, nil)
	if err != nil || !m.Failed() || m.Error != f.Error || !slices.Equal(m.MissingRanks, []int{0, 2}) || m.MissingReasons["2"] != "refused the window" {
		t.Fatalf("committed %+v %v", m, err)
	}
	read, err := publish.ReadManifest(ctx, d, key)
	if err != nil || !read.Failed() || read.Window.ID != 3 {
		t.Fatalf("read back %+v %v", read, err)
	}
	f2 := f
	f2.Error = "another reason"
	if again, err := publish.CommitFailed(ctx, d, key, f2, nil); err != nil || again.Error != f.Error {
		t.Fatalf("a second commit: %+v %v (the first stands)", again, err)
	}
	ins := resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)})
	if _, err := Merge(ctx, Config{Inputs: ins, Out: d, Progressive: true, Supersede: true, Attempt: "t3", Logger: testutil.Logger(t)}); !errors.Is(err, store.ErrExists) {
		t.Fatalf("a merge after the window failed: %v", err)
	}
	if left := readAll(t, dir); len(left) != 1 {
		t.Fatalf("the refused merge left %d objects", len(left))
	}
	// over a published window, the commit is the published manifest
	pub := t.TempDir()
	pd, _ := store.OpenDir(pub, true)
	if _, err := Merge(ctx, Config{Inputs: ins, Out: pd, Progressive: true, Logger: testutil.Logger(t)}); err != nil {
		t.Fatal(err)
	}
	if held, err := publish.CommitFailed(ctx, pd, key, f, nil); err != nil || held.Failed() || len(held.Pending) != 0 {
		t.Fatalf("failing a published window: %+v %v", held, err)
	}
	// a failed manifest with outputs is malformed
	bad := *m
	bad.Outputs = map[string]publish.Object{publish.OutHTML: {Name: "x.html", SHA256: strings.Repeat("0", 64)}}
	b, _ := json.Marshal(bad)
	if _, err := publish.ParseManifest(b); err == nil {
		t.Fatal("a failed manifest naming outputs parsed")
	}
}

// TestFenceStopsPublication: a merge whose fence says no after its answer
// writes no detail and no manifest; one refused from the start writes no claim.
func TestFenceStopsPublication(t *testing.T) {
	ins := resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)})
	ctx := testutil.Context(t, time.Minute)
	no := errors.New("a newer term")
	dir := t.TempDir()
	d, _ := store.OpenDir(dir, true)
	if _, err := Merge(ctx, Config{Inputs: ins, Out: d, Progressive: true, Fence: func(context.Context) error { return no }}); !errors.Is(err, no) {
		t.Fatalf("a merge fenced from the start: %v", err)
	}
	if left := readAll(t, dir); len(left) != 0 {
		t.Fatalf("a fenced merge stored %v", left)
	}
	// refused at the answer's manifest: what it stored goes
	calls := 0
	fence := func(context.Context) error {
		if calls++; calls > 1 { // the claim passes
			return no
		}
		return nil
	}
	if _, err := Merge(ctx, Config{Inputs: ins, Out: d, Progressive: true, Fence: fence}); !errors.Is(err, no) {
		t.Fatalf("a merge fenced at its answer: %v", err)
	}
	if left := readAll(t, dir); len(left) != 0 {
		t.Fatalf("a merge fenced at its answer left %d objects", len(left))
	}
	calls = 0
	fence = func(context.Context) error {
		if calls++; calls > 2 { // the claim, the answer's manifest
			return no
		}
		return nil
	}
	if _, err := Merge(ctx, Config{Inputs: ins, Out: d, Progressive: true, Fence: fence}); !errors.Is(err, no) {
		t.Fatalf("a merge fenced after its answer: %v", err)
	}
	if m, _ := readManifestIn(t, dir); len(m.Pending) != 2 {
		t.Fatalf("the fenced detail step replaced the answer: %+v", m)
	}
}

// replacingStore replaces the manifest under it just before a conditional
// replace reaches the store: another merge completed the answer first.
type replacingStore struct {
	store.Store
	key  string
	with []byte
	done bool
}

func (s *replacingStore) Put(ctx context.Context, key string, r io.Reader, o store.PutOptions) (store.ObjectInfo, error) {
	if o.IfMatch != "" && key == s.key && !s.done {
		s.done = true
		if _, err := s.Store.Put(ctx, key, bytes.NewReader(s.with), store.PutOptions{Overwrite: true}); err != nil {
			return store.ObjectInfo{}, err
		}
	}
	return s.Store.Put(ctx, key, r, o)
}

// TestDetailReplacesOnlyTheAnswerItRead: the detail step replaces the manifest
// only while it is the answer it read; one another merge replaced meanwhile
// stays, and this merge says it was completed by another.
func TestDetailReplacesOnlyTheAnswerItRead(t *testing.T) {
	ins := resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)})
	ctx := testutil.Context(t, time.Minute)
	dir := t.TempDir()
	d, _ := store.OpenDir(dir, true)
	other := []byte(`{"version":1,"outputs":{},"ranks_merged":[],"missing_ranks":[],"clock_offsets_us":{},"align":"wall","world_size":4,"attempt":"other"}` + "\n")
	rs := &replacingStore{Store: struct{ store.Store }{d}, key: "merged.manifest.json", with: other}
	_, err := Merge(ctx, Config{Inputs: ins, Out: rs, Progressive: true, Logger: testutil.Logger(t)})
	if !errors.Is(err, store.ErrExists) || !rs.done {
		t.Fatalf("completing an answer replaced meanwhile: %v (replaced %v)", err, rs.done)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "merged.manifest.json")); !bytes.Equal(b, other) {
		t.Fatalf("the other merge's manifest was replaced: %s", b)
	}
}
