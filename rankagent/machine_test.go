package rankagent

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
)

// TestRankMachine feeds every sequence of up to six events to a window and
// checks what a rank may say of it: states only move forward, each is reported
// once when it is reached, a window ends once with the state its end names (a
// stored window's upload reports it later), and sent follows the trainer's
// connection.
func TestRankMachine(t *testing.T) {
	ends := map[rankEvent]WindowState{evCancelled: WindowCancelled, evMissed: WindowMissed, evFailed: WindowFailed, evStored: "", evCrashed: WindowPartial}
	moves := map[rankEvent]WindowState{evSent: WindowSent, evArmed: WindowArmed, evRecording: WindowRecording}
	var walk func(s onRank, depth int, path []rankEvent)
	sequences := 0
	walk = func(s onRank, depth int, path []rankEvent) {
		if depth == 0 {
			sequences++
			return
		}
		for ev := evSent; ev <= evCrashed; ev++ {
			p := append(path[:len(path):len(path)], ev)
			next, report, over := s.step(ev)
			if next.w != s.w {
				t.Fatalf("%v: the window changed", p)
			}
			if end, ok := ends[ev]; ok {
				if !over || report != end || next.state != s.state {
					t.Fatalf("%v: from %s, over=%v report %q state %s; want over, report %q, state kept", p, s.state, over, report, next.state, end)
				}
				sequences++
				continue // an ended window takes no more events
			}
			if over {
				t.Fatalf("%v: %s ended the window", p, ev)
			}
			if order[next.state] < order[s.state] {
				t.Fatalf("%v: went back from %s to %s", p, s.state, next.state)
			}
			want := s.state
			if to, ok := moves[ev]; ok && order[to] > order[s.state] {
				want = to
			}
			if next.state != want {
				t.Fatalf("%v: from %s to %s, want %s", p, s.state, next.state, want)
			}
			if (report != "") != (next.state != s.state) || (report != "" && report != next.state) {
				t.Fatalf("%v: from %s to %s reported %q", p, s.state, next.state, report)
			}
			switch ev {
			case evSent:
				if !next.sent {
					t.Fatalf("%v: not sent after sent", p)
				}
			case evUnsent:
				if next.sent {
					t.Fatalf("%v: sent after the trainer left", p)
				}
			default:
				if next.sent != s.sent {
					t.Fatalf("%v: %s changed sent", p, ev)
				}
			}
			walk(next, depth-1, p)
		}
	}
	s := newOnRank(Window{ID: 3, Start: 10, Stop: 20})
	if s.state != WindowQueued || s.sent || s.recording() {
		t.Fatalf("a new window is %+v", s)
	}
	walk(s, 6, nil)
	t.Logf("%d sequences", sequences)
}

// TestTrainerOutOfOrder has a trainer say "armed" after "recording" (a hook that
// re-sends its state on a reconnect) and then fail: the agent's window stays
// recording, the events it reports only move forward, and the failure ends the
// window once, counted as missed.
func TestTrainerOutOfOrder(t *testing.T) {
	cfg := DefaultConfig(testID(1))
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(t.TempDir(), true) }
	var mu sync.Mutex
	var seen []WindowState
	cfg.OnWindow = func(e WindowEvent) { mu.Lock(); seen = append(seen, e.State); mu.Unlock() }
	h := startAgent(t, cfg)
	c, err := net.Dial("unix", h.agent.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send := func(s string) {
		if _, err := c.Write([]byte(s + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	in := bufio.NewScanner(c)
	next := func(typ string) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		for in.Scan() {
			var m Message
			if json.Unmarshal(in.Bytes(), &m) == nil && m.Type == typ {
				return
			}
		}
		t.Fatalf("no %q message from the agent: %v", typ, in.Err())
	}
	send(`{"v":1,"type":"hello","pid":1}`)
	next("welcome")
	send(`{"type":"batch","batch":2}`)
	testutil.Eventually(t, 10*time.Second, "the agent to see batch 2", func() bool { return h.agent.Batch() == 2 })
	w := Window{ID: 5, Start: 10, Stop: 20}
	if err := h.agent.Arm(w); err != nil {
		t.Fatal(err)
	}
	next("window")
	state := func() WindowState {
		_, st, ok := h.agent.Current()
		if !ok {
			return ""
		}
		return st
	}
	send(`{"type":"recording","window":5,"batch":10}`)
	testutil.Eventually(t, 10*time.Second, "the window to be recording", func() bool { return state() == WindowRecording })
	send(`{"type":"armed","window":5}`)
	send(`{"type":"batch","batch":11}`) // handled after armed: the agent has read both
	testutil.Eventually(t, 10*time.Second, "the agent to see batch 11", func() bool { return h.agent.Batch() == 11 })
	if st := state(); st != WindowRecording {
		t.Fatalf("after a late armed the window is %q, want recording", st)
	}
	send(`{"type":"error","window":5,"code":"dump_failed","message":"disk full"}`)
	testutil.Eventually(t, 10*time.Second, "the window to end", func() bool { return state() == "" })
	testutil.Eventually(t, 10*time.Second, "the failure to be reported", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 0 && seen[len(seen)-1] == WindowFailed
	})
	mu.Lock()
	got := append([]WindowState(nil), seen...)
	mu.Unlock()
	want := []WindowState{WindowQueued, WindowSent, WindowRecording, WindowFailed}
	if len(got) != len(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("events %v, want %v", got, want)
		}
	}
	if s := h.agent.Stats(); s.WindowsMissed != 1 || s.WindowsPartial != 0 {
		t.Fatalf("stats %+v, want one missed", s)
	}
}
