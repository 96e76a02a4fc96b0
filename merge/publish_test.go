package merge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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

// failingStore fails every Put after the first n, as a merge interrupted by Ctrl-C
// (or a store going away) would see.
type failingStore struct {
	store.Store
	n    int64
	puts atomic.Int64
}

func (f *failingStore) Put(ctx context.Context, key string, r io.Reader, o store.PutOptions) (store.ObjectInfo, error) {
	if f.puts.Add(1) > f.n {
		return store.ObjectInfo{}, context.Canceled
	}
	return f.Store.Put(ctx, key, r, o)
}

func readAll(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			rel, _ := filepath.Rel(dir, p)
			out[rel] = b
		}
		return nil
	})
	return out
}

// TestMergeIsDeterministic: the same inputs and options give byte-identical
// outputs, which is what lets a rerun finish an interrupted merge.
func TestMergeIsDeterministic(t *testing.T) {
	ins := resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)})
	_, a := runMerge(t, Config{Inputs: ins, Title: "t"})
	_, b := runMerge(t, Config{Inputs: ins, Title: "t"})
	fa, fb := readAll(t, a), readAll(t, b)
	if len(fa) != 7 {
		t.Fatalf("%d files: %v", len(fa), fa)
	}
	for k, v := range fa {
		if !bytes.Equal(v, fb[k]) {
			t.Fatalf("%s differs between two merges of the same inputs", k)
		}
	}
}

// TestInterruptedMergeIsFinishedByARerun: a merge that stopped after storing some
// outputs is not published (no manifest), and running it again finishes it.
func TestInterruptedMergeIsFinishedByARerun(t *testing.T) {
	dir := t.TempDir()
	d, _ := store.OpenDir(dir, true)
	ins := resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)})
	// the folder store moves files into place through PutFile; wrap it so every
	// output goes through Put
	fs := &failingStore{Store: struct{ store.Store }{d}, n: 3}
	ctx := testutil.Context(t, time.Minute)
	_, err := Merge(ctx, Config{Inputs: ins, Out: fs, Logger: testutil.Logger(t)})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("the interrupted merge: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "merged.manifest.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("an interrupted merge was published")
	}
	left := readAll(t, dir)
	if len(left) != 3 {
		t.Fatalf("the interrupted merge left %d objects, want 3 (claim and two outputs)", len(left))
	}
	// the rerun, without overwrite, finishes it
	res, err := Merge(ctx, Config{Inputs: ins, Out: d, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatalf("the rerun: %v", err)
	}
	m, mb := readManifestIn(t, dir)
	if len(m.Outputs) != 5 || len(m.Inputs) != 4 || len(m.RanksMerged) != 4 || m.OutlierRank == nil || *m.OutlierRank != 3 {
		t.Fatalf("manifest %s", mb)
	}
	for kind, o := range m.Outputs {
		sum, size, err := store.HashFile(filepath.Join(dir, o.Name))
		if err != nil || sum != o.SHA256 || size != o.Size {
			t.Fatalf("%s: %s has %s (%d bytes), the manifest says %s (%d)", kind, o.Name, sum, size, o.SHA256, o.Size)
		}
	}
	if res.Outputs[publish.OutManifest] != "merged.manifest.json" {
		t.Fatalf("outputs %v", res.Outputs)
	}
	// published: a third run is refused without overwrite
	if _, err := Merge(ctx, Config{Inputs: ins, Out: d}); !errors.Is(err, store.ErrExists) {
		t.Fatalf("merging a published name again: %v", err)
	}
}

// TestMergeWithOtherInputsIsRefused: a second merge under the same names with other
// inputs (a leader that saw other ranks) is refused and changes nothing.
func TestMergeWithOtherInputsIsRefused(t *testing.T) {
	dir := t.TempDir()
	d, _ := store.OpenDir(dir, true)
	ctx := testutil.Context(t, time.Minute)
	all := resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)})
	// the first merge stops after its claim and one output
	fs := &failingStore{Store: struct{ store.Store }{d}, n: 2}
	if _, err := Merge(ctx, Config{Inputs: all[:3], Out: fs, WorldSize: 4}); err == nil {
		t.Fatal("the interrupted merge succeeded")
	}
	before := readAll(t, dir)
	if _, err := Merge(ctx, Config{Inputs: all, Out: d}); !errors.Is(err, store.ErrExists) || !strings.Contains(err.Error(), "another merge claimed") {
		t.Fatalf("a merge with other inputs: %v", err)
	}
	after := readAll(t, dir)
	if len(after) != len(before) {
		t.Fatalf("the refused merge stored %d objects", len(after)-len(before))
	}
	for k, v := range before {
		if !bytes.Equal(v, after[k]) {
			t.Fatalf("the refused merge changed %s", k)
		}
	}
}

// TestMergeBoundsRanks: a rank number or world size that nothing justifies is
// refused instead of making a merge write gigabytes of empty ranks.
func TestMergeBoundsRanks(t *testing.T) {
	src, _ := os.ReadFile(filepath.Join(ddp4(t), "rank0.5.memory_snapshot.pickle"))
	for _, rank := range []int{5000000, 50000000, sidecar.MaxRanks} {
		d := t.TempDir()
		os.WriteFile(filepath.Join(d, fmt.Sprintf("rank%d.5.memory_snapshot.pickle", rank)), src, 0o644)
		out, _ := store.OpenDir(t.TempDir(), true)
		_, err := Merge(context.Background(), Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{d}), Out: out})
		if err == nil || !strings.Contains(err.Error(), "outside the world size") {
			t.Fatalf("rank %d: %v", rank, err)
		}
		if objs, _ := out.List(context.Background(), ""); len(objs) != 0 {
			t.Fatalf("rank %d: %d objects stored", rank, len(objs))
		}
	}
	out, _ := store.OpenDir(t.TempDir(), true)
	if _, err := Merge(context.Background(), Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)}), Out: out, WorldSize: sidecar.MaxRanks + 1}); err == nil {
		t.Fatal("a world size above MaxRanks was accepted")
	}
	// a sidecar claiming a huge world is refused too
	d := t.TempDir()
	os.WriteFile(filepath.Join(d, "rank0.5.memory_snapshot.pickle"), src, 0o644)
	os.WriteFile(filepath.Join(d, "rank0.5.memory_snapshot.memsnap.json"), []byte(`{"version":1,"rank":0,"world_size":2147483647}`), 0o644)
	if _, err := Merge(context.Background(), Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{d}), Out: out}); err == nil || !strings.Contains(err.Error(), "world size") {
		t.Fatalf("a sidecar naming world size 2^31-1: %v", err)
	}
}
