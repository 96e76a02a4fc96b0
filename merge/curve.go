package merge

import (
	"encoding/json"
	"errors"
	"math/bits"
)

// CurvePoint is one step of a rank's memory curve: from time T on, A bytes
// allocated and R bytes reserved.
type CurvePoint struct {
	T, A, R int64
}

// Curve is a rank's memory curve in time order. In JSON it is three arrays of
// differences, {"t":[t0, t1-t0, ...], "a":[...], "r":[...]}, a third of the size
// of the points written out.
type Curve []CurvePoint

type curveJSON struct {
	T []int64 `json:"t"`
	A []int64 `json:"a"`
	R []int64 `json:"r"`
}

// MarshalJSON writes the curve as differences.
func (c Curve) MarshalJSON() ([]byte, error) {
	j := curveJSON{T: make([]int64, len(c)), A: make([]int64, len(c)), R: make([]int64, len(c))}
	var prev CurvePoint
	for i, p := range c {
		j.T[i], j.A[i], j.R[i] = p.T-prev.T, p.A-prev.A, p.R-prev.R
		prev = p
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads the differences back; the three arrays must be as long as
// each other and at most CurvePoints long, and time must not go backwards.
func (c *Curve) UnmarshalJSON(b []byte) error {
	var j curveJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	if len(j.T) != len(j.A) || len(j.T) != len(j.R) {
		return errors.New("merge: a curve's arrays differ in length")
	}
	if len(j.T) > CurvePoints {
		return errors.New("merge: a curve of more than CurvePoints points")
	}
	out := make(Curve, len(j.T))
	var p CurvePoint
	for i := range j.T {
		if i > 0 && j.T[i] < 0 {
			return errors.New("merge: a curve goes back in time")
		}
		next := p.T + j.T[i]
		if i > 0 && next < p.T {
			return errors.New("merge: a curve's time overflows")
		}
		p = CurvePoint{next, p.A + j.A[i], p.R + j.R[i]}
		out[i] = p
	}
	*c = out
	return nil
}

// downsampleCurve keeps at most about n points of c: the first point of each of n
// time buckets, holding the largest allocated and reserved bytes of the bucket (so
// peaks survive), and the last point, so the curve ends where the rank ends. Time
// is first made non-decreasing.
func downsampleCurve(c Curve, n int) Curve {
	for i := 1; i < len(c); i++ {
		c[i].T = max(c[i].T, c[i-1].T)
	}
	if len(c) <= n || len(c) < 2 {
		return c
	}
	t0 := c[0].T
	span := uint64(c[len(c)-1].T-t0) + 1
	out := make(Curve, 0, n+2)
	cur := uint64(1 << 63)
	for _, p := range c {
		b := scaleDiv(uint64(p.T-t0), uint64(n), span)
		if b != cur || len(out) == 0 {
			out = append(out, p)
			cur = b
			continue
		}
		last := &out[len(out)-1]
		last.A, last.R = max(last.A, p.A), max(last.R, p.R)
	}
	if last := c[len(c)-1]; out[len(out)-1].T != last.T {
		out = append(out, last)
	}
	return out
}

// scaleDiv returns d*n/span without overflow, for d < span.
func scaleDiv(d, n, span uint64) uint64 {
	if span == 0 {
		return 0
	}
	hi, lo := bits.Mul64(d, n)
	if hi >= span { // d >= span: clamp to the last bucket
		return n
	}
	q, _ := bits.Div64(hi, lo, span)
	return q
}
