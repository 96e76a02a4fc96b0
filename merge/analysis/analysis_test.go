package analysis

import (
	"context"
	"encoding/json"
	"os"
	"reflect"
	"testing"

	"github.com/memsnap/memsnap/internal/digest"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/snapshot"
)

func TestStackPhase(t *testing.T) {
	f := func(name, file string) *snapshot.Frame { return &snapshot.Frame{Name: name, Filename: file} }
	cases := []struct {
		frames []*snapshot.Frame
		want   string
	}{
		{[]*snapshot.Frame{f("_multi_tensor_adam", "/usr/lib/python3/site-packages/torch/optim/adam.py"), f("<module>", "train.py")}, PhaseOptimizer},
		{[]*snapshot.Frame{f("_make_grads", "/x/torch/autograd/__init__.py"), f("backward", "/x/torch/_tensor.py"), f("<module>", "train.py")}, PhaseBackward},
		{[]*snapshot.Frame{f("forward", "model.py"), f("apply", "/x/torch/autograd/function.py"), f("<module>", "train.py")}, PhaseForward},
		{[]*snapshot.Frame{f("forward", "/x/torch/nn/modules/linear.py"), f("<module>", "train.py")}, PhaseForward},
		{[]*snapshot.Frame{f("torch::autograd::Engine::thread_main(...)", "??")}, PhaseBackward},
		{[]*snapshot.Frame{f("optimizer_step", "/x/lightning/pytorch/core/module.py")}, PhaseOptimizer},
		{nil, ""},
		{[]*snapshot.Frame{f("c10::cuda::alloc", "??")}, ""},
	}
	for i, c := range cases {
		if got := stackPhase(c.frames); got != c.want {
			t.Errorf("case %d: %q, want %q", i, got, c.want)
		}
	}
	// an event without a stack takes the phase of the nearest earlier one with one
	tr := []*snapshot.TraceEntry{{Frames: cases[1].frames}, {}, {}}
	if got := peakPhase(tr, 2); got != PhaseBackward {
		t.Fatalf("peakPhase: %q", got)
	}
	if got := peakPhase(tr, -1); got != "" {
		t.Fatalf("peakPhase at the start: %q", got)
	}
}

// TestAnalysisRoundTrips: an analysis reads back as it was written, and a curve
// is a third of the bytes of its points written out.
func TestAnalysisRoundTrips(t *testing.T) {
	data, _ := os.ReadFile(testutil.Snapshot(t, "single/transformer.memory_snapshot.pickle"))
	a, err := Analyze(context.Background(), data, nil, AnalyzeOptions{Rank: 5})
	if err != nil {
		t.Fatal(err)
	}
	if a.Rank != 5 || len(a.Curve) < 10 || a.Snapshot.SHA256 != digest.SHA256Hex(data) || len(a.Sites) == 0 {
		t.Fatalf("analysis: rank %d, %d points, %d sites", a.Rank, len(a.Curve), len(a.Sites))
	}
	b := marshal(t, a)
	back, err := ParseAnalysis(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, back) {
		t.Fatal("the analysis changed through JSON")
	}
	if AnalysisName("x/rank3.5.memory_snapshot.pickle.zst") != "x/rank3.5.memory_snapshot.analysis.json" {
		t.Fatal(AnalysisName("x/rank3.5.memory_snapshot.pickle.zst"))
	}
}

// TestDownsampleKeepsPeaks: a long curve is cut to CurvePoints points and its
// peaks (allocated and reserved) survive.
func TestDownsampleKeepsPeaks(t *testing.T) {
	var c Curve
	for i := int64(0); i < 100000; i++ {
		c = append(c, CurvePoint{T: i * 10, A: i % 977, R: (i * 7) % 1013})
	}
	c[54321].A, c[12345].R = 1<<40, 1<<41
	d := DownsampleCurve(append(Curve(nil), c...), CurvePoints)
	var ma, mr int64
	for _, p := range d {
		ma, mr = max(ma, p.A), max(mr, p.R)
	}
	if len(d) > CurvePoints || ma != 1<<40 || mr != 1<<41 || d[len(d)-1] != c[len(c)-1] {
		t.Fatalf("%d points, peaks %d %d", len(d), ma, mr)
	}
	// what a rank writes, its leader reads (a curve of CurvePoints+1 points was
	// refused, and every large rank's snapshot decoded again)
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	var back Curve
	if err := json.Unmarshal(b, &back); err != nil || len(back) != len(d) {
		t.Fatalf("the downsampled curve does not read back: %v (%d points of %d)", err, len(back), len(d))
	}
}

func marshal(t testing.TB, a *RankAnalysis) []byte {
	b, err := a.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
