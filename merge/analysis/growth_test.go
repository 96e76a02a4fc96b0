package analysis

import (
	"math"
	"math/rand/v2"
	"testing"
)

// series is the allocated bytes at the end of every batch of a synthetic job: 4
// GiB, flat through a warm-up, then leak bytes more a batch after batch from,
// with uniform noise of ±noise bytes (seeded).
func series(batches, from int, leak, noise int64) []int64 {
	rng := rand.New(rand.NewPCG(1, 2))
	y := make([]int64, batches)
	for b := range y {
		y[b] = 4 << 30
		if b > from {
			y[b] += leak * int64(b-from)
		}
		if noise > 0 {
			y[b] += rng.Int64N(2*noise+1) - noise
		}
	}
	return y
}

// oldLiveGrowth is the live estimate before the two were one: the median of the
// per-batch rates from each report to the next.
func oldLiveGrowth(pts []GrowthPoint) float64 {
	if len(pts) < 4 {
		return 0
	}
	var r []float64
	for i := 1; i < len(pts); i++ {
		r = append(r, float64(pts[i].Bytes-pts[i-1].Bytes)/float64(pts[i].Batch-pts[i-1].Batch))
	}
	return median(r)
}

// TestGrowthLiveAgreesWithWindow: a job warms up for 42 batches, then leaks 24
// MiB a batch (±2 MiB of noise at each batch's end). Its agent sees a report
// every 8 batches and keeps the last 16; a trigger of 128 MiB over 10 batches
// fires at the first report whose growth crosses it. The old live estimate said
// 15.0 MiB a batch when it crossed (the report straddling the leak's start was
// its median), while the window taken after it found 24.0 MiB; now the live
// estimate at the trigger and the window's leak agree within 1 MiB a batch (the
// noise's share), and without noise say it alike: "24.0 MiB a batch".
func TestGrowthLiveAgreesWithWindow(t *testing.T) {
	for _, noise := range []int64{0, 2 * mib} {
		y := series(200, 42, 24*mib, noise)
		var kept []GrowthPoint
		live, old, at := 0.0, 0.0, -1
		for b := 7; b < len(y) && (at < 0 || old == 0); b += 8 {
			kept = append(kept, GrowthPoint{Batch: int64(b), Bytes: y[b]})
			kept = kept[max(len(kept)-16, 0):]
			g, steps := GrowthPerBatch(kept)
			if o := oldLiveGrowth(kept); o*10 >= 128*mib && old == 0 {
				old = o
			}
			if steps >= 3 && g*10 >= 128*mib && at < 0 {
				live, at = g, b
			}
		}
		if old == 0 || math.Abs(old-24*mib) < 5*mib {
			t.Fatalf("noise %d: the old live estimate said %s: the series does not show the disagreement", noise, GrowthText(old))
		}
		// the window: the 10 batches after the trigger, at each batch's start
		figs := make([]BatchFigure, 10)
		for i := range figs {
			figs[i] = BatchFigure{Batch: int64(at + 1 + i), StartUS: int64(i), StartAllocatedBytes: y[at+i]}
		}
		l := (&RankData{}).leak(figs, Window{})
		if l == nil {
			t.Fatalf("noise %d: no leak in the window %+v", noise, figs)
		}
		if d := math.Abs(live - float64(l.PerBatchBytes)); d > mib {
			t.Fatalf("noise %d: live %s (at batch %d), window %s: %.0f bytes apart", noise, GrowthText(live), at, GrowthText(float64(l.PerBatchBytes)), d)
		}
		if noise == 0 && (GrowthText(live) != "24.0 MiB a batch" || GrowthText(live) != GrowthText(float64(l.PerBatchBytes))) {
			t.Fatalf("live says %q, the window %q", GrowthText(live), GrowthText(float64(l.PerBatchBytes)))
		}
		t.Logf("noise %d: trigger at batch %d: old live %s, live %s, window %s", noise, at, GrowthText(old), GrowthText(live), GrowthText(float64(l.PerBatchBytes)))
	}
}

// TestGrowthPerBatch: the pace of the latest steady stretch, whatever jumped or
// went before it.
func TestGrowthPerBatch(t *testing.T) {
	pts := func(every int, y []int64) []GrowthPoint {
		var p []GrowthPoint
		for b := 0; b < len(y); b += every {
			p = append(p, GrowthPoint{Batch: int64(b), Bytes: y[b]})
		}
		return p
	}
	jumpAt := func(n, at int, leak int64) []int64 {
		y := series(n, 0, leak, 0)
		for b := at; b < n; b++ {
			y[b] += 2 << 30
		}
		return y
	}
	stops := series(30, 0, 8*mib, 0)
	for b := 20; b < 30; b++ {
		stops[b] = stops[19]
	}
	for _, c := range []struct {
		name     string
		p        []GrowthPoint
		want     float64
		within   float64
		minSteps int
	}{
		{"steady", pts(1, series(16, 0, 10*mib, 0)), 10 * mib, 0, 15},
		{"steady, a report every 5 batches", pts(5, series(80, 0, 3*mib, 0)), 3 * mib, 0, 15},
		{"a jump at the first step, then flat", pts(1, jumpAt(16, 1, 0)), 0, 0, 15},
		{"a jump in the middle, then flat", pts(1, jumpAt(16, 8, 0)), 0, 0, 15},
		{"a jump in the middle of a leak", pts(1, jumpAt(16, 8, 5*mib)), 5 * mib, 0, 15},
		{"a jump among the last three steps", pts(1, jumpAt(16, 14, 5*mib)), 5 * mib, 0, 15},
		{"a warm-up, then a leak for three steps", pts(1, series(16, 12, 24*mib, 0)), 24 * mib, 0, 15},
		{"a leak that stopped", pts(1, stops), 0, 0, 29},
		{"noise, no leak", pts(1, series(16, 0, 0, 4*mib)), 0, mib, 15},
		{"noise and a leak", pts(1, series(16, 0, 24*mib, 4*mib)), 24 * mib, mib, 15},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, steps := GrowthPerBatch(c.p)
			if math.Abs(g-c.want) > c.within || steps != c.minSteps {
				t.Fatalf("%s over %d steps, want %s ± %.0f bytes", GrowthText(g), steps, GrowthText(c.want), c.within)
			}
		})
	}
	if g, steps := GrowthPerBatch([]GrowthPoint{{0, 1}, {1, 5 * mib}}); g != 0 || steps != 1 {
		t.Fatalf("one step: %v over %d steps", g, steps)
	}
}
