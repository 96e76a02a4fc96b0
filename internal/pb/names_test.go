package pb

import "testing"

// TestNames: every enum value reads as its generated name does, less the prefix
// its enum shares, and parses back.
func TestNames(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{Name(Step_STEP_UPLOADED), "uploaded"},
		{Name(Step_STEP_UNSPECIFIED), "unspecified"},
		{Name(AckCode_ACK_STALE_TERM), "stale term"},
		{Name(AckCode_ACK_NOT_LEADER), "not leader"},
		{Name(WindowKind_WINDOW_KIND_OOM), "oom"},
		{Name(WindowKind_WINDOW_KIND_WINDOW), "window"},
		{Name(Outcome_OUTCOME_UNFINISHED), "unfinished"},
		{Name(Step(999)), "unknown"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	for n := range Step_name {
		s := Step(n)
		if back, ok := Parse[Step](Name(s)); !ok || back != s {
			t.Errorf("%v reads %q, which parses to %v %v", s, Name(s), back, ok)
		}
	}
	if k, ok := Parse[WindowKind]("crash"); !ok || k != WindowKind_WINDOW_KIND_CRASH {
		t.Errorf("crash parses to %v %v", k, ok)
	}
	if _, ok := Parse[Outcome]("nothing"); ok {
		t.Error("an unknown name parsed")
	}
}

// TestLowerNames: a value's lower-case name keeps its underscores, and parses
// back, for every value of every enum.
func TestLowerNames(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{Lower(Action_FREE_REQUESTED), "free_requested"},
		{Lower(Action_ALLOC), "alloc"},
		{Lower(Action_ACTION_UNSPECIFIED), "action_unspecified"},
		{Lower(Step_STEP_UPLOADED), "uploaded"},
		{Lower(AckCode_ACK_STALE_TERM), "stale_term"},
		{Lower(WindowKind_WINDOW_KIND_OOM), "oom"},
		{Lower(Action(999)), ""},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	for n := range Action_name {
		a := Action(n)
		if back, ok := ParseLower[Action](Lower(a)); !ok || back != a {
			t.Errorf("%v reads %q, which parses to %v %v", a, Lower(a), back, ok)
		}
	}
	for n := range Step_name {
		s := Step(n)
		if back, ok := ParseLower[Step](Lower(s)); !ok || back != s {
			t.Errorf("%v reads %q, which parses to %v %v", s, Lower(s), back, ok)
		}
	}
	if _, ok := ParseLower[Action]("free requested"); ok {
		t.Error("a name with a space parsed")
	}
}
