package analysis

import (
	"math"
	"slices"
)

// The growth per batch is estimated once, here, for both its readers: the
// agent's live figures (the allocated bytes its trainer reported at the end of
// a batch, about once a second) and a window's leak (the allocated bytes at the
// start of each of its batches). Both say it with GrowthText.

// GrowthPoint is one reading of a series: the bytes at a batch.
type GrowthPoint struct {
	Batch int64
	Bytes int64
}

// GrowthPerBatch estimates the bytes a series adds per batch now: the mean pace,
// per batch, of its latest steady stretch. The stretch is walked back from the
// last step while the steps keep the pace of the last three (within the larger
// of LeakMinBytesPerBatch, a quarter of the pace and three times the steps'
// noise); one step off the pace (a one-time jump, such as the optimizer's state
// made at the first batch) is left out, two in a row end the stretch (a warm-up
// before a leak, or another pace). A stretch needs three steps (or every step
// of a shorter series): a pace that changed in the last steps is not told until
// it holds, the one before it is. steps is how many steps of a later batch the
// series has (0 or 1 give no estimate); perBatch is 0 where no stretch holds.
func GrowthPerBatch(pts []GrowthPoint) (perBatch float64, steps int) {
	var rates, weights []float64
	for i := 1; i < len(pts); i++ {
		if db := pts[i].Batch - pts[i-1].Batch; db > 0 {
			rates = append(rates, float64(pts[i].Bytes-pts[i-1].Bytes)/float64(db))
			weights = append(weights, float64(db))
		}
	}
	k := len(rates)
	if k < 2 {
		return 0, k
	}
	need := min(stretchSteps, k)
	noise := rateNoise(rates)
	// the latest stretch that holds, leaving out at most stretchSteps+1 last
	// steps: a new pace, and the step that straddles its start
	for e := k; e >= max(need, k-stretchSteps-1); e-- {
		pace := median(rates[e-min(stretchSteps, e) : e])
		n := 0
		// twice: the second pass measures the stretch around the first's pace,
		// which depends less on the last three steps' noise
		for range 2 {
			pace, n = stretchPace(rates[:e], weights[:e], pace, noise)
		}
		if n >= need {
			return pace, k
		}
	}
	return 0, k
}

// stretchSteps is the fewest steps a stretch is told from.
const stretchSteps = 3

// stretchPace is the weighted mean of the rates of the latest stretch that
// keeps pace (see GrowthPerBatch), and how many steps it holds; pace itself
// when none does.
func stretchPace(rates, weights []float64, pace, noise float64) (float64, int) {
	tol := max(LeakMinBytesPerBatch, math.Abs(pace)/4, 3*noise)
	var sum, w float64
	off, n := 0, 0
	for i := len(rates) - 1; i >= 0 && off < 2; i-- {
		if math.Abs(rates[i]-pace) > tol {
			off++
			continue
		}
		off = 0
		sum += rates[i] * weights[i]
		w += weights[i]
		n++
	}
	if w == 0 {
		return pace, 0
	}
	return sum / w, n
}

// rateNoise is a robust standard deviation of the rates' noise, from the
// differences of consecutive rates: a change of pace or a jump makes one or two
// large differences, which the (lower) median ignores.
func rateNoise(rates []float64) float64 {
	if len(rates) < 3 {
		return 0
	}
	d := make([]float64, 0, len(rates)-1)
	for i := 1; i < len(rates); i++ {
		d = append(d, math.Abs(rates[i]-rates[i-1]))
	}
	slices.Sort(d)
	return 1.4826 * d[(len(d)-1)/2] / math.Sqrt2
}

// median is the median of v (of its middle two when even); v is not changed.
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// GrowthText says a growth per batch the one way every reader says it, rounded
// to the byte and then to a tenth of its unit: "24.0 MiB a batch".
func GrowthText(perBatch float64) string {
	return HumanBytes(int64(math.Round(perBatch))) + " a batch"
}
