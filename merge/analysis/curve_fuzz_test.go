package analysis

import (
	"encoding/json"
	"slices"
	"testing"
)

// FuzzCurveJSON: whatever the fast reader of a curve accepts, encoding/json reads
// the same way, and a curve written by MarshalJSON is always read by it.
func FuzzCurveJSON(f *testing.F) {
	for _, s := range []string{
		`{"t":[1,2,3],"a":[0,-5,9223372036854775807],"r":[0,0,-9223372036854775808]}`,
		` { "r" : [ ] , "a" : [ ] , "t" : [ ] } `,
		`{"t":[1],"a":[2],"r":[3],"t":[4]}`, `{"t":[01],"a":[],"r":[]}`, `{"t":[1.5],"a":[],"r":[]}`,
		`{"t":[9223372036854775808],"a":[],"r":[]}`, `{"T":[1],"a":[2],"r":[3]}`, `{"t":[1e3],"a":[],"r":[]}`,
		`{"t":[-0],"a":[-],"r":[]}`, `{"t":[1],"a":[2],"r":[3]}x`, `{"t":[99999999999999999999],"a":[],"r":[]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, ok := parseCurveJSON(b)
		var slow curveJSON
		err := json.Unmarshal(b, &slow)
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("%q: the fast reader took it, encoding/json says %v", b, err)
		}
		if !slices.Equal(fast.T, slow.T) || !slices.Equal(fast.A, slow.A) || !slices.Equal(fast.R, slow.R) {
			t.Fatalf("%q: fast %+v, encoding/json %+v", b, fast, slow)
		}
	})
}

// TestCurveJSONFastPath: a curve as MarshalJSON writes it takes the fast reader,
// and comes back the same.
func TestCurveJSONFastPath(t *testing.T) {
	c := Curve{{T: 10, A: 5, R: 8}, {T: 12, A: -3, R: 8}, {T: 12, A: 1 << 40, R: 1 << 41}}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := parseCurveJSON(b); !ok {
		t.Fatalf("MarshalJSON's %s does not take the fast reader", b)
	}
	var back Curve
	if err := json.Unmarshal(b, &back); err != nil || !slices.Equal(back, c) {
		t.Fatalf("read back %v (%v), wrote %v", back, err, c)
	}
}
