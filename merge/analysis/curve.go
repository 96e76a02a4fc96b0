package analysis

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
	j, ok := parseCurveJSON(b)
	if !ok {
		j = curveJSON{} // nothing of what the fast path read half-way
		if err := json.Unmarshal(b, &j); err != nil {
			return err
		}
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

// DownsampleCurve keeps at most about n points of c: the first point of each of n
// time buckets, holding the largest allocated and reserved bytes of the bucket (so
// peaks survive), and the last point, so the curve ends where the rank ends. Time
// is first made non-decreasing.
func DownsampleCurve(c Curve, n int) Curve {
	for i := 1; i < len(c); i++ {
		c[i].T = max(c[i].T, c[i-1].T)
	}
	if len(c) <= n || len(c) < 2 {
		return c
	}
	// n-1 buckets, and the last point after them: never more than n points (an
	// analysis's curve of n+1 points was refused by its reader, and its rank's
	// snapshot decoded again by the leader)
	buckets := uint64(max(n-1, 1))
	t0 := c[0].T
	span := uint64(c[len(c)-1].T-t0) + 1
	out := make(Curve, 0, n+1)
	cur := uint64(1 << 63)
	for _, p := range c {
		b := ScaleDiv(uint64(p.T-t0), buckets, span)
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

// ScaleDiv returns d*n/span without overflow, for d < span.
func ScaleDiv(d, n, span uint64) uint64 {
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

// parseCurveJSON reads a curve as MarshalJSON writes it, {"t":[..],"a":[..],"r":[..]}
// (keys in any order, spaces between tokens), without reflection: a leader reads
// 1,024 of them for an answer. Anything else (another key, a key twice, a number
// that is not a JSON integer in int64) is not ok, and encoding/json reads it.
func parseCurveJSON(b []byte) (curveJSON, bool) {
	var j curveJSON
	p := curveParser{b: b}
	if !p.take('{') {
		return j, false
	}
	var seen [3]bool
	for k := 0; k < 3; k++ {
		if k > 0 && !p.take(',') {
			return j, false
		}
		if !p.take('"') || p.i+2 > len(p.b) || p.b[p.i+1] != '"' {
			return j, false
		}
		var dst *[]int64
		var n int
		switch p.b[p.i] {
		case 't':
			dst, n = &j.T, 0
		case 'a':
			dst, n = &j.A, 1
		case 'r':
			dst, n = &j.R, 2
		default:
			return j, false
		}
		if seen[n] {
			return j, false
		}
		seen[n] = true
		p.i += 2
		if !p.take(':') {
			return j, false
		}
		v, ok := p.ints()
		if !ok {
			return j, false
		}
		*dst = v
	}
	if !p.take('}') {
		return j, false
	}
	p.space()
	return j, p.i == len(p.b)
}

type curveParser struct {
	b []byte
	i int
}

func (p *curveParser) space() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\n' || p.b[p.i] == '\t' || p.b[p.i] == '\r') {
		p.i++
	}
}

// take skips spaces and then c.
func (p *curveParser) take(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// ints reads an array of JSON integers that fit in int64 (at most CurvePoints+1
// of them: a longer curve is refused by the caller anyway, through encoding/json).
func (p *curveParser) ints() ([]int64, bool) {
	if !p.take('[') {
		return nil, false
	}
	out := []int64{}
	if p.take(']') {
		return out, true
	}
	for {
		p.space()
		v, ok := p.int()
		if !ok || len(out) > CurvePoints {
			return nil, false
		}
		out = append(out, v)
		if p.take(']') {
			return out, true
		}
		if !p.take(',') {
			return nil, false
		}
	}
}

// int reads a JSON integer: -?(0|[1-9][0-9]*), in int64.
func (p *curveParser) int() (int64, bool) {
	neg := p.i < len(p.b) && p.b[p.i] == '-'
	if neg {
		p.i++
	}
	start := p.i
	var u uint64
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		if p.i-start >= 19 { // 19 digits always fit in a uint64; more are left to encoding/json
			return 0, false
		}
		u = u*10 + uint64(p.b[p.i]-'0')
		p.i++
	}
	switch n := p.i - start; {
	case n == 0, n > 1 && p.b[start] == '0':
		return 0, false
	case p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E'):
		return 0, false
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return -int64(u), true
	}
	if u > 1<<63-1 {
		return 0, false
	}
	return int64(u), true
}
