package render

import (
	"testing"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// TestActionCodes: the timeline codes every action as the table it had did
// (the action's name is the generated enum name in lower case), and reads every
// code back to the same name; any other action is OTHER, its name kept among
// the timeline's strings.
func TestActionCodes(t *testing.T) {
	table := map[string]pb.Action{ // the table actionCode was
		snapshot.ActionAlloc: pb.Action_ALLOC, snapshot.ActionFreeRequested: pb.Action_FREE_REQUESTED,
		snapshot.ActionFreeCompleted: pb.Action_FREE_COMPLETED, snapshot.ActionSegmentAlloc: pb.Action_SEGMENT_ALLOC,
		snapshot.ActionSegmentFree: pb.Action_SEGMENT_FREE, snapshot.ActionSegmentMap: pb.Action_SEGMENT_MAP,
		snapshot.ActionSegmentUnmap: pb.Action_SEGMENT_UNMAP, snapshot.ActionSnapshot: pb.Action_SNAPSHOT,
		snapshot.ActionOOM: pb.Action_OOM, snapshot.ActionAnnotate: pb.Action_ANNOTATE,
	}
	tl := &pb.Timeline{Strings: []string{"", "kept"}}
	for n := range pb.Action_name {
		code := pb.Action(n)
		name := actionName(tl, &pb.Event{Action: code, ActionName: 1})
		want, inTable := "kept", false
		for a, c := range table {
			if c == code {
				want, inTable = a, true
			}
		}
		if name != want {
			t.Errorf("%v reads back as %q, want %q", code, name, want)
		}
		if inTable && actionCode(name) != code {
			t.Errorf("%q is coded %v, want %v", name, actionCode(name), code)
		}
	}
	for a, c := range table {
		if actionCode(a) != c {
			t.Errorf("%q is coded %v, want %v", a, actionCode(a), c)
		}
	}
	for _, a := range []string{"other", "action_unspecified", "ALLOC", "free requested", "", "workspace_snapshot"} {
		if actionCode(a) != pb.Action_OTHER {
			t.Errorf("%q is coded %v, want OTHER", a, actionCode(a))
		}
	}
	if name := actionName(tl, &pb.Event{Action: pb.Action(99), ActionName: 1}); name != "kept" {
		t.Errorf("a code the enum does not name reads back as %q", name)
	}
}
