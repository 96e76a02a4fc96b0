package analysis

import (
	"math"
	"testing"
	"time"

	"github.com/memsnap/memsnap/merge/internal/testjob"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// withGradientsMade replaces the synthetic job's gradients_made with v.
func withGradientsMade(s *snapshot.Snapshot, v snapshot.Value) {
	d := s.Extra[0].Value.(*snapshot.Dict)
	for i, it := range d.Items {
		if it.Key == "gradients_made" {
			d.Items[i].Value = v
			return
		}
	}
	d.Items = append(d.Items, snapshot.Item{Key: "gradients_made", Value: v})
}

func checkAddsUp(t *testing.T, name string, a *RankAnalysis) {
	t.Helper()
	var sum int64
	for _, v := range a.Categories.AtPeak {
		if v < 0 {
			t.Fatalf("%s: a negative category: %v", name, a.Categories.AtPeak)
		}
		sum += v
	}
	if sum != a.PeakAllocatedBytes {
		t.Fatalf("%s: the categories %v add up to %d, the peak is %d", name, a.Categories.AtPeak, sum, a.PeakAllocatedBytes)
	}
}

// TestHostileGradientsMade: gradients_made entries of every wrong shape (wrong
// types, negative or overflowing figures, absurd batches, duplicates, a million
// at one address, the list holding itself), and batch marks out of order or
// overlapping: the analysis neither fails nor takes long, and the categories add
// up to the peak.
func TestHostileGradientsMade(t *testing.T) {
	const t0 = 1_700_000_000_000_000
	job := testjob.Job{Batches: 6, Watch: true, GradFlip: true, MadeNotes: true, OptTemp: true}
	note := func(v ...snapshot.Value) snapshot.Value { return &snapshot.List{Items: v} }
	self := &snapshot.List{}
	self.Items = []snapshot.Value{self, self, self, self}
	const base = 1 << 40
	g0 := int64(base + 256*mib)
	odd := &snapshot.List{Items: []snapshot.Value{
		note(), note(g0), note(g0, int64(32*mib), "fc2"), // short
		note(float64(g0), int64(32*mib), "fc2", int64(0)), note(g0, "32", "fc2", int64(0)), note(g0, int64(32*mib), int64(5), int64(0)),
		note(g0, int64(32*mib), "fc2", float64(0)), note(g0, int64(32*mib), "fc2", true), note(g0, int64(32*mib), "fc2", nil),
		note(g0, int64(32*mib), "fc2", int64(-1)), note(g0, int64(32*mib), "fc2", int64(math.MinInt64)),
		note(g0, int64(32*mib), "fc2", int64(math.MaxInt64)), note(int64(0), int64(32*mib), "fc2", int64(0)),
		note(g0, int64(-32*mib), "fc2", int64(0)), note(int64(math.MaxInt64-5), int64(10), "fc2", int64(0)),
		note(g0, int64(math.MaxInt64-g0), "fc2", int64(0)), note(g0, int64(1), "fc2", int64(0)),
		snapshot.Tuple{g0, int64(32 * mib), "fc2", int64(0), "extra"}, self, "x", int64(3), nil,
		&snapshot.Dict{Items: []snapshot.Item{{Key: "a", Value: g0}}},
	}}
	for b := range 20 { // duplicates
		odd.Items = append(odd.Items, note(g0, int64(32*mib), "fc2", int64(b%3*2))) // g0 holds the even batches' gradients
	}
	many := &snapshot.List{}
	for i := range maxWatched + 1000 { // a million notes, at one address and at many
		addr := g0
		if i%2 == 1 {
			addr = base + int64(i)*4096
		}
		many.Items = append(many.Items, note(addr, int64(512+i), "m", int64(i%7)))
	}
	cases := []struct {
		name string
		v    snapshot.Value
	}{
		{"odd entries", odd}, {"a million", many}, {"itself", self},
		{"a tuple", snapshot.Tuple{note(g0, int64(32*mib), "fc2", int64(0))}}, {"a dict", &snapshot.Dict{}}, {"a string", "gradients"}, {"none", nil},
	}
	marks := map[string]func([]sidecar.BatchMark) []sidecar.BatchMark{
		"as told": func(m []sidecar.BatchMark) []sidecar.BatchMark { return m },
		"out of order": func(m []sidecar.BatchMark) []sidecar.BatchMark {
			m[1], m[2] = m[2], m[1]
			return m
		},
		"overlapping": func(m []sidecar.BatchMark) []sidecar.BatchMark {
			m[2].StartUS = m[1].StartUS + 10
			return m
		},
		"reversed": func(m []sidecar.BatchMark) []sidecar.BatchMark {
			m[3].StartUS, m[3].EndUS = m[3].EndUS, m[3].StartUS
			return m
		},
		"absurd batches": func(m []sidecar.BatchMark) []sidecar.BatchMark {
			m[0].Batch, m[1].Batch, m[2].Batch = -1, math.MaxInt64, math.MinInt64
			return m
		},
		"one batch twice": func(m []sidecar.BatchMark) []sidecar.BatchMark {
			m[3].Batch = m[2].Batch
			return m
		},
	}
	for _, c := range cases {
		for mn, mf := range marks {
			if c.v == many && mn != "as told" {
				continue // once is enough (a second each)
			}
			s, meta := job.Build(t0)
			withGradientsMade(s, c.v)
			meta.Batches = mf(meta.Batches)
			start := time.Now()
			a, err := AnalyzeSnapshot(t.Context(), s, meta, AnalyzeOptions{Rank: -1})
			if err != nil {
				t.Fatalf("%s, marks %s: %v", c.name, mn, err)
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Fatalf("%s, marks %s: %v", c.name, mn, d)
			}
			checkAddsUp(t, c.name+", marks "+mn, a)
			if at := a.Categories.AtPeak; c.v == odd && mn == "as told" && (at[CatGradients] != 32*mib || at[CatTemporaries] != 32*mib) {
				t.Fatalf("odd entries beside good ones: at the peak %v, want 32 MiB of gradients and of temporaries", at)
			}
		}
	}
}
