package merge

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/naming"
)

// seedSidecar is a sidecar as a rank agent writes it: rank r of world, window 3
// over batches [5, 8).
func seedSidecar(r, world int) sidecar.RankMeta {
	off, rtt := int64(-1200+100*r), int64(300)
	m := sidecar.RankMeta{Version: 1, RunName: "gpt", Rank: r, LocalRank: r % 8, NodeRank: r / 8, WorldSize: world, LocalWorldSize: 8, Hostname: "node001",
		GPU:    &sidecar.GPUInfo{UUID: "GPU-5c1b3f3e-0000-4000-8000-00000000000" + strconv.Itoa(r%10), Name: "NVIDIA H200", TotalBytes: 150 << 30, PCIBusID: "00000000:19:00.0"},
		Window: &sidecar.WindowInfo{ID: 3, Start: 5, Stop: 8}, ClockOffsetUS: &off, ClockRTTUS: &rtt, Reason: "window", StallUS: 2500}
	for b := int64(5); b < 8; b++ {
		t := 1700000000000000 + b*150000
		m.Batches = append(m.Batches, sidecar.BatchMark{Batch: b, StartUS: t, EndUS: t + 140000})
		m.Samples = append(m.Samples, sidecar.MemorySample{TimeUS: t + 10, DeviceUsedBytes: 40 << 30, ProcessUsedBytes: 38 << 30})
	}
	return m
}

// manifestSeeds merges the recorded 4-rank job into folder stores, once as it is
// and once as a window of a world of 5 whose ranks wrote sidecars (rank 4
// missing), and returns the two manifests.
func manifestSeeds(t testing.TB) [][]byte {
	src := filepath.Dir(testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle"))
	withMeta := t.TempDir()
	for r := 0; r < 4; r++ {
		name := fmt.Sprintf("rank%d.5.memory_snapshot.pickle", r)
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		mb, _ := json.Marshal(seedSidecar(r, 5))
		if err := os.WriteFile(filepath.Join(withMeta, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(withMeta, sidecar.MetaName(name)), mb, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out [][]byte
	for _, c := range []struct {
		dir string
		cfg Config
	}{
		{src, Config{Title: "ddp4"}},
		{withMeta, Config{Window: &sidecar.WindowInfo{ID: 3, Start: 5, Stop: 8}, MissingReasons: map[int]string{4: "unreachable"}, Reason: "schedule", Align: AlignOffsets}},
	} {
		r := &Resolver{Template: naming.MustParse(naming.ComposerSnapshotName)}
		ins, err := r.Resolve(context.Background(), []string{c.dir}, nil)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		st, err := store.OpenDir(dir, true)
		if err != nil {
			t.Fatal(err)
		}
		c.cfg.Inputs, c.cfg.Out, c.cfg.Logger, c.cfg.TempDir = ins, st, slog.New(slog.DiscardHandler), t.TempDir()
		if _, err := Merge(context.Background(), c.cfg); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "merged.manifest.json"))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// brokenManifests are manifests ParseManifest refuses, each a small change of a
// valid one.
var brokenManifests = []string{
	`{"version":2,"outputs":{}}`,
	`{"version":1,"world_size":-1}`,
	`{"version":1,"world_size":65537}`,
	`{"version":1,"outputs":{"html":{"name":"../merged.html","size":1,"sha256":"` + strings.Repeat("0", 64) + `"}}}`,
	`{"version":1,"outputs":{"html":{"name":"a/merged.html","size":1,"sha256":"` + strings.Repeat("0", 64) + `"}}}`,
	`{"version":1,"outputs":{"html":{"name":"a\\merged.html","size":1,"sha256":"` + strings.Repeat("0", 64) + `"}}}`,
	`{"version":1,"outputs":{"html":{"name":"a\u002fb","size":1,"sha256":"` + strings.Repeat("0", 64) + `"}}}`,
	`{"version":1,"outputs":{"html":{"name":"..","size":1,"sha256":"` + strings.Repeat("0", 64) + `"}}}`,
	`{"version":1,"outputs":{"html":{"name":".","size":1,"sha256":"` + strings.Repeat("0", 64) + `"}}}`,
	`{"version":1,"outputs":{"html":{"name":"","size":1,"sha256":"` + strings.Repeat("0", 64) + `"}}}`,
	`{"version":1,"outputs":{"html":{"name":"m\u0001","size":1,"sha256":"` + strings.Repeat("0", 64) + `"}}}`,
	`{"version":1,"outputs":{"html":{"name":"m","size":-1,"sha256":"` + strings.Repeat("0", 64) + `"}}}`,
	`{"version":1,"outputs":{"html":{"name":"m","size":1,"sha256":"` + strings.Repeat("z", 64) + `"}}}`,
	`{"version":1,"claim":{"name":"../inputs.json","size":1,"sha256":"` + strings.Repeat("0", 64) + `"}}`,
	`{"version":1,"world_size":4,"ranks_merged":[0,4]}`,
	`{"version":1,"missing_ranks":[-1]}`,
	`{"version":1,"world_size":4,"outlier_rank":9}`,
	`{"version":1,"missing_reasons":{"x":"gone"}}`,
	`{"version":1,"missing_reasons":{"01":"gone"}}`,
	`{"version":1,"missing_ranks":[4294967296]}`,
	`{"version":1,"pending":["html"]}`,
	`{"version":1,"pending":["pickle","pb","pickle"]}`,
	`{"version":1,"state":"claimed"}`,                 // a claim of no term
	`{"version":1,"state":"claimed","attempt":"t01"}`, // not a term's name
	`{"version":1,"state":"claimed","attempt":"t3","outputs":{"html":{"name":"m","size":1,"sha256":"` + strings.Repeat("0", 64) + `"}}}`,
	`{"version":1`,
	`[]`,
	`null`,
}

// FuzzParseManifest: ParseManifest never panics, and what it accepts names only
// plain files beside the manifest and ranks inside the world, and reads the same
// once re-marshalled.
func FuzzParseManifest(f *testing.F) {
	for _, b := range manifestSeeds(f) {
		f.Add(b)
	}
	f.Add([]byte(`{"version":1,"claim":{"name":"m.inputs.json","size":10,"sha256":"` + strings.Repeat("ab", 32) + `"},` +
		`"outputs":{"html":{"name":"m.html","size":0,"sha256":"` + strings.Repeat("AB", 32) + `"}},"inputs":[{"rank":-1,"source":"x.memsnap.pb","size":1,"sha256":""}],` +
		`"window":{"id":1,"start":0,"stop":2},"world_size":2,"ranks_merged":[0],"missing_ranks":[1],"missing_reasons":{"1":"no snapshot"},` +
		`"clock_offsets_us":{"0":-5},"align":"wall","batches":[0,1],"outlier_rank":0,"reason":"oom"}`))
	f.Add([]byte(`{"version":1,"batches":[],"missing_reasons":{}}`))
	f.Add([]byte(`{"version":1,"pending":["pickle","pb"],"claim":{"name":"m.inputs.json","size":10,"sha256":"` + strings.Repeat("ab", 32) + `"}}`))
	f.Add([]byte(`{"version":1,"pending":[]}`))
	f.Add([]byte(`{"version":1,"state":"claimed","attempt":"t7","window":{"id":3},"world_size":4,"ranks_merged":[],"missing_ranks":[]}`))
	for _, s := range brokenManifests {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := publish.ParseManifest(b)
		if err != nil {
			if m != nil {
				t.Fatalf("refused with %v but returned a manifest", err)
			}
			return
		}
		checkManifest(t, m)
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("an accepted manifest does not marshal: %v", err)
		}
		m2, err := publish.ParseManifest(again)
		if err != nil {
			t.Fatalf("an accepted manifest, re-marshalled, is refused: %v\n%s", err, again)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("a round trip changed the manifest:\n%#v\n%#v", m, m2)
		}
	})
}

// checkManifest checks an accepted manifest against the rules its readers rely
// on, independently of ParseManifest.
func checkManifest(t *testing.T, m *publish.Manifest) {
	t.Helper()
	if m.Version != 1 || m.WorldSize < 0 || m.WorldSize > sidecar.MaxRanks {
		t.Fatalf("accepted version %d, world size %d", m.Version, m.WorldSize)
	}
	plain := func(what string, o publish.Object) {
		if o.Name == "" || o.Name == "." || o.Name == ".." || strings.ContainsAny(o.Name, "/\\") || o.Size < 0 || len(o.SHA256) != 64 {
			t.Fatalf("accepted %s %+v", what, o)
		}
		if _, err := hex.DecodeString(o.SHA256); err != nil {
			t.Fatalf("accepted %s %+v", what, o)
		}
		if _, err := naming.CleanKey(o.Name); err != nil {
			t.Fatalf("accepted %s %+v: %v", what, o, err)
		}
	}
	for k, o := range m.Outputs {
		plain("output "+k, o)
	}
	if m.Claim != (publish.Object{}) {
		plain("claim", m.Claim)
	}
	rank := func(r int) {
		if r < 0 || r >= sidecar.MaxRanks || (m.WorldSize > 0 && r >= m.WorldSize) {
			t.Fatalf("accepted rank %d of world size %d", r, m.WorldSize)
		}
	}
	for _, r := range m.RanksMerged {
		rank(r)
	}
	for _, r := range m.MissingRanks {
		rank(r)
	}
	if m.OutlierRank != nil {
		rank(*m.OutlierRank)
	}
	for k := range m.MissingReasons {
		r, err := strconv.Atoi(k)
		if err != nil {
			t.Fatalf("accepted a missing reason for %q", k)
		}
		rank(r)
	}
	for _, k := range m.Pending {
		if k != publish.OutPickle && k != publish.OutPB || len(m.Pending) > 2 {
			t.Fatalf("accepted pending outputs %q", m.Pending)
		}
	}
}

// TestParseSeeds: the seeds are what they say: real manifests are accepted,
// broken ones refused.
func TestParseSeeds(t *testing.T) {
	for i, b := range manifestSeeds(t) {
		m, err := publish.ParseManifest(b)
		if err != nil {
			t.Fatalf("manifest %d: %v\n%s", i, err, b)
		}
		if len(m.Outputs) != 5 || len(m.RanksMerged) != 4 {
			t.Fatalf("manifest %d: %s", i, b)
		}
		if i == 1 && (m.WorldSize != 5 || len(m.Batches) != 3 || m.MissingReasons["4"] != "unreachable") {
			t.Fatalf("manifest %d: %s", i, b)
		}
	}
	for _, s := range brokenManifests {
		if _, err := publish.ParseManifest([]byte(s)); err == nil {
			t.Errorf("accepted %s", s)
		}
	}
}
