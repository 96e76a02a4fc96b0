package rankagent

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/memsnap/memsnap/merge/analysis"
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
	// as a stuck rank would (tests of ranks that die mid-window); a cause on Stop
	// still stops it.
	HangInWindow bool
	// FailAt, when above zero, makes the trainer raise an uncaught exception at the
	// start of that batch: it does what the hook does on one (a stopping message
	// with cause "exception: RuntimeError: replay failure at batch N", then a crash
	// snapshot of the window it records, or of its record-always history), and
	// Replay returns an error wrapping ErrTrainerFailed.
	FailAt int64
	// Stop stops the trainer as SIGTERM stops a hooked one: the cause that arrives
	// ("SIGTERM" when it is empty or the channel is closed) goes to the agent in a
	// stopping message, with a crash snapshot as for FailAt, and Replay returns an
	// error wrapping ErrTrainerStopped. Nil: never.
	Stop <-chan string
	// LeakPerBatch makes the trainer's allocated bytes grow by this much a batch
	// (a leak) in the memory figures it reports, from the recorded snapshot's;
	// at the batch whose peak would not fit DeviceTotal it runs out of memory, as
	// with OOMAt.
	LeakPerBatch int64
	// DeviceTotal is the size of the device the figures report (default 80 GiB).
	DeviceTotal int64
	// MemoryEvery is the least time between two memory reports, as the hook's
	// (default one second; negative: none).
	MemoryEvery time.Duration
	Rank        int
	UUID        string // the device UUID reported in hello
	Logger      *slog.Logger
}

var (
	// ErrTrainerFailed is wrapped by Replay's error when ReplayConfig.FailAt made
	// the replay trainer fail.
	ErrTrainerFailed = errors.New("rankagent: the replay trainer failed")
	// ErrTrainerStopped is wrapped by Replay's error when a cause on
	// ReplayConfig.Stop stopped the replay trainer.
	ErrTrainerStopped = errors.New("rankagent: the replay trainer was stopped")
)

// replayStopWait bounds how long a stopping replay trainer waits for the agent to
// read its stopping message and crash snapshot (the hook's STOP_WAIT).
const replayStopWait = 10 * time.Second

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
	if cfg.DeviceTotal <= 0 {
		cfg.DeviceTotal = 80 << 30
	}
	if cfg.MemoryEvery == 0 {
		cfg.MemoryEvery = time.Second
	}
	rt := &replay{cfg: cfg, base: base, log: cfg.Logger.With("replay_rank", cfg.Rank), batch: -1, got: make(chan struct{}, 1)}
	rt.baseAlloc, rt.baseRes, rt.basePeak = base.AllocatedAtEnd(0), base.ReservedAtEnd(0), base.AllocatedAtEnd(0)
	for _, d := range base.ComputeFigures().Devices {
		if d.Device == 0 {
			rt.basePeak = max(rt.basePeak, d.PeakAllocatedBytes)
		}
	}
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
	connDone  chan struct{} // closed once conn's reader has seen it end
	spool     string
	always    bool        // the agent asked for record-always history
	batch     int64       // the batch the trainer is in (-1 before the first)
	ended     []BatchMark // the last replayEnded batches that ended, recorded or not
	curStart  int64       // when that batch started (µs)
	window    *Message    // armed, not recording yet
	recording *Message
	marks     []BatchMark
	closed    bool

	baseAlloc, baseRes, basePeak int64     // the recorded snapshot's allocated and reserved bytes at its end, and its peak
	peak                         int64     // the most allocated so far
	memAt                        time.Time // when the last memory report went
}

// memory is what the hook would report at the end of batch b: the recorded
// snapshot's figures, plus LeakPerBatch for every batch so far. Each batch peaks
// as the recorded one did (its temporaries on top of what stays); the reserved
// bytes follow the peak in 2 MiB segments, as the caching allocator's.
func (r *replay) memory(b int64) *Memory {
	leaked := r.cfg.LeakPerBatch * (b + 1)
	alloc := r.baseAlloc + leaked
	r.peak = max(r.peak, r.basePeak+leaked)
	const seg = 2 << 20
	res := max(r.baseRes, (r.peak+seg-1)/seg*seg)
	return &Memory{Allocated: alloc, Reserved: res, Peak: r.peak, DeviceTotal: r.cfg.DeviceTotal, DeviceFree: max(r.cfg.DeviceTotal-res, 0)}
}

// full reports whether batch b's peak would not fit the device: a leaking
// trainer runs out of memory there (as OOMAt).
func (r *replay) full(b int64) bool {
	return r.cfg.LeakPerBatch > 0 && r.basePeak+r.cfg.LeakPerBatch*(b+1) > r.cfg.DeviceTotal
}

// reportMemory sends the figures at the end of batch b, at most once per
// MemoryEvery (the first at once).
func (r *replay) reportMemory(b int64) {
	if r.cfg.MemoryEvery < 0 {
		return
	}
	now := time.Now()
	m := r.memory(b)
	if !r.memAt.IsZero() && now.Sub(r.memAt) < r.cfg.MemoryEvery {
		return
	}
	r.memAt = now
	bb := b
	r.send(&Message{Type: "memory", Batch: &bb, Memory: m})
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
	done := make(chan struct{})
	r.mu.Lock()
	r.conn, r.connDone = c, done
	r.mu.Unlock()
	rank := r.cfg.Rank
	r.send(&Message{V: ProtocolVersion, Type: "hello", PID: os.Getpid(), Rank: &rank, DeviceUUID: r.cfg.UUID, Torch: "replay", Hook: "memsnap-replay/2"})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
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
		r.spool, r.always = m.Spool, m.RecordAlways
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
			if cause, stop := r.hold(ctx, wg); stop {
				return r.stopped(cause)
			}
		}
		start := time.Now().UnixMicro()
		bb := b
		r.send(&Message{Type: "batch", Batch: &bb, TimeUS: start})
		if r.cfg.OOMAt > 0 && b == r.cfg.OOMAt || r.full(b) {
			if err := r.dumpNow(0, "oom"); err != nil {
				return fmt.Errorf("rankagent: replay: the OOM snapshot: %w", err)
			}
			return nil
		}
		r.mu.Lock()
		r.batch, r.curStart = b, start
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
		if r.cfg.FailAt > 0 && b == r.cfg.FailAt {
			cause := fmt.Sprintf("exception: RuntimeError: replay failure at batch %d", b)
			r.stopping(cause)
			return fmt.Errorf("%w: %s", ErrTrainerFailed, cause)
		}
		var paced <-chan time.Time // a hung trainer waits for ctx or a stop
		if !hang {
			paced = time.After(r.cfg.Pace)
		}
		select {
		case <-ctx.Done():
			return nil
		case cause := <-r.cfg.Stop: // "" once closed
			return r.stopped(cause)
		case <-paced:
		}
		end := time.Now().UnixMicro()
		r.mu.Lock()
		if r.ended = append(r.ended, BatchMark{Batch: b, StartUS: start, EndUS: end}); len(r.ended) > replayEnded {
			r.ended = slices.Delete(r.ended, 0, len(r.ended)-replayEnded)
		}
		w := r.recording
		var marks []BatchMark
		if w != nil {
			r.marks = append(r.marks, BatchMark{Batch: b, StartUS: start, EndUS: end})
			if b == w.Stop-1 {
				marks, r.recording, r.marks = r.marks, nil, nil
			}
		}
		r.mu.Unlock()
		r.reportMemory(b)
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

// hold waits until a window has arrived (or ctx ends), staying connected. A cause
// on Stop ends the wait: stop says so, with the cause.
func (r *replay) hold(ctx context.Context, wg *sync.WaitGroup) (cause string, stop bool) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		r.mu.Lock()
		has := r.window != nil
		r.mu.Unlock()
		if has {
			return "", false
		}
		select {
		case <-ctx.Done():
			return "", false
		case cause := <-r.cfg.Stop: // "" once closed
			return cause, true
		case <-r.got:
		case <-t.C:
			r.connect(wg)
		}
	}
}

// stopped handles a stop that arrived on ReplayConfig.Stop; the error is Replay's.
func (r *replay) stopped(cause string) error {
	if cause == "" {
		cause = "SIGTERM"
	}
	cause = clipCause(cause)
	r.stopping(cause)
	return fmt.Errorf("%w: %s", ErrTrainerStopped, cause)
}

// stopping does what the hook does when its process is being stopped: it tells
// the agent why, dumps a crash snapshot when it records a window (the window's
// events over the batches so far, the one in progress up to now) or keeps
// record-always history (the events ending now, as a post-mortem), closes its
// side of the connection and waits, at most replayStopWait, until the agent has
// read both and closed its own. With no agent connected it sends nothing.
func (r *replay) stopping(cause string) {
	now := time.Now().UnixMicro()
	r.mu.Lock()
	c, done, spool := r.conn, r.connDone, r.spool
	batch, rec, always := r.batch, r.recording, r.always
	marks := slices.Clone(r.marks)
	if rec != nil && batch >= rec.Start && (len(marks) == 0 || marks[len(marks)-1].Batch < batch) {
		start := r.curStart
		if len(marks) > 0 {
			start = max(start, marks[len(marks)-1].EndUS)
		}
		marks = append(marks, BatchMark{Batch: batch, StartUS: min(start, now), EndUS: now})
	}
	r.window, r.recording, r.marks = nil, nil, nil
	r.mu.Unlock()
	if c == nil || spool == "" {
		return
	}
	msg := &Message{Type: "stopping", Cause: cause, TimeUS: now}
	if batch >= 0 {
		msg.Batch = &batch
	}
	r.send(msg)
	if rec != nil || always {
		if err := r.crashDump(rec, marks, cause); err != nil {
			r.log.Error("replay could not dump its crash snapshot", "err", err)
			em := &Message{Type: "error", Code: CodeDumpFailed, Message: "could not dump the crash snapshot: " + err.Error()}
			if rec != nil {
				em.Window = rec.ID
			}
			r.send(em)
		}
	}
	if uc, ok := c.(*net.UnixConn); ok {
		uc.CloseWrite()
	}
	select {
	case <-done:
	case <-time.After(replayStopWait):
		r.log.Warn("the agent did not read the stopping trainer's messages in time", "wait", replayStopWait)
	}
}

// clipCause makes s valid UTF-8 of at most MaxCause bytes, cut between characters.
func clipCause(s string) string {
	return analysis.CutUTF8(strings.ToValidUTF8(s, "?"), MaxCause)
}

// dump writes the base snapshot with its events spread over the recorded batches,
// then the snapshot message beside it, as the hook does.
func (r *replay) dump(w *Message, marks []BatchMark) error {
	return r.spoolWrite(r.spreadOver(marks), "w",
		&Message{Type: "snapshot", Window: w.ID, Reason: "window", Batches: marks, Start: w.Start, Stop: w.Stop})
}

// dumpNow writes the base snapshot, its events ending now, outside any window: an
// OOM (id 0) or a post-mortem asked for by the agent.
func (r *replay) dumpNow(id uint64, reason string) error {
	return r.spoolWrite(r.endingNow(), reason, &Message{Type: "snapshot", Window: id, Reason: reason})
}

// crashDump writes a stopping trainer's snapshot (reason "crash"): that of the
// window rec over the batches recorded so far, or, with rec nil, the record-always
// history ending now, in the post-mortem's shape and with window 0.
func (r *replay) crashDump(rec *Message, marks []BatchMark, cause string) error {
	msg := &Message{Type: "snapshot", Reason: "crash", Cause: cause}
	if rec == nil || len(marks) == 0 {
		return r.spoolWrite(r.endingNow(), "crash", msg)
	}
	msg.Window, msg.Start, msg.Stop, msg.Batches = rec.ID, rec.Start, rec.Stop, marks
	return r.spoolWrite(r.spreadOver(marks), "crash", msg)
}

// spreadOver returns the base snapshot with its events laid inside the batches'
// marks (see inBatches), and what the trainer leaked by the last of them.
func (r *replay) spreadOver(marks []BatchMark) *snapshot.Snapshot {
	s := *r.base
	var t0, t1 int64 = 1<<63 - 1, -1 << 63
	for _, tr := range s.DeviceTraces {
		for _, e := range tr {
			t0, t1 = min(t0, e.TimeUS), max(t1, e.TimeUS)
		}
	}
	return r.withLeak(r.retimed(&s, func(t int64) int64 { return inBatches(t, t0, t1, marks) }), marks)
}

// LeakSite is the stack frame a leaking replay trainer allocates its leak from,
// as the hook's stacks name a site: "leak (replay_leak.py:1)".
var LeakSite = snapshot.Frame{Name: "leak", Filename: "replay_leak.py", Line: 1, Has: snapshot.FrameName | snapshot.FrameFilename | snapshot.FrameLine}

// withLeak adds to s (a copy the caller owns) the blocks a leaking trainer holds
// at the end of the last batch of marks: one of LeakPerBatch a batch, each in a
// segment of its own above the recorded ones, allocated at the end of its batch
// from LeakSite. The batches in marks have their events in device 0's trace;
// earlier ones were there before it began.
func (r *replay) withLeak(s *snapshot.Snapshot, marks []BatchMark) *snapshot.Snapshot {
	n := r.cfg.LeakPerBatch
	if n <= 0 || len(marks) == 0 || len(s.DeviceTraces) == 0 {
		return s
	}
	const seg = 2 << 20
	var top int64
	for _, g := range s.Segments {
		top = max(top, g.Address+g.TotalSize)
	}
	size, segSize := (n+511)&^511, (n+seg-1)/seg*seg
	at := (top + 1<<30) / seg * seg
	when := map[int64]int64{}
	last := int64(-1)
	for _, m := range marks {
		when[m.Batch] = max(m.StartUS, m.EndUS-1)
		last = max(last, m.Batch)
	}
	frames := []*snapshot.Frame{&LeakSite}
	s.Segments = slices.Clone(s.Segments)
	tr := slices.Clone(s.DeviceTraces[0])
	for b := int64(0); b <= last; b, at = b+1, at+segSize {
		s.Segments = append(s.Segments, &snapshot.Segment{Address: at, TotalSize: segSize, AllocatedSize: size, ActiveSize: size, RequestedSize: n,
			SegmentType: "large", Has: snapshot.SegDevice | snapshot.SegAddress | snapshot.SegTotalSize | snapshot.SegAllocatedSize |
				snapshot.SegActiveSize | snapshot.SegRequestedSize | snapshot.SegSegmentType | snapshot.SegBlocks,
			Blocks: leakBlocks(at, size, segSize, n, frames)})
		if t, ok := when[b]; ok {
			has := snapshot.EntryAction | snapshot.EntryAddr | snapshot.EntrySize | snapshot.EntryTimeUS | snapshot.EntryStream
			tr = append(tr, &snapshot.TraceEntry{Action: snapshot.ActionSegmentAlloc, Addr: at, Size: segSize, TimeUS: t, Has: has},
				&snapshot.TraceEntry{Action: snapshot.ActionAlloc, Addr: at, Size: size, TimeUS: t, Frames: frames, Has: has | snapshot.EntryFrames})
		}
	}
	slices.SortStableFunc(tr, func(a, b *snapshot.TraceEntry) int { return cmp.Compare(a.TimeUS, b.TimeUS) })
	s.DeviceTraces = append([][]*snapshot.TraceEntry{tr}, s.DeviceTraces[1:]...)
	return s
}

// leakBlocks tiles a leak's segment: its block, then the rest free.
func leakBlocks(at, size, segSize, requested int64, frames []*snapshot.Frame) []*snapshot.Block {
	has := snapshot.BlockAddress | snapshot.BlockSize | snapshot.BlockState
	out := []*snapshot.Block{{Address: at, Size: size, RequestedSize: requested, State: snapshot.BlockActiveAllocated, Frames: frames,
		Has: has | snapshot.BlockRequestedSize | snapshot.BlockFrames}}
	if size < segSize {
		out = append(out, &snapshot.Block{Address: at + size, Size: segSize - size, State: "inactive", Has: has})
	}
	return out
}

// replayEnded is how many ended batches a replay trainer keeps, for the leak's
// events in a snapshot taken outside a window.
const replayEnded = 64

// endingNow returns the base snapshot with its last event now, and what the
// trainer leaked by the last batch that ended.
func (r *replay) endingNow() *snapshot.Snapshot {
	now := time.Now().UnixMicro()
	s := *r.base
	var t1 int64 = -1 << 63
	for _, tr := range s.DeviceTraces {
		for _, e := range tr {
			t1 = max(t1, e.TimeUS)
		}
	}
	r.mu.Lock()
	ended := slices.Clone(r.ended)
	r.mu.Unlock()
	return r.withLeak(r.retimed(&s, func(t int64) int64 { return now - (t1 - t) }), ended)
}

// retimed gives s copies of its trace entries with their times mapped by at.
func (r *replay) retimed(s *snapshot.Snapshot, at func(int64) int64) *snapshot.Snapshot {
	traces := make([][]*snapshot.TraceEntry, len(s.DeviceTraces))
	for i, tr := range s.DeviceTraces {
		out := make([]*snapshot.TraceEntry, len(tr))
		for j, e := range tr {
			c := *e
			c.TimeUS = at(e.TimeUS)
			out[j] = &c
		}
		traces[i] = out
	}
	s.DeviceTraces = traces
	return s
}

// spoolWrite writes s into the agent's spool as rank<R>.<kind><window>.<ns>.pickle,
// msg (its File filled in) beside it first, then sends msg, as the hook does.
func (r *replay) spoolWrite(s *snapshot.Snapshot, kind string, msg *Message) error {
	r.mu.Lock()
	spool := r.spool
	r.mu.Unlock()
	if spool == "" {
		return errors.New("no spool folder from the agent")
	}
	b, err := snapshot.EncodeBytes(s)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("rank%d.%s%d.%d.pickle", r.cfg.Rank, kind, msg.Window, time.Now().UnixNano())
	msg.File = name
	if err := writeAtomic(filepath.Join(spool, companion(name)), encodeMessage(msg)); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(spool, name), b); err != nil {
		os.Remove(filepath.Join(spool, companion(name)))
		return err
	}
	if len(msg.Batches) > SocketMarks { // as the hook does: the file beside has them all
		short := *msg
		short.Batches, short.BatchesFile = nil, true
		msg = &short
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
