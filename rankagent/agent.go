// Package rankagent is the agent that runs beside one training process (one agent
// per rank): it learns the rank's identity from the launcher, serves the trainer
// hook on a Unix socket, arms recording windows, samples the GPU's memory through
// NVML while a window records, and spools and uploads the rank's snapshot under its
// Composer-compatible name.
package rankagent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/memsnap/memsnap/internal/gpu"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/naming"
)

var (
	// ErrStopped is returned by calls on an agent that has stopped.
	ErrStopped = errors.New("rankagent: stopped")
	// ErrBusy: a window is still recording or waiting to be recorded.
	ErrBusy = errors.New("rankagent: a window is in progress")
	// ErrPassed: the trainer is already at or past the window's start.
	ErrPassed = errors.New("rankagent: the trainer is past the window's start")
	// ErrStale: the window's id is not newer than one the agent has seen.
	ErrStale = errors.New("rankagent: stale window id")
	// ErrTrainerGone: the trainer this agent launched has exited; no window can be recorded.
	ErrTrainerGone = errors.New("rankagent: the trainer has exited")
)

// Window is a batch range [Start, Stop) to record. IDs only grow; they come from
// the leader (or, for an agent on its own, from ArmNext).
type Window struct {
	ID    uint64
	Start int64
	Stop  int64
}

func (w Window) String() string { return fmt.Sprintf("window %d [%d, %d)", w.ID, w.Start, w.Stop) }

// Config configures an agent. DefaultConfig fills the defaults; validate checks
// them and fills only what has no sensible production value of its own.
type Config struct {
	// Identity is the rank's place in the job.
	Identity Identity
	// OpenStore opens the object store; it is retried until it succeeds, so an agent
	// starts (and spools) while the store is unreachable.
	OpenStore func(ctx context.Context) (store.Store, error)
	// RemoteFileName is the folder template of uploaded snapshots (Composer's
	// remote_file_name, default "{run_name}/torch_memory_traces").
	RemoteFileName string
	// Filename is the snapshot name template without ".pickle" (Composer's
	// filename, default "rank{rank}.{batch}.memory_snapshot"; {batch} is the
	// window's stop, as in Composer).
	Filename string
	// Overwrite replaces existing objects (Composer's overwrite).
	Overwrite bool
	// Spool is the local folder snapshots wait in until the store has them.
	Spool string
	// Socket is the trainer socket's path (default DefaultSocketPath).
	Socket string
	// GPU provides NVML; nil means no GPU (gpu.Null).
	GPU gpu.Provider
	// RequireGPU fails a window when the trainer's GPU cannot be opened.
	RequireGPU bool
	// SampleEvery is the NVML sampling period while a window records.
	SampleEvery time.Duration
	// MaxEntries is passed to torch's _record_memory_history.
	MaxEntries int
	// Stacks is torch's stacks argument: "python" or "all".
	Stacks string
	// RecordAlways keeps allocator history on from the trainer's first batch
	// (bounded by MaxEntries), so a snapshot taken at any moment (an OOM
	// post-mortem) shows how memory got there.
	RecordAlways bool
	// RetryMin and RetryMax bound the upload retry backoff.
	RetryMin, RetryMax time.Duration
	// OnUpload is called after each upload (or permanent failure); may be nil. It
	// is called from the agent's own goroutine, in order, never while the agent
	// holds a lock; a slow callback delays later callbacks, nothing else.
	OnUpload func(UploadResult)
	// OnWindow is called at every step of a window's life (sent, armed,
	// recording, spooled, uploaded, missed, ...); may be nil. Same rules as OnUpload.
	OnWindow func(WindowEvent)
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns the production defaults for an identity.
func DefaultConfig(id Identity) Config {
	return Config{
		Identity:       id,
		RemoteFileName: naming.DefaultRemoteFileName,
		Filename:       naming.DefaultFilename,
		SampleEvery:    10 * time.Millisecond,
		MaxEntries:     100000,
		Stacks:         "python",
		RetryMin:       time.Second,
		RetryMax:       time.Minute,
	}
}

// agentVars are the template variables an agent can fill.
var agentVars = map[string]bool{"run_name": true, "rank": true, "local_rank": true, "node_rank": true,
	"world_size": true, "local_world_size": true, "batch": true, "window": true}

func (c *Config) validate() error {
	if c.Identity.RunName == "" {
		c.Identity.RunName = "memsnap"
	}
	if err := c.Identity.Check(); err != nil {
		return err
	}
	switch {
	case c.OpenStore == nil:
		return errors.New("rankagent: no store")
	case c.Spool == "":
		return errors.New("rankagent: no spool folder")
	case c.RemoteFileName == "" || c.Filename == "":
		return errors.New("rankagent: no snapshot name templates")
	case c.SampleEvery <= 0:
		return fmt.Errorf("rankagent: NVML sampling period %v", c.SampleEvery)
	case c.MaxEntries <= 0:
		return fmt.Errorf("rankagent: max entries %d", c.MaxEntries)
	case c.Stacks != "python" && c.Stacks != "all":
		return fmt.Errorf("rankagent: stacks %q (python or all)", c.Stacks)
	case c.RetryMin <= 0 || c.RetryMax < c.RetryMin:
		return fmt.Errorf("rankagent: retry backoff %v to %v", c.RetryMin, c.RetryMax)
	}
	named := map[string]bool{}
	for _, t := range []string{c.RemoteFileName, c.Filename} {
		tm, err := naming.Parse(t)
		if err != nil {
			return err
		}
		for _, n := range tm.Names() {
			if !agentVars[n] {
				return fmt.Errorf("rankagent: template %q names {%s}, which the agent does not know (it knows run_name, rank, local_rank, node_rank, world_size, local_world_size, batch, window)", t, n)
			}
			named[n] = true
		}
	}
	if c.Identity.WorldSize > 1 && !named["rank"] {
		return fmt.Errorf("rankagent: with %d ranks the snapshot names must name {rank} (--filename %q, --remote-file-name %q): every rank would write the same name", c.Identity.WorldSize, c.Filename, c.RemoteFileName)
	}
	if err := c.checkNames(); err != nil {
		return err
	}
	if c.Socket == "" {
		c.Socket = DefaultSocketPath(c.Identity.RunName, c.Identity.LocalRank)
	}
	if len(c.Socket) > 104 {
		return fmt.Errorf("rankagent: socket path %q is longer than Unix sockets allow", c.Socket)
	}
	if c.GPU == nil {
		c.GPU = gpu.Null{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// maxSegment is the longest path segment most file systems allow, in bytes.
const maxSegment = 255

// checkNames renders the snapshot names with the largest batch and window the
// agent can meet, so a name too long for a folder store or for S3 is refused at
// start-up rather than when a snapshot waits to be uploaded.
func (c *Config) checkNames() error {
	const big = 1<<63 - 1
	key, err := renderKey(c, naming.MustParse(c.RemoteFileName), naming.MustParse(c.Filename), Window{ID: big, Start: big - 1, Stop: big}, "postmortem")
	if err != nil {
		return err
	}
	for _, k := range []string{key, sidecar.MetaName(key), RenamedKey(key, 1<<53, time.Time{}), sidecar.MetaName(RenamedKey(key, 1<<53, time.Time{}))} {
		if len(k) > naming.MaxKeyLen {
			return fmt.Errorf("rankagent: snapshot names can reach %d bytes (%s), more than the %d an object key may have", len(k), k, naming.MaxKeyLen)
		}
		for _, seg := range strings.Split(k, "/") {
			if len(seg) > maxSegment {
				return fmt.Errorf("rankagent: snapshot names hold a path segment of %d bytes (%.40s...), more than the %d a file name may have", len(seg), seg, maxSegment)
			}
		}
	}
	return nil
}

// renderKey renders the object key of a window's snapshot; kind is "" for a whole
// window, "partial" or "oom".
func renderKey(c *Config, remote, file *naming.Template, w Window, kind string) (string, error) {
	id := c.Identity
	vars := naming.Vars{"run_name": id.RunName, "rank": id.Rank, "local_rank": id.LocalRank, "node_rank": id.NodeRank,
		"world_size": id.WorldSize, "local_world_size": max(id.LocalWorldSize, 1), "batch": w.Stop, "window": int64(w.ID)}
	folder, err := remote.Render(vars)
	if err != nil {
		return "", err
	}
	name, err := file.Render(vars)
	if err != nil {
		return "", err
	}
	if kind != "" {
		name += "." + kind
	}
	return naming.Join(folder, name+".pickle")
}

// Stats counts what an agent did.
type Stats struct {
	WindowsArmed    int // windows sent to (or queued for) the trainer
	WindowsRecorded int // windows whose snapshot covered every batch
	WindowsPartial  int // snapshots that did not cover their whole window
	WindowsMissed   int // windows the trainer was too late for, or that failed to record
	Uploaded        int // snapshots in the store
	UploadFailed    int // snapshots the store refused for good (kept in the spool's failed/)
	Retries         int // failed upload attempts that will be retried
	Pending         int // snapshots waiting in the spool
}

// Agent is one rank's agent.
type Agent struct {
	cfg  Config
	log  *slog.Logger
	sp   *spool
	up   *uploader
	ev   *dispatcher
	tmpl struct{ remote, file *naming.Template }
	wg   sync.WaitGroup // every goroutine Run started, but the dispatcher

	mu        sync.Mutex
	conn      *trainerConn
	batch     int64 // the trainer's current batch, -1 before it reports one
	batchUS   int64 // when the trainer reported that batch (its clock)
	stepUS    float64
	win       *onRank // the window in progress (rankagent/machine.go), nil when none
	lastID    uint64
	device    gpu.Device
	hookPID   int
	uuid      string
	samples   []sidecar.MemorySample
	mem       []memoryReport // the trainer's last memory reports, oldest first
	sampling  context.CancelFunc
	gpuNote   bool
	started   bool
	stopped   bool
	ln        net.Listener
	ctx       context.Context // Run's, for work started from callbacks
	stats     Stats
	working   int // snapshots being taken into the spool
	offset    *clockOffset
	conns     map[net.Conn]bool       // every open trainer connection, attached or not
	taking    map[string]bool         // snapshot files in incoming/ being taken into the spool
	adoptSoon bool                    // adoptLater will take incoming/ in again
	held      map[string]heldSnapshot // snapshots a full disk kept in incoming/, by file
	stopping  *stopNote               // the trainer is being stopped, since when and why
	launched  bool                    // the trainer is this agent's child (RunWithTrainer)
	gone      bool                    // and it has exited
	torn      bool                    // the launcher stopped a trainer that keeps no history
}

// stopNote is the trainer being stopped: how, when, and whether its snapshot of
// what it recorded came.
type stopNote struct {
	cause    string
	at       time.Time
	snapshot bool
}

// helloTimeout bounds how long a new connection may take to say hello.
const helloTimeout = 10 * time.Second

type clockOffset struct{ offsetUS, rttUS int64 }

// New checks the configuration and prepares the spool; Run starts the agent.
func New(cfg Config) (*Agent, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	sp, err := openSpool(cfg.Spool)
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, sp: sp, batch: -1, ev: newDispatcher(), conns: map[net.Conn]bool{}, taking: map[string]bool{}}
	a.log = cfg.Logger.With("rank", cfg.Identity.Rank)
	a.tmpl.remote = naming.MustParse(cfg.RemoteFileName)
	a.tmpl.file = naming.MustParse(cfg.Filename)
	a.up = &uploader{sp: sp, runName: cfg.Identity.RunName, open: cfg.OpenStore, log: a.log, minWait: cfg.RetryMin, maxWait: cfg.RetryMax,
		wake: make(chan struct{}, 1), tries: map[string]*attempts{}, onResult: a.uploaded, onRetry: a.uploadRetried}
	return a, nil
}

// ReportsUploads is true: each upload's report is in the run's log before the
// upload is told (stored means reported).
func (a *Agent) ReportsUploads() bool { return true }

// Socket returns the trainer socket's path.
func (a *Agent) Socket() string { return a.cfg.Socket }

// Identity returns the rank's identity.
func (a *Agent) Identity() Identity { return a.cfg.Identity }

// Run serves the trainer socket, adopts snapshots an earlier agent left in the
// spool, and uploads snapshots until ctx ends; it returns nil then, once every
// goroutine it started has returned. It can run once.
func (a *Agent) Run(ctx context.Context) error {
	a.mu.Lock()
	if a.started {
		a.mu.Unlock()
		return errors.New("rankagent: Run called twice")
	}
	a.started, a.ctx = true, ctx
	a.mu.Unlock()
	evDone := make(chan struct{})
	go func() { defer close(evDone); a.ev.run() }()
	defer func() { a.ev.close(); <-evDone }()

	unlock, err := a.sp.lock() // (before the socket: an agent listening owns its spool)
	if err != nil {
		a.shutdown()
		return err
	}
	defer unlock()
	if err := privateDir(filepath.Dir(a.cfg.Socket)); err != nil {
		a.shutdown()
		return fmt.Errorf("rankagent: socket folder: %w", err)
	}
	if c, err := net.Dial("unix", a.cfg.Socket); err == nil {
		c.Close()
		a.shutdown()
		return fmt.Errorf("rankagent: another agent is listening on %s", a.cfg.Socket)
	}
	os.Remove(a.cfg.Socket) // a stale socket from an agent that died
	ln, err := net.Listen("unix", a.cfg.Socket)
	if err != nil {
		a.shutdown()
		return fmt.Errorf("rankagent: listening on %s: %w", a.cfg.Socket, err)
	}
	if err := os.Chmod(a.cfg.Socket, 0o600); err != nil {
		ln.Close()
		a.shutdown()
		return fmt.Errorf("rankagent: %w", err)
	}
	a.mu.Lock()
	a.ln = ln
	a.mu.Unlock()
	a.log.Info("agent listening", "socket", a.cfg.Socket, "spool", a.cfg.Spool, "world_size", a.cfg.Identity.WorldSize, "run", a.cfg.Identity.RunName)
	a.sp.recover(a.log)

	a.wg.Add(3)
	go func() { defer a.wg.Done(); a.up.run(ctx) }()
	go func() { defer a.wg.Done(); a.accept(ctx, ln) }()
	go func() { defer a.wg.Done(); a.adopt(ctx) }()
	a.up.kick()
	<-ctx.Done()
	a.shutdown()
	a.wg.Wait()
	a.up.close()
	os.Remove(a.cfg.Socket)
	if n := len(a.sp.pendingJobs()); n > 0 {
		a.log.Warn("snapshots stay in the spool; an agent started with this spool uploads them", "pending", n, "spool", a.cfg.Spool)
	}
	return nil
}

// shutdown stops serving; it is idempotent.
func (a *Agent) shutdown() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return
	}
	a.stopped = true
	if a.ln != nil {
		a.ln.Close()
	}
	for c := range a.conns {
		c.Close() // every connection, not only the attached trainer's
	}
	a.stopSamplingLocked()
}

// Arm asks the trainer to record window w (now, or as soon as it connects). w.ID
// must be newer than every window the agent has seen; arming the window in progress
// again is a no-op, so a plan that arrives twice is harmless.
func (a *Agent) Arm(w Window) error {
	if w.Start < 0 || w.Stop <= w.Start {
		return fmt.Errorf("rankagent: window [%d, %d) is empty or negative", w.Start, w.Stop)
	}
	if w.ID == 0 {
		return errors.New("rankagent: window id 0")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return ErrStopped
	}
	if a.gone {
		return ErrTrainerGone
	}
	if a.win != nil && a.win.w == w {
		return nil
	}
	if w.ID <= a.lastID {
		return fmt.Errorf("%w: %d, the agent has seen %d", ErrStale, w.ID, a.lastID)
	}
	if a.win != nil {
		return fmt.Errorf("%w: %s is %s", ErrBusy, a.win.w, a.win.state)
	}
	if a.batch >= w.Start {
		return fmt.Errorf("%w: the trainer is at batch %d, the window starts at %d", ErrPassed, a.batch, w.Start)
	}
	a.lastID = w.ID
	nw := newOnRank(w)
	a.win = &nw
	a.stats.WindowsArmed++
	a.log.Info("window queued", "window", w.ID, "start", w.Start, "stop", w.Stop)
	a.eventLocked(WindowQueued, "")
	a.sendWindowLocked()
	return nil
}

// ArmNext arms [start, stop) under the next window id (for an agent without a leader).
func (a *Agent) ArmNext(start, stop int64) (Window, error) {
	a.mu.Lock()
	w := Window{ID: a.lastID + 1, Start: start, Stop: stop}
	a.mu.Unlock()
	return w, a.Arm(w)
}

// Cancel withdraws window id if it has not been spooled yet.
func (a *Agent) Cancel(id uint64, reason string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.win == nil || a.win.w.ID != id {
		a.lastID = max(a.lastID, id) // a cancel that overtook its plan
		return nil
	}
	if a.conn != nil && a.win.sent {
		a.conn.send(&Message{Type: "cancel", ID: id})
	}
	a.log.Info("window cancelled", "window", id, "reason", reason)
	a.stepLocked(evCancelled, reason)
	return nil
}

// Forget withdraws window id, which the run's log does not hold (a plan forged
// by a member that holds the gossip key), and lowers the newest window id the
// agent has seen back to floor, so the real windows after it are not stale.
func (a *Agent) Forget(id, floor uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.win != nil && a.win.w.ID == id {
		if a.conn != nil && a.win.sent {
			a.conn.send(&Message{Type: "cancel", ID: id})
		}
		a.log.Warn("window withdrawn: the run's log holds no such window", "window", id)
		a.stepLocked(evCancelled, "the run's log holds no such window (a forged plan)")
	}
	if a.lastID == id {
		a.lastID = floor
	}
}

// Dump asks the trainer for a snapshot of its allocator now, under window id (a
// post-mortem of another rank's OOM); it comes back as a window event like any
// snapshot, with reason "postmortem".
func (a *Agent) Dump(id uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return ErrStopped
	}
	if a.conn == nil {
		return errors.New("rankagent: no trainer is connected")
	}
	if err := a.conn.send(&Message{Type: "dump", ID: id, Reason: "postmortem"}); err != nil {
		return fmt.Errorf("rankagent: asking the trainer for a snapshot: %w", err)
	}
	a.lastID = max(a.lastID, id)
	a.log.Info("post-mortem snapshot asked for", "window", id)
	return nil
}

// Batch returns the trainer's current batch (-1 before it reported one).
func (a *Agent) Batch() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.batch
}

// Progress returns the trainer's current batch (-1 before it reported one) and
// its measured step time (0 until two batches were seen).
func (a *Agent) Progress() (int64, time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.batch, time.Duration(a.stepUS * float64(time.Microsecond))
}

// LastWindow returns the newest window id the agent has seen.
func (a *Agent) LastWindow() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastID
}

// Current returns the window in progress and its state, or ok=false.
func (a *Agent) Current() (Window, WindowState, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.win == nil {
		return Window{}, "", false
	}
	return a.win.w, a.win.state, true
}

// SetClockOffset records this host's clock minus the leader's, measured over a
// round trip of rtt; it goes into every snapshot's metadata from now on.
func (a *Agent) SetClockOffset(offset, rtt time.Duration) {
	a.mu.Lock()
	a.offset = &clockOffset{offset.Microseconds(), rtt.Microseconds()}
	a.mu.Unlock()
}

// Connected reports whether a trainer is connected (its last messages may still be
// on their way until it is not).
func (a *Agent) Connected() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conn != nil
}

// Idle reports whether no window is in progress, nothing waits in the spool, and
// every window event has been handed to OnWindow (the cluster hears of a trainer
// that died before its agent stops).
func (a *Agent) Idle() bool {
	a.mu.Lock()
	busy := a.win != nil || a.working > 0 || a.adoptSoon
	a.mu.Unlock()
	return !busy && a.up.idle() && a.ev.idle()
}

// Stats returns what the agent did so far.
func (a *Agent) Stats() Stats {
	a.mu.Lock()
	s := a.stats
	a.mu.Unlock()
	a.up.mu.Lock()
	s.Uploaded, s.UploadFailed, s.Retries = a.up.stats.uploaded, a.up.stats.failed, a.up.stats.retries
	a.up.mu.Unlock()
	s.Pending = len(a.sp.pendingJobs())
	return s
}

// DeviceUUID is the trainer's GPU, as its hook reported it ("" until then).
func (a *Agent) DeviceUUID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.uuid
}

// SpooledWindows lists the windows whose snapshots wait in the spool for the
// store (at most 64).
func (a *Agent) SpooledWindows() []uint64 {
	var out []uint64
	for _, id := range a.sp.pendingJobs() {
		if len(out) == maxSpooledWindows {
			return out
		}
		b, err := os.ReadFile(filepath.Join(a.sp.root, "pending", id, "job.json"))
		var j job
		if err == nil && json.Unmarshal(b, &j) == nil && j.Window != 0 {
			out = append(out, j.Window)
		}
	}
	// and those still in incoming/: being taken in (a restarted agent adopts
	// them), or kept there by a full disk
	a.mu.Lock()
	held := map[string]uint64{}
	for name, h := range a.held {
		held[name] = h.msg.Window
	}
	a.mu.Unlock()
	for _, name := range a.sp.incomingSnapshots() {
		if len(out) == maxSpooledWindows {
			break
		}
		if w := held[name]; w != 0 {
			out = append(out, w)
		} else if m := a.sp.incomingMessage(name); m != nil && m.Window != 0 {
			out = append(out, m.Window)
		}
	}
	return out
}

// maxSpooledWindows bounds the windows a status answer lists as spooled (its
// readers refuse more).
const maxSpooledWindows = 64

// Spool returns the spool folder.
func (a *Agent) Spool() string { return a.cfg.Spool }

// trainerConn is the connected trainer.
type trainerConn struct {
	c  net.Conn
	mu sync.Mutex
}

func (t *trainerConn) send(m *Message) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := t.c.Write(encodeMessage(m))
	return err
}

// goLocked starts f as a goroutine Run waits for, unless the agent has stopped.
func (a *Agent) goLocked(f func()) bool {
	if a.stopped {
		return false
	}
	a.wg.Add(1)
	go func() { defer a.wg.Done(); f() }()
	return true
}

func (a *Agent) accept(ctx context.Context, ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			a.mu.Lock()
			stopped := a.stopped
			a.mu.Unlock()
			if stopped || ctx.Err() != nil {
				return
			}
			a.log.Warn("accept failed", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		a.mu.Lock()
		ok := !a.stopped
		if ok {
			a.conns[c] = true
			ok = a.goLocked(func() { a.serve(c) })
		}
		a.mu.Unlock()
		if !ok {
			c.Close()
			return
		}
	}
}

func (a *Agent) serve(c net.Conn) {
	tc := &trainerConn{c: c}
	defer func() {
		c.Close()
		a.mu.Lock()
		delete(a.conns, c)
		a.mu.Unlock()
	}()
	r := bufio.NewReaderSize(c, 4096)
	first := true
	c.SetReadDeadline(time.Now().Add(helloTimeout)) // a connection that never says hello is dropped
	for {
		line, err := readLine(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				a.log.Warn("trainer connection dropped", "err", err)
			}
			break
		}
		m, err := ParseMessage(line)
		if err == nil && first && m.Type != "hello" {
			err = fmt.Errorf("%w: the first message must be hello, got %s", ErrProtocol, m.Type)
		}
		if err != nil {
			a.log.Warn("refused a trainer message; closing the connection", "err", err)
			tc.send(&Message{Type: "error", Message: err.Error()})
			break
		}
		if first {
			first = false
			c.SetReadDeadline(time.Time{})
			if !a.attach(tc, m) {
				return
			}
			continue
		}
		a.handle(m)
	}
	a.detach(tc)
}

// readLine reads one newline-terminated line of at most MaxLine bytes.
func readLine(r *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		chunk, err := r.ReadSlice('\n')
		buf = append(buf, chunk...)
		if len(buf) > MaxLine+1 {
			return nil, fmt.Errorf("%w: a line longer than %d bytes", ErrProtocol, MaxLine)
		}
		if err == nil {
			return buf[:len(buf)-1], nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

func (a *Agent) attach(tc *trainerConn, m *Message) bool {
	a.mu.Lock()
	if a.conn != nil {
		a.mu.Unlock()
		tc.send(&Message{Type: "error", Message: "another trainer is connected to this agent"})
		a.log.Warn("refused a second trainer", "pid", m.PID)
		return false
	}
	a.conn, a.hookPID = tc, m.PID
	if m.Rank != nil && *m.Rank != a.cfg.Identity.Rank {
		a.log.Warn("the trainer reports another rank than the agent's", "trainer_rank", *m.Rank)
	}
	if m.DeviceUUID != "" && m.DeviceUUID != a.uuid {
		a.uuid = m.DeviceUUID
		a.openGPULocked()
	}
	a.mu.Unlock()
	a.log.Info("trainer connected", "pid", m.PID, "torch", m.Torch, "hook", m.Hook, "device", m.DeviceUUID)
	welcome := &Message{V: ProtocolVersion, Type: "welcome", Spool: a.sp.incoming(), Rank: &a.cfg.Identity.Rank}
	if a.cfg.RecordAlways {
		welcome.RecordAlways, welcome.MaxEntries, welcome.Stacks = true, a.cfg.MaxEntries, a.cfg.Stacks
	}
	tc.send(welcome)
	a.mu.Lock()
	// a window sent to a trainer that went away is sent again; the hook ignores a
	// window it is already recording
	a.stepLocked(evUnsent, "")
	a.sendWindowLocked()
	a.mu.Unlock()
	return true
}

func (a *Agent) openGPULocked() {
	d, err := a.cfg.GPU.Open(a.uuid, a.cfg.Identity.LocalRank)
	if err != nil {
		if !a.gpuNote {
			a.log.Info("no GPU information: running on without NVML samples", "reason", err)
			a.gpuNote = true
		}
		a.device = nil
		return
	}
	a.device = d
	info := d.Info()
	a.log.Info("GPU", "uuid", info.UUID, "name", info.Name, "total", info.TotalBytes, "pci", info.PCIBusID)
}

func (a *Agent) detach(tc *trainerConn) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != tc {
		return
	}
	a.conn = nil
	a.mem = nil // no figures of a trainer that is not there
	if a.stopped {
		return
	}
	a.log.Info("trainer disconnected")
	// a trainer whose process is gone will not reconnect: a window it was in
	// is over now, not at the leader's deadline (a trainer this agent launched
	// is judged by TrainerExited a moment later, with its exit status)
	if a.win != nil && a.hookPID > 0 && !a.launched && !processAlive(a.hookPID) {
		why := fmt.Sprintf("the trainer (pid %d) exited during the window", a.hookPID)
		if a.win.recording() {
			a.noteStoppingLocked(why, time.Now())
		}
		a.log.Warn(why, "window", a.win.w.ID)
		a.stepLocked(evFailed, why)
	}
}

// processAlive reports whether process pid still exists.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// noteStoppingLocked records that the trainer is being stopped, once per
// incident, and tells the cluster at once (the crash snapshot, if any, follows).
func (a *Agent) noteStoppingLocked(cause string, at time.Time) {
	if a.stopping != nil && time.Since(a.stopping.at) < stoppingHold {
		return
	}
	a.stopping = &stopNote{cause: cause, at: at}
	var w Window
	if a.win != nil {
		w = a.win.w
	}
	a.log.Warn("the trainer is being stopped", "cause", cause, "window", w.ID, "batch", a.batch)
	a.post(WindowEvent{Window: w, State: WindowStopping, Batch: a.batch, Reason: cause, Time: at})
}

// stoppingHold is how long one stopping of the trainer counts as one incident.
const stoppingHold = time.Minute

// TrainerSignalled is told that the agent forwarded sig to the trainer it
// launched (the launcher is tearing the job down): the trainer is being stopped.
func (a *Agent) TrainerSignalled(sig os.Signal) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.stopped:
	case a.teardownLocked(true):
	default:
		a.noteStoppingLocked(signalCause(sig), time.Now())
	}
}

// teardownLocked reports whether the trainer's stopping is a teardown, no
// incident: it is stopped by a termination signal (signalled says so) with no
// window in progress and no allocator history kept, so it has nothing to give a
// post-mortem. A job ended by its launcher (scancel, a requeue, mpirun, a time
// limit) signals the trainer and this agent at once, and which of the two hears of
// it first is chance: the trainer's "stopping" message, this agent's own signal,
// or the trainer's exit by SIGTERM may come first, and each alone settles it. A
// window that comes afterwards is missed as usual.
func (a *Agent) teardownLocked(signalled bool) bool {
	if a.win != nil || a.cfg.RecordAlways || !(signalled || a.torn) {
		return false
	}
	if !a.torn {
		a.torn = true
		a.log.Info("the trainer is being stopped (a teardown); it keeps no allocator history, so no crash post-mortem is asked for")
	}
	return true
}

// termination reports whether a stopping trainer's cause is a termination signal.
func termination(cause string) bool { return cause == "SIGTERM" || cause == "SIGINT" }

func signalCause(sig os.Signal) string {
	if s, ok := sig.(syscall.Signal); ok {
		switch s {
		case syscall.SIGTERM:
			return "SIGTERM"
		case syscall.SIGINT:
			return "SIGINT"
		}
		return "signal " + s.String()
	}
	return sig.String()
}

// TrainerExited is told how the trainer the agent launched ended (its exit status,
// 128+N for signal N), once its last messages are read: a window it was in is
// over, a snapshot it left unannounced in the spool is taken, and a trainer that
// failed is a stopping the cluster hears of (with why no snapshot follows, when
// none does).
func (a *Agent) TrainerExited(code int) {
	a.adopt(a.ctxOrBackground())
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gone = true
	how := fmt.Sprintf("exited with status %d", code)
	if code > 128 && code < 128+65 {
		how = fmt.Sprintf("was killed by signal %d (%v; exit status %d)", code-128, syscall.Signal(code-128), code)
	}
	if a.win != nil {
		why := "the trainer " + how + " before the window was recorded"
		if a.win.recording() {
			why = "the trainer " + how + " during the window"
		}
		a.log.Warn(why, "window", a.win.w.ID)
		if code != 0 || a.win.recording() {
			a.noteStoppingLocked("the trainer "+how, time.Now())
		}
		a.stepLocked(evFailed, why)
	} else if code != 0 && !a.teardownLocked(code == 128+int(syscall.SIGTERM) || code == 128+int(syscall.SIGINT)) {
		a.noteStoppingLocked("the trainer "+how, time.Now())
	}
	if s := a.stopping; s != nil && !s.snapshot && a.working == 0 {
		s.snapshot = true
		reason := "the trainer " + how + " without a snapshot (it recorded no allocator history, or could not dump it)"
		a.post(WindowEvent{State: WindowFailed, Batch: a.batch, Reason: reason, Time: time.Now()})
	}
}

func (a *Agent) ctxOrBackground() context.Context {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ctx != nil {
		return a.ctx
	}
	return context.Background()
}

// sendWindowLocked sends the window in progress to a connected trainer that does
// not have it yet.
func (a *Agent) sendWindowLocked() {
	if a.win == nil || a.win.sent || a.conn == nil {
		return
	}
	w := a.win.w
	if a.cfg.RequireGPU && a.device == nil {
		a.log.Error("a GPU is required and the trainer's could not be opened; the window is not recorded", "window", w.ID)
		a.stepLocked(evFailed, "a GPU is required and NVML could not open the trainer's")
		return
	}
	if err := a.conn.send(&Message{Type: "window", ID: w.ID, Start: w.Start, Stop: w.Stop, MaxEntries: a.cfg.MaxEntries, Stacks: a.cfg.Stacks}); err != nil {
		a.log.Warn("could not send the window; it is sent again when the trainer reconnects", "err", err)
		return
	}
	a.stepLocked(evSent, "")
	if a.device != nil && a.sampling == nil {
		ctx, cancel := context.WithCancel(context.Background())
		if a.goLocked(func() { a.sample(ctx, a.device, a.hookPID) }) {
			a.sampling = cancel
			a.samples = nil
		} else {
			cancel()
		}
	}
	a.log.Info("window sent to the trainer", "window", w.ID, "start", w.Start, "stop", w.Stop)
}

// stepLocked feeds ev to the window in progress (rankagent/machine.go) and
// carries out what it returns: the state it reports, and, when the window is
// over, its end: sampling stops (the samples are returned, for a snapshot of the
// window) and the counts of missed and partial windows.
func (a *Agent) stepLocked(ev rankEvent, reason string) (samples []sidecar.MemorySample) {
	if a.win == nil {
		return nil
	}
	next, report, over := a.win.step(ev)
	*a.win = next
	if report != "" {
		a.eventLocked(report, reason)
	}
	if !over {
		return nil
	}
	switch report {
	case WindowMissed, WindowFailed:
		a.stats.WindowsMissed++
	case WindowPartial:
		a.stats.WindowsPartial++
	}
	a.win = nil
	return a.stopSamplingLocked()
}

const maxSamples = 1 << 20

// sample reads the GPU's memory every SampleEvery until ctx ends.
func (a *Agent) sample(ctx context.Context, d gpu.Device, pid int) {
	t := time.NewTicker(a.cfg.SampleEvery)
	defer t.Stop()
	for {
		s, err := d.Sample(pid)
		if err == nil {
			a.mu.Lock()
			if len(a.samples) >= maxSamples { // keep every other one: bounded memory
				for i := 0; i < len(a.samples)/2; i++ {
					a.samples[i] = a.samples[2*i]
				}
				a.samples = a.samples[:len(a.samples)/2]
			}
			a.samples = append(a.samples, sidecar.MemorySample{TimeUS: s.TimeUS, DeviceUsedBytes: s.DeviceUsedBytes, ProcessUsedBytes: s.ProcessUsedBytes})
			a.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (a *Agent) handle(m *Message) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch m.Type {
	case "batch":
		a.noteBatchLocked(*m.Batch, m.TimeUS)
	case "memory":
		a.noteMemoryLocked(*m.Batch, *m.Memory)
	case "armed", "recording":
		if a.win == nil || a.win.w.ID != m.Window {
			return
		}
		st := evArmed
		if m.Type == "recording" {
			st = evRecording
			a.noteBatchLocked(*m.Batch, m.TimeUS)
		}
		a.stepLocked(st, "")
	case "error":
		if a.win == nil || a.win.w.ID != m.Window {
			a.log.Warn("the trainer reports an error", "window", m.Window, "code", m.Code, "message", m.Message)
			return
		}
		a.log.Error("the trainer could not record the window", "window", m.Window, "code", m.Code, "message", m.Message)
		ev := evFailed
		if m.Code == CodeStartPassed {
			ev = evMissed
		}
		a.stepLocked(ev, m.Message)
	case "stopping":
		at := time.Now()
		if m.TimeUS > 0 {
			at = time.UnixMicro(m.TimeUS)
		}
		if m.Batch != nil {
			a.noteBatchLocked(*m.Batch, m.TimeUS)
		}
		if a.teardownLocked(termination(m.Cause)) {
			break
		}
		a.noteStoppingLocked(m.Cause, at)
	case "snapshot":
		var samples []sidecar.MemorySample
		var w *Window
		if m.Reason == "window" && a.win != nil && a.win.w.ID == m.Window {
			ww := a.win.w
			w = &ww
			samples = a.stepLocked(evStored, "")
		}
		if m.Reason == "crash" {
			if a.stopping == nil || time.Since(a.stopping.at) >= stoppingHold {
				a.noteStoppingLocked(m.Cause, time.Now())
			}
			a.stopping.snapshot = true
			if a.win != nil && a.win.w.ID == m.Window && m.Window != 0 {
				// what it recorded of the window is the rank's part of it, as
				// partial (and the crash post-mortem's part too): its result follows
				samples = a.stepLocked(evCrashed, "the trainer was stopped during the window ("+m.Cause+"): what it recorded is stored as partial")
			}
		}
		if a.taking[m.File] {
			break
		}
		a.working++
		a.taking[m.File] = true
		if !a.goLocked(func() { a.takeSnapshot(m, w, samples, false) }) {
			a.working--
			delete(a.taking, m.File)
		}
	case "hello":
		a.log.Warn("a second hello on one connection is ignored")
	}
}

// noteBatchLocked records the trainer's batch and keeps a moving average of its
// step time from the batches' report times.
func (a *Agent) noteBatchLocked(b, tUS int64) {
	if b > a.batch && a.batch >= 0 && tUS > a.batchUS && a.batchUS > 0 {
		step := float64(tUS-a.batchUS) / float64(b-a.batch)
		if a.stepUS == 0 {
			a.stepUS = step
		} else {
			a.stepUS = 0.8*a.stepUS + 0.2*step
		}
	}
	if b != a.batch {
		a.batch, a.batchUS = b, tUS
	}
}

func (a *Agent) stopSamplingLocked() []sidecar.MemorySample {
	if a.sampling != nil {
		a.sampling()
		a.sampling = nil
	}
	s := a.samples
	a.samples = nil
	return s
}
