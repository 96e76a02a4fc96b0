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
	Rank     int
	UUID     string // the device UUID reported in hello
	Logger   *slog.Logger
}

// Replay runs the replay trainer until its batches are done or ctx ends. Like the
// Python hook, it keeps training when the agent is absent and reconnects when it
// returns.
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
	rt := &replay{cfg: cfg, base: base, log: cfg.Logger.With("replay_rank", cfg.Rank)}
	return rt.run(ctx)
}

type replay struct {
	cfg  ReplayConfig
	base *snapshot.Snapshot
	log  *slog.Logger

	mu       sync.Mutex
	conn     net.Conn
	spool    string
	window   *Message
	marks    []BatchMark
	recStart int64
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

// connect dials the agent (once); the reader goroutine handles its messages.
func (r *replay) connect(ctx context.Context) {
	r.mu.Lock()
	connected := r.conn != nil
	r.mu.Unlock()
	if connected {
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
	r.send(&Message{V: ProtocolVersion, Type: "hello", PID: os.Getpid(), Rank: &rank, DeviceUUID: r.cfg.UUID, Torch: "replay", Hook: "memsnap-replay"})
	go func() {
		sc := bufio.NewScanner(c)
		sc.Buffer(make([]byte, 4096), MaxLine)
		for sc.Scan() {
			var m Message
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				continue
			}
			r.mu.Lock()
			switch m.Type {
			case "welcome":
				r.spool = m.Spool
			case "window":
				w := m
				r.window = &w
			case "error":
				r.log.Warn("agent says", "message", m.Message)
			}
			r.mu.Unlock()
		}
		r.drop(c)
	}()
}

func (r *replay) run(ctx context.Context) error {
	for b := int64(0); r.cfg.Batches == 0 || b < r.cfg.Batches; b++ {
		if ctx.Err() != nil {
			return nil
		}
		r.connect(ctx)
		start := time.Now().UnixMicro()
		bb := b
		r.send(&Message{Type: "batch", Batch: &bb, TimeUS: start})
		r.mu.Lock()
		w := r.window
		if w != nil && b == w.Start {
			r.recStart, r.marks = start, nil
		}
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.cfg.Pace):
		}
		end := time.Now().UnixMicro()
		if w != nil && b >= w.Start && b < w.Stop {
			r.mu.Lock()
			r.marks = append(r.marks, BatchMark{Batch: b, StartUS: start, EndUS: end})
			r.mu.Unlock()
		}
		if w != nil && b == w.Stop-1 {
			if err := r.dump(w, end); err != nil {
				r.log.Error("replay could not dump its snapshot", "err", err)
				r.send(&Message{Type: "error", Window: w.ID, Message: err.Error()})
			}
			r.mu.Lock()
			r.window = nil
			r.mu.Unlock()
		}
	}
	return nil
}

// dump writes the base snapshot with its events moved into the window's time span.
func (r *replay) dump(w *Message, end int64) error {
	r.mu.Lock()
	spool, marks, start := r.spool, append([]BatchMark(nil), r.marks...), r.recStart
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
	span := max(t1-t0, 1)
	traces := make([][]*snapshot.TraceEntry, len(s.DeviceTraces))
	for i, tr := range s.DeviceTraces {
		out := make([]*snapshot.TraceEntry, len(tr))
		for j, e := range tr {
			c := *e
			c.TimeUS = start + (e.TimeUS-t0)*(end-start)/span
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
	tmp := filepath.Join(spool, "."+name)
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(spool, name)); err != nil {
		return err
	}
	r.send(&Message{Type: "snapshot", Window: w.ID, Reason: "window", File: name, Batches: marks})
	return nil
}
