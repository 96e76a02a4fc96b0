package rankagent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/memsnap/memsnap/merge/snapshot"
)

// ReplayConfig configures a replay trainer: a stand-in for a training process that
// speaks the hook's socket protocol and answers a window with a real recorded
// snapshot's events, shifted into the window's time.
type ReplayConfig struct {
	Socket   string        // the agent's trainer socket
	Snapshot []byte        // a torch snapshot pickle to replay
	Batches  int64         // how many batches to run (0: until ctx ends)
	Pace     time.Duration // the length of one batch (default 20ms)
	// HoldAt lists batches before which the trainer waits until it has a window
	// (or ctx ends): a trainer slow at those points, so tests and the demo never
	// depend on how fast the machine is.
	HoldAt []int64
	// OOMAt, when above zero, makes the trainer hit an out-of-memory error at the
	// start of that batch: it dumps a snapshot (reason "oom"), as the hook's OOM
	// observer does, and stops.
	OOMAt int64
	// HangInWindow makes the trainer stop in the first batch of a window it records,
	// as a stuck rank would (tests of ranks that die mid-window).
	HangInWindow bool
	Rank         int
	UUID         string // the device UUID reported in hello
	Logger       *slog.Logger
}

// Replay runs the replay trainer until its batches are done or ctx ends. Like the
// Python hook, it keeps training when the agent is absent and reconnects when it
// returns, reports a window whose start it has passed, and records a window only
// from its first batch.
func Replay(ctx context.Context, cfg ReplayConfig) error {
	if cfg.Pace <= 0 {
		cfg.Pace = 20 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	base, err := snapshot.DecodeAny(cfg.Snapshot)
	if err != nil {
		return fmt.Errorf("rankagent: replay snapshot: %w", err)
	}
	rt := &replay{cfg: cfg, base: base, log: cfg.Logger.With("replay_rank", cfg.Rank), batch: -1, got: make(chan struct{}, 1)}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer rt.close()
	return rt.run(ctx, &wg)
}

type replay struct {
	cfg  ReplayConfig
	base *snapshot.Snapshot
	log  *slog.Logger
	got  chan struct{} // a window arrived

	mu        sync.Mutex
	conn      net.Conn
	spool     string
	batch     int64    // the batch the trainer is in (-1 before the first)
	window    *Message // armed, not recording yet
	recording *Message
	marks     []BatchMark
	closed    bool
}

func (r *replay) send(m *Message) {
	r.mu.Lock()
	c := r.conn
	r.mu.Unlock()
	if c == nil {
		return
	}
	c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write(encodeMessage(m)); err != nil {
		r.drop(c)
	}
}

func (r *replay) drop(c net.Conn) {
	r.mu.Lock()
	if r.conn == c {
		r.conn = nil
	}
	r.mu.Unlock()
	c.Close()
}

func (r *replay) close() {
	r.mu.Lock()
	r.closed = true
	c := r.conn
	r.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// connect dials the agent (once); a reader goroutine handles its messages.
func (r *replay) connect(wg *sync.WaitGroup) {
	r.mu.Lock()
	skip := r.conn != nil || r.closed
	r.mu.Unlock()
	if skip {
		return
	}
	c, err := net.DialTimeout("unix", r.cfg.Socket, time.Second)
	if err != nil {
		return
	}
	r.mu.Lock()
	r.conn = c
	r.mu.Unlock()
	rank := r.cfg.Rank
	r.send(&Message{V: ProtocolVersion, Type: "hello", PID: os.Getpid(), Rank: &rank, DeviceUUID: r.cfg.UUID, Torch: "replay", Hook: "memsnap-replay/2"})
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(c)
		sc.Buffer(make([]byte, 4096), MaxLine)
		for sc.Scan() {
			var m Message
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				continue
			}
			r.onMessage(&m)
		}
		r.drop(c)
	}()
}

func (r *replay) onMessage(m *Message) {
	r.mu.Lock()
	var reply *Message
	switch m.Type {
	case "welcome":
		r.spool = m.Spool
	case "window":
		switch {
		case m.Stop <= m.Start || m.Start < 0:
		case r.recording != nil && r.recording.ID == m.ID:
		case r.batch >= m.Start:
			reply = &Message{Type: "error", Window: m.ID, Code: CodeStartPassed,
				Message: fmt.Sprintf("window start %d already passed (batch %d)", m.Start, r.batch)}
		default:
			w := *m
			r.window = &w
			reply = &Message{Type: "armed", Window: m.ID}
			select {
			case r.got <- struct{}{}:
			default:
			}
		}
	case "dump":
		id := m.ID
		r.mu.Unlock()
		if err := r.dumpNow(id, "postmortem"); err != nil {
			r.send(&Message{Type: "error", Window: id, Code: CodeDumpFailed, Message: err.Error()})
		}
		r.mu.Lock()
	case "cancel":
		if r.window != nil && r.window.ID == m.ID {
			r.window = nil
		}
		if r.recording != nil && r.recording.ID == m.ID {
			r.recording, r.marks = nil, nil
		}
	case "error":
		r.log.Warn("agent says", "message", m.Message)
	}
	r.mu.Unlock()
	if reply != nil {
		r.send(reply)
	}
}

func (r *replay) run(ctx context.Context, wg *sync.WaitGroup) error {
	for b := int64(0); r.cfg.Batches == 0 || b < r.cfg.Batches; b++ {
		if ctx.Err() != nil {
			return nil
		}
		r.connect(wg)
		if slices.Contains(r.cfg.HoldAt, b) {
			r.hold(ctx, wg)
		}
		start := time.Now().UnixMicro()
		bb := b
		r.send(&Message{Type: "batch", Batch: &bb, TimeUS: start})
		if r.cfg.OOMAt > 0 && b == r.cfg.OOMAt {
			if err := r.dumpNow(0, "oom"); err != nil {
				return fmt.Errorf("rankagent: replay: the OOM snapshot: %w", err)
			}
			return nil
		}
		r.mu.Lock()
		r.batch = b
		var reply *Message
		if w := r.window; w != nil && r.recording == nil {
			switch {
			case b == w.Start:
				r.recording, r.window, r.marks = w, nil, nil
				reply = &Message{Type: "recording", Window: w.ID, Batch: &bb, TimeUS: start}
			case b > w.Start:
				r.window = nil
				reply = &Message{Type: "error", Window: w.ID, Code: CodeStartPassed,
					Message: fmt.Sprintf("window start %d already passed (batch %d)", w.Start, b)}
			}
		}
		hang := r.cfg.HangInWindow && r.recording != nil
		r.mu.Unlock()
		if reply != nil {
			r.send(reply)
		}
		if hang {
			<-ctx.Done()
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.cfg.Pace):
		}
		end := time.Now().UnixMicro()
		r.mu.Lock()
		w := r.recording
		var marks []BatchMark
		if w != nil {
			r.marks = append(r.marks, BatchMark{Batch: b, StartUS: start, EndUS: end})
			if b == w.Stop-1 {
				marks, r.recording, r.marks = r.marks, nil, nil
			}
		}
		r.mu.Unlock()
		if marks != nil {
			if err := r.dump(w, marks); err != nil {
				r.log.Error("replay could not dump its snapshot", "err", err)
				r.send(&Message{Type: "error", Window: w.ID, Code: CodeDumpFailed, Message: err.Error()})
			}
		}
	}
	return nil
}

// inBatches places time t of a recorded span [t0, t1] inside the batches' marks:
// the span is cut into one equal part per batch, and each part is laid inside its
// batch, so no event falls in the gap between one batch's end and the next one's
// start (a loaded machine makes those gaps long).
func inBatches(t, t0, t1 int64, marks []BatchMark) int64 {
	k := len(marks)
	p := float64(t-t0) / float64(max(t1-t0, 1)) * float64(k)
	i := min(max(int(p), 0), k-1)
	m := marks[i]
	off := int64((p - float64(i)) * float64(m.EndUS-m.StartUS))
	return m.StartUS + min(max(off, 0), m.EndUS-m.StartUS)
}

// hold waits until a window has arrived (or ctx ends), staying connected.
func (r *replay) hold(ctx context.Context, wg *sync.WaitGroup) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		r.mu.Lock()
		has := r.window != nil
		r.mu.Unlock()
		if has {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-r.got:
		case <-t.C:
			r.connect(wg)
		}
	}
}

// dump writes the base snapshot with its events spread over the recorded batches,
// then the snapshot message beside it, as the hook does.
func (r *replay) dump(w *Message, marks []BatchMark) error {
	r.mu.Lock()
	spool := r.spool
	r.mu.Unlock()
	if spool == "" {
		return errors.New("no spool folder from the agent")
	}
	s := *r.base
	var t0, t1 int64 = 1<<63 - 1, -1 << 63
	for _, tr := range s.DeviceTraces {
		for _, e := range tr {
			t0, t1 = min(t0, e.TimeUS), max(t1, e.TimeUS)
		}
	}
	traces := make([][]*snapshot.TraceEntry, len(s.DeviceTraces))
	for i, tr := range s.DeviceTraces {
		out := make([]*snapshot.TraceEntry, len(tr))
		for j, e := range tr {
			c := *e
			c.TimeUS = inBatches(e.TimeUS, t0, t1, marks)
			out[j] = &c
		}
		traces[i] = out
	}
	s.DeviceTraces = traces
	b, err := snapshot.EncodeBytes(&s)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("rank%d.w%d.%d.pickle", r.cfg.Rank, w.ID, time.Now().UnixNano())
	msg := &Message{Type: "snapshot", Window: w.ID, Reason: "window", File: name, Batches: marks, Start: w.Start, Stop: w.Stop}
	if err := writeAtomic(filepath.Join(spool, companion(name)), encodeMessage(msg)); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(spool, name), b); err != nil {
		os.Remove(filepath.Join(spool, companion(name)))
		return err
	}
	r.send(msg)
	return nil
}

// dumpNow writes the base snapshot, its events ending now, outside any window: an
// OOM (id 0) or a post-mortem asked for by the agent.
func (r *replay) dumpNow(id uint64, reason string) error {
	r.mu.Lock()
	spool := r.spool
	r.mu.Unlock()
	if spool == "" {
		return errors.New("no spool folder from the agent")
	}
	now := time.Now().UnixMicro()
	s := *r.base
	var t1 int64 = -1 << 63
	for _, tr := range s.DeviceTraces {
		for _, e := range tr {
			t1 = max(t1, e.TimeUS)
		}
	}
	traces := make([][]*snapshot.TraceEntry, len(s.DeviceTraces))
	for i, tr := range s.DeviceTraces {
		out := make([]*snapshot.TraceEntry, len(tr))
		for j, e := range tr {
			c := *e
			c.TimeUS = now - (t1 - e.TimeUS)
			out[j] = &c
		}
		traces[i] = out
	}
	s.DeviceTraces = traces
	b, err := snapshot.EncodeBytes(&s)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("rank%d.%s%d.%d.pickle", r.cfg.Rank, reason, id, time.Now().UnixNano())
	msg := &Message{Type: "snapshot", Window: id, Reason: reason, File: name}
	if err := writeAtomic(filepath.Join(spool, companion(name)), encodeMessage(msg)); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(spool, name), b); err != nil {
		os.Remove(filepath.Join(spool, companion(name)))
		return err
	}
	r.send(msg)
	return nil
}

// writeAtomic writes b under a hidden name beside p and renames it into place.
func writeAtomic(p string, b []byte) error {
	tmp := filepath.Join(filepath.Dir(p), "."+filepath.Base(p))
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, p)
}
