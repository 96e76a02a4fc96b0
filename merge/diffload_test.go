package merge

import "testing"

// TestFileLabels: a diff's two columns are told apart by the folders above
// files of one name (two windows' merged.memsnap.pb), and are their names
// alone otherwise.
func TestFileLabels(t *testing.T) {
	for _, c := range []struct {
		a, b   string
		rank   int
		la, lb string
	}{
		{"A/merged.memsnap.pb", "B/merged.memsnap.pb", 3, "A/merged.memsnap.pb#rank3", "B/merged.memsnap.pb#rank3"},
		{"s3://bkt/gpt/torch_memory_traces/window3/merged.memsnap.pb", "s3://bkt/gpt/torch_memory_traces/window7/merged.memsnap.pb", 0,
			"window3/merged.memsnap.pb#rank0", "window7/merged.memsnap.pb#rank0"},
		{"runs/a/w1/merged.memsnap.pb", "runs/b/w1/merged.memsnap.pb", 2, "a/w1/merged.memsnap.pb#rank2", "b/w1/merged.memsnap.pb#rank2"},
		{"rank1.5.memory_snapshot.pickle", "x/rank3.5.memory_snapshot.pickle", 3, "rank1.5.memory_snapshot.pickle", "rank3.5.memory_snapshot.pickle"},
		{"merged.memsnap.pb", "./merged.memsnap.pb", 1, "A: merged.memsnap.pb#rank1", "B: merged.memsnap.pb#rank1"},
	} {
		if la, lb := FileLabels(c.a, c.b, c.rank); la != c.la || lb != c.lb {
			t.Errorf("FileLabels(%q, %q) = %q, %q; want %q, %q", c.a, c.b, la, lb, c.la, c.lb)
		}
	}
}
