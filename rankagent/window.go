package rankagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/memsnap/memsnap/internal/digest"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// WindowState is where a window stands on this rank.
type WindowState string

// A window's life: queued (no trainer yet) → sent → armed (the trainer confirmed
// it is before the start) → recording → spooled (or partial) → uploaded; or it ends
// missed (the trainer was past the start), failed or cancelled.
const (
	WindowQueued    WindowState = "queued"
	WindowSent      WindowState = "sent"
	WindowArmed     WindowState = "armed"
	WindowRecording WindowState = "recording"
	WindowSpooled   WindowState = "spooled"
	WindowPartial   WindowState = "partial"
	WindowUploaded  WindowState = "uploaded"
	WindowMissed    WindowState = "missed"
	WindowFailed    WindowState = "failed"
	WindowCancelled WindowState = "cancelled"
	// WindowOOM reports the trainer's OOM (window 0; its snapshot follows).
	WindowOOM WindowState = "oom"
	// WindowStopping reports that the trainer is being stopped (a signal, an
	// uncaught exception, an exit in the middle of a window, or a trainer that
	// died): Reason says how, Window is the window it was recording (or zero). The
	// snapshot of what it recorded follows as an upload with reason "crash", or a
	// WindowFailed event of window zero says why there is none.
	WindowStopping WindowState = "stopping"
)

// WindowEvent is one step of a window's life on this rank.
type WindowEvent struct {
	Window Window
	State  WindowState
	Batch  int64         // the trainer's batch then
	Reason string        // why, for missed, partial, failed and cancelled
	Upload *UploadResult // for uploaded, and for a snapshot the store refused (State failed)
	Time   time.Time
}

// eventLocked reports a step of the window in progress.
func (a *Agent) eventLocked(st WindowState, reason string) {
	if a.win == nil {
		return
	}
	a.post(WindowEvent{Window: a.win.w, State: st, Batch: a.batch, Reason: reason, Time: time.Now()})
}

func (a *Agent) post(e WindowEvent) {
	if f := a.cfg.OnWindow; f != nil {
		a.ev.post(func() { f(e) })
	}
}

// dispatcher runs callbacks one at a time, in order, on its own goroutine, so the
// agent never calls out while holding a lock and a slow callback blocks no one.
type dispatcher struct {
	mu      sync.Mutex
	q       []func()
	wake    chan struct{}
	closed  bool
	running bool // a callback runs now
}

// idle reports whether no callback waits or runs.
func (d *dispatcher) idle() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.q) == 0 && !d.running
}

func newDispatcher() *dispatcher { return &dispatcher{wake: make(chan struct{}, 1)} }

func (d *dispatcher) post(f func()) {
	d.mu.Lock()
	d.q = append(d.q, f)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// close makes run return once the queue is empty.
func (d *dispatcher) close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *dispatcher) run() {
	for {
		d.mu.Lock()
		q, closed := d.q, d.closed
		d.q = nil
		d.running = len(q) > 0
		d.mu.Unlock()
		for _, f := range q {
			f()
		}
		d.mu.Lock()
		d.running = false
		d.mu.Unlock()
		if len(q) == 0 {
			if closed {
				return
			}
			<-d.wake
		}
	}
}

// uploaded is the uploader's report, turned into callbacks.
func (a *Agent) uploaded(r UploadResult) {
	if f := a.cfg.OnUpload; f != nil {
		a.ev.post(func() { f(r) })
	}
	st := WindowUploaded
	if r.Err != nil {
		st = WindowFailed
	}
	rr := r
	reason := ""
	if r.Err != nil {
		reason = r.Err.Error()
	} else if r.Partial != "" {
		reason = r.Partial
	}
	a.post(WindowEvent{Window: r.Window, State: st, Batch: a.Batch(), Reason: reason, Upload: &rr, Time: time.Now()})
}

// uploadRetried tells the window (and so its leader, and the members waiting)
// why a rank's snapshot is still in its spool: the store refused it for now.
func (a *Agent) uploadRetried(r UploadResult, err error) {
	if r.Window.ID == 0 || r.Reason != "window" {
		return // (a crash's or post-mortem's snapshot: its window's state is not this)
	}
	a.post(WindowEvent{Window: r.Window, State: WindowSpooled, Batch: a.Batch(), Reason: "the upload failed and is retried: " + err.Error(), Time: time.Now()})
}

// adopt takes into the spool every complete snapshot an earlier agent (or this
// one, before a restart) left in incoming/.
func (a *Agent) adopt(ctx context.Context) {
	for _, name := range a.sp.incomingSnapshots() {
		if ctx.Err() != nil {
			return
		}
		m := a.sp.incomingMessage(name)
		if m == nil {
			m = &Message{Type: "snapshot", Reason: "window", File: name}
		}
		a.mu.Lock()
		if a.taking[name] {
			a.mu.Unlock()
			continue
		}
		a.taking[name] = true
		a.working++
		if h, ok := a.held[name]; ok {
			// one this agent took before, which a full disk kept out of the
			// spool: it stays held (its window told by SpooledWindows) until
			// this take ends, which drops it or holds it anew
			a.mu.Unlock()
			a.log.Info("taking a snapshot into the spool again", "file", name, "window", h.msg.Window)
			a.take(h.msg, h.armed, h.samples, false, &h)
			continue
		}
		a.mu.Unlock()
		a.log.Info("adopting a snapshot left in the spool", "file", name, "window", m.Window)
		a.takeSnapshot(m, nil, nil, true)
	}
}

// heldSnapshot is a snapshot a full disk kept in incoming/, with what the agent
// knew of it when it first took it.
type heldSnapshot struct {
	msg     *Message
	armed   *Window
	samples []sidecar.MemorySample
	batch   int64 // the trainer's batch when it was first taken
}

// diskFull reports whether err is a file system out of space (or quota): it passes.
func diskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// adoptLater takes incoming/'s snapshots into the spool again after RetryMax
// (once: later calls meanwhile are one).
func (a *Agent) adoptLater() {
	a.mu.Lock()
	defer a.mu.Unlock()
	ctx := a.ctx
	if a.adoptSoon || ctx == nil {
		return
	}
	a.adoptSoon = a.goLocked(func() {
		select {
		case <-ctx.Done():
		case <-time.After(a.cfg.RetryMax):
		}
		// working holds while adoptSoon clears and adopt runs: the agent is never
		// idle in between, and a disk still full schedules the next try
		a.mu.Lock()
		a.adoptSoon = false
		a.working++
		a.mu.Unlock()
		a.adopt(ctx)
		a.mu.Lock()
		a.working--
		a.mu.Unlock()
	})
}

// coverage checks that the batch marks are exactly the window's batches, in
// order; it returns why not, or "".
func coverage(w Window, marks []BatchMark) string {
	if w.Stop <= w.Start {
		return "the window's batches are unknown"
	}
	batches := make([]int64, len(marks))
	for i, m := range marks {
		batches[i] = m.Batch
	}
	if exact, _ := sidecar.Covers(w.Start, w.Stop, batches); exact {
		return ""
	}
	if len(marks) == 0 {
		return fmt.Sprintf("no batch marks for [%d, %d)", w.Start, w.Stop)
	}
	return fmt.Sprintf("batch marks cover %d batches from %d to %d, the window is [%d, %d)", len(marks), marks[0].Batch, marks[len(marks)-1].Batch, w.Start, w.Stop)
}

// takeSnapshot moves a finished snapshot from incoming/ into a spool job and wakes
// the uploader. armed is the window the agent armed, when the snapshot is its;
// otherwise the window is the one the hook names. A snapshot that does not cover
// its whole window is kept under a ".partial" name, never the window's own.
func (a *Agent) takeSnapshot(m *Message, armed *Window, samples []sidecar.MemorySample, adopted bool) {
	a.take(m, armed, samples, adopted, nil)
}

// take is takeSnapshot; retake, when set, is the snapshot a full disk kept
// in incoming/ before, taken again: named by the batch it was first taken at, its
// OOM not told again, its window not missed twice.
func (a *Agent) take(m *Message, armed *Window, samples []sidecar.MemorySample, adopted bool, retake *heldSnapshot) {
	defer a.doneTaking(m.File, retake)
	src, err := a.sp.incomingFile(m.File)
	if err != nil {
		a.log.Error("could not spool the trainer's snapshot", "file", m.File, "err", err)
		return
	}
	if m.BatchesFile {
		a.batchesFromFile(m)
	}
	a.mu.Lock()
	batch := a.batch
	a.mu.Unlock()
	if retake != nil {
		batch = retake.batch
	}
	w, partial := a.snapshotWindow(m, armed, batch, adopted, retake)
	data, err := os.ReadFile(src)
	if err != nil {
		a.rejectSnapshot(m, src, w, batch, err)
		return
	}
	ctx := a.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	s, err := snapshot.DecodeAnyContext(ctx, data)
	if err != nil {
		if ctx.Err() != nil {
			return // left in incoming/: the next agent adopts it
		}
		a.rejectSnapshot(m, src, w, batch, fmt.Errorf("the trainer's snapshot does not decode: %w", err))
		return
	}
	events := 0
	for _, tr := range s.DeviceTraces {
		events += len(tr)
	}
	key, err := renderKey(&a.cfg, a.tmpl.remote, a.tmpl.file, w, snapshotKind(m.Reason, partial))
	if err != nil {
		a.rejectSnapshot(m, src, w, batch, err)
		return
	}
	id := a.cfg.Identity
	meta := a.rankMeta(m, w, samples, partial)
	mb, _ := json.MarshalIndent(meta, "", "  ")
	sum := digest.SHA256Hex(data)
	ab := a.rankAnalysis(ctx, s, &meta, int64(len(data)), sum)
	s = nil
	j := job{Key: key, MetaKey: sidecar.MetaName(key), SHA256: sum, Size: int64(len(data)), Events: events, Overwrite: a.cfg.Overwrite,
		Created: time.Now().UTC(), Window: w.ID, Start: w.Start, Stop: w.Stop, Reason: m.Reason, Partial: partial, Rank: id.Rank, Cause: m.Cause}
	if ab != nil {
		j.AnalysisKey = analysis.AnalysisName(key)
	}
	if m.Reason == "crash" && m.Window != 0 && meta.Window != nil {
		j.Covers, j.WindowPartial = crashCovers(m), meta.Partial
	}
	jobID, err := a.sp.addJob(src, j, mb, ab)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			a.log.Error("the trainer's snapshot went away before it was spooled", "file", m.File, "err", err)
			return
		}
		if diskFull(err) {
			a.holdForRoom(m, armed, samples, batch, w, retake, err)
			return
		}
		a.rejectSnapshot(m, src, w, batch, err)
		return
	}
	state := a.spooledState(m.Reason, partial)
	if partial != "" {
		a.log.Warn("the snapshot does not cover its whole window; it is kept under a .partial name", "window", w.ID, "reason", partial, "key", key)
	}
	a.log.Info("snapshot spooled", "window", w.ID, "reason", m.Reason, "events", events, "bytes", j.Size, "key", key, "nvml_samples", len(samples), "job", jobID, "adopted", adopted)
	if m.Reason != "oom" && m.Reason != "crash" {
		a.post(WindowEvent{Window: w, State: state, Batch: batch, Reason: partial, Time: time.Now()})
	}
	a.up.kick()
}

// crashCovers is the batches a crash's recording of its window covers, [first,
// last+1) by its batch marks ([start, start) with none).
func crashCovers(m *Message) []int64 {
	if n := len(m.Batches); n > 0 {
		return []int64{max(m.Batches[0].Batch, 0), max(m.Batches[n-1].Batch+1, 0)}
	}
	return []int64{max(m.Start, 0), max(m.Start, 0)}
}

// doneTaking ends a take of file: the agent no longer works on it. A take
// again of a held snapshot (retake) forgets it, unless that take held it anew
// (holdForRoom puts a new entry).
func (a *Agent) doneTaking(file string, retake *heldSnapshot) {
	a.mu.Lock()
	a.working--
	delete(a.taking, file)
	if cur, ok := a.held[file]; ok && retake != nil && cur.msg == retake.msg {
		delete(a.held, file)
	}
	a.mu.Unlock()
}

// batchesFromFile reads a long window's batch marks, which are only in the
// message file beside its snapshot; without them the snapshot is kept as partial.
func (a *Agent) batchesFromFile(m *Message) {
	full := a.sp.incomingMessage(m.File)
	if full == nil || full.Window != m.Window || full.Reason != m.Reason {
		a.log.Warn("the snapshot's batch marks are not in the file beside it; it is kept as partial", "file", m.File)
	} else {
		m.Batches = full.Batches
	}
}

// rejectSnapshot keeps a snapshot that cannot be uploaded in the spool's failed
// jobs and, for a window's snapshot, tells the window failed.
func (a *Agent) rejectSnapshot(m *Message, src string, w Window, batch int64, err error) {
	a.log.Error("the trainer's snapshot cannot be uploaded; it is kept in the spool", "file", m.File, "err", err)
	if dir, rerr := a.sp.reject(src, a.cfg.Identity.Rank, w.ID, err); rerr == nil {
		a.log.Info("kept", "dir", dir)
	}
	if m.Reason == "window" {
		a.mu.Lock()
		a.stats.WindowsMissed++
		a.mu.Unlock()
		a.post(WindowEvent{Window: w, State: WindowFailed, Batch: batch, Reason: err.Error(), Time: time.Now()})
	}
}

// snapshotKind is the kind a snapshot's name says: an OOM, a post-mortem or a
// crash by its reason, else partial, else none ("").
func snapshotKind(reason, partial string) string {
	kind := ""
	switch {
	case reason == "oom" || reason == "postmortem" || reason == "crash":
		kind = reason
	case partial != "":
		kind = "partial"
	}
	return kind
}

// rankAnalysis is the rank's own figures of its snapshot, marshalled, so the
// leader need not decode every rank; nil when they cannot be made.
func (a *Agent) rankAnalysis(ctx context.Context, s *snapshot.Snapshot, meta *sidecar.RankMeta, size int64, sum string) []byte {
	var ab []byte
	if an, err := analysis.AnalyzeSnapshot(ctx, s, meta, analysis.AnalyzeOptions{Rank: a.cfg.Identity.Rank}); err == nil {
		an.Snapshot = analysis.SnapshotRef{Size: size, SHA256: sum}
		if ab, err = an.Marshal(); err != nil {
			ab = nil
		}
	} else {
		a.log.Warn("could not analyse the snapshot; the leader will decode it", "err", err)
	}
	return ab
}

// spooledState is where a spooled snapshot leaves its window (partial or
// spooled), counted in the agent's stats when the snapshot is a window's.
func (a *Agent) spooledState(reason, partial string) WindowState {
	state := WindowSpooled
	a.mu.Lock()
	switch {
	case reason != "window":
	case partial != "":
		state = WindowPartial
		a.stats.WindowsPartial++
	default:
		a.stats.WindowsRecorded++
	}
	a.mu.Unlock()
	return state
}

// snapshotWindow is the window a snapshot is of, as its name and metadata say:
// an OOM's or a crash's is the batch it happened in, a window's the one armed
// (or the one the hook names); partial says why it does not cover that window
// ("" when it does). A fresh OOM is told to the cluster.
func (a *Agent) snapshotWindow(m *Message, armed *Window, batch int64, adopted bool, retake *heldSnapshot) (w Window, partial string) {
	switch {
	case m.Reason == "oom":
		w = Window{Start: max(batch, 0), Stop: max(batch, 0) + 1}
		if !adopted && retake == nil {
			a.post(WindowEvent{Window: Window{}, State: WindowOOM, Batch: batch, Time: time.Now()})
		}
	case m.Reason == "postmortem":
		w = Window{ID: m.Window, Start: max(batch, 0), Stop: max(batch, 0)}
	case m.Reason == "crash":
		// named like an OOM dump, by the batch it stopped in; the window it was
		// recording, if any, goes into its metadata
		b := max(batch, 0)
		if n := len(m.Batches); n > 0 {
			b = m.Batches[n-1].Batch
		}
		w = Window{ID: m.Window, Start: b, Stop: b + 1}
	case armed != nil:
		w = *armed
		if m.Stop != 0 && (m.Start != w.Start || m.Stop != w.Stop) {
			partial = fmt.Sprintf("the trainer recorded [%d, %d), the window is [%d, %d)", m.Start, m.Stop, w.Start, w.Stop)
		}
	default:
		w = Window{ID: m.Window, Start: m.Start, Stop: m.Stop}
	}
	if m.Reason == "window" && partial == "" {
		partial = coverage(w, m.Batches)
	}
	return w, partial
}

// rankMeta is the sidecar of a snapshot of window w: who recorded it, on which
// GPU, with which clock, its batch marks and why it is partial.
func (a *Agent) rankMeta(m *Message, w Window, samples []sidecar.MemorySample, partial string) sidecar.RankMeta {
	id := a.cfg.Identity
	a.mu.Lock()
	meta := sidecar.RankMeta{Version: 1, RunName: id.RunName, Rank: id.Rank, LocalRank: id.LocalRank, NodeRank: id.NodeRank,
		WorldSize: id.WorldSize, LocalWorldSize: id.LocalWorldSize, GPU: a.gpuInfoLocked(), Reason: m.Reason, Samples: samples, Partial: partial,
		StallUS: m.StallUS, Cause: m.Cause, MaxEntries: a.cfg.MaxEntries}
	if a.offset != nil {
		off, rtt := a.offset.offsetUS, a.offset.rttUS
		meta.ClockOffsetUS, meta.ClockRTTUS = &off, &rtt
	}
	a.mu.Unlock()
	meta.Hostname, _ = os.Hostname()
	if m.Reason == "window" || m.Reason == "postmortem" {
		meta.Window = &sidecar.WindowInfo{ID: w.ID, Start: w.Start, Stop: w.Stop}
	}
	if m.Reason == "crash" && m.Window != 0 && m.Stop > m.Start {
		meta.Window = &sidecar.WindowInfo{ID: m.Window, Start: m.Start, Stop: m.Stop}
		meta.Partial = fmt.Sprintf("the trainer was stopped in batch %d of [%d, %d) (%s)", w.Start, m.Start, m.Stop, m.Cause)
	}
	for _, b := range m.Batches {
		meta.Batches = append(meta.Batches, sidecar.BatchMark{Batch: b.Batch, StartUS: b.StartUS, EndUS: b.EndUS})
	}
	return meta
}

// holdForRoom keeps a snapshot a full disk refused where it is, whole, to be
// taken again once there is room (or by an agent started with this spool); its
// window is told it failed, once.
func (a *Agent) holdForRoom(m *Message, armed *Window, samples []sidecar.MemorySample, batch int64, w Window, retake *heldSnapshot, err error) {
	// a full disk passes: the snapshot stays where it is, whole, and is
	// taken again once there is room (or by an agent started with this spool)
	a.log.Error("the spool's disk is full: the snapshot stays in incoming/ and is taken into the spool again once there is room",
		"file", m.File, "err", err, "retry_in", a.cfg.RetryMax)
	if m.Reason == "window" && retake == nil {
		a.mu.Lock()
		a.stats.WindowsMissed++
		a.mu.Unlock()
		a.post(WindowEvent{Window: w, State: WindowFailed, Batch: batch,
			Reason: "the spool's disk is full (the snapshot is kept in incoming/ and uploaded once there is room): " + err.Error(), Time: time.Now()})
	}
	held := *m
	held.BatchesFile = false // its marks are in m.Batches now
	a.mu.Lock()
	if a.held == nil {
		a.held = map[string]heldSnapshot{}
	}
	a.held[m.File] = heldSnapshot{msg: &held, armed: armed, samples: samples, batch: batch}
	a.mu.Unlock()
	a.adoptLater()
}

func (a *Agent) gpuInfoLocked() *sidecar.GPUInfo {
	if a.device != nil {
		i := a.device.Info()
		return &sidecar.GPUInfo{UUID: i.UUID, Name: i.Name, TotalBytes: i.TotalBytes, PCIBusID: i.PCIBusID}
	}
	if a.uuid != "" {
		return &sidecar.GPUInfo{UUID: a.uuid}
	}
	return nil
}
