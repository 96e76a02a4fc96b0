package leader

import (
	"testing"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/runlog"
)

// TestKindNames: the run's log's kinds are the names kindName derives from
// pb.WindowKind, and read back as the same kinds.
func TestKindNames(t *testing.T) {
	for k, want := range map[pb.WindowKind]string{
		pb.WindowKind_WINDOW_KIND_UNSPECIFIED: runlog.KindWindow,
		pb.WindowKind_WINDOW_KIND_WINDOW:      runlog.KindWindow,
		pb.WindowKind_WINDOW_KIND_OOM:         runlog.KindOOM,
		pb.WindowKind_WINDOW_KIND_CRASH:       runlog.KindCrash,
		pb.WindowKind_WINDOW_KIND_TRIGGER:     runlog.KindTrigger,
	} {
		if got := kindName(k); got != want {
			t.Errorf("%v is named %q, the run's log says %q", k, got, want)
		}
		if k != pb.WindowKind_WINDOW_KIND_UNSPECIFIED && kindOf(want) != k {
			t.Errorf("%q reads back as %v, want %v", want, kindOf(want), k)
		}
	}
	if n := len(pb.WindowKind_name); n != 5 {
		t.Errorf("pb.WindowKind has %d values: name the new ones in the run's log (runlog.Kind*) and here", n)
	}
}
