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
	"sync"
	"time"

	"github.com/memsnap/memsnap/internal/gpu"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/naming"
)

// ErrStopped is returned by calls on an agent that has stopped.
var ErrStopped = errors.New("rankagent: stopped")

// Window is a batch range [Start, Stop) to record; IDs only grow.
type Window struct {
	ID    uint64
	Start int64
	Stop  int64
}

func (w Window) String() string { return fmt.Sprintf("window %d [%d, %d)", w.ID, w.Start, w.Stop) }

// Config configures an agent. DefaultConfig fills the defaults.
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
	// filename, default "rank{rank}.{batch}.memory_snapshot").
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
	// SampleEvery is the NVML sampling period while a window records (default 10ms).
	SampleEvery time.Duration
	// MaxEntries is passed to torch's _record_memory_history (default 100000).
	MaxEntries int
	// Stacks is torch's stacks argument: "python" (default) or "all".
	Stacks string
	// RetryMin and RetryMax bound the upload retry backoff (default 1s and 1m).
	RetryMin, RetryMax time.Duration
	// OnUpload is called after each upload (or permanent failure); may be nil.
	OnUpload func(UploadResult)
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
	if err := c.Identity.Check(); err != nil {
		return err
	}
	if c.OpenStore == nil {
		return errors.New("rankagent: no store")
	}
	if c.Spool == "" {
		return errors.New("rankagent: no spool folder")
	}
	if c.RemoteFileName == "" {
		c.RemoteFileName = naming.DefaultRemoteFileName
	}
	if c.Filename == "" {
		c.Filename = naming.DefaultFilename
	}
	for _, t := range []string{c.RemoteFileName, c.Filename} {
		tm, err := naming.Parse(t)
		if err != nil {
			return err
		}
		for _, n := range tm.Names() {
			if !agentVars[n] {
				return fmt.Errorf("rankagent: template %q names {%s}, which the agent does not know (it knows run_name, rank, local_rank, node_rank, world_size, local_world_size, batch, window)", t, n)
			}
		}
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
	if c.SampleEvery <= 0 {
		c.SampleEvery = 10 * time.Millisecond
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = 100000
	}
	if c.Stacks == "" {
		c.Stacks = "python"
	}
	if c.Stacks != "python" && c.Stacks != "all" {
		return fmt.Errorf("rankagent: stacks %q (python or all)", c.Stacks)
	}
	if c.RetryMin <= 0 {
		c.RetryMin = time.Second
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = max(time.Minute, c.RetryMin)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Identity.RunName == "" {
		c.Identity.RunName = "memsnap"
	}
	return nil
}

// Agent is one rank's agent.
type Agent struct {
	cfg  Config
	log  *slog.Logger
	sp   *spool
	up   *uploader
	tmpl struct{ remote, file *naming.Template }

	mu       sync.Mutex
	conn     *trainerConn
	batch    int64 // the trainer's current batch, -1 before it reports one
	pending  *Window
	active   *Window // sent to the trainer, recording or about to
	lastID   uint64
	device   gpu.Device
	hookPID  int
	uuid     string
	samples  []merge.MemorySample
	sampling context.CancelFunc
	gpuNote  bool
	stopped  bool
	ln       net.Listener
	done     chan struct{}
}

// New checks the configuration and prepares the spool; Run starts the agent.
func New(cfg Config) (*Agent, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	sp, err := openSpool(cfg.Spool)
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, sp: sp, batch: -1, done: make(chan struct{})}
	a.log = cfg.Logger.With("rank", cfg.Identity.Rank)
	a.tmpl.remote = naming.MustParse(cfg.RemoteFileName)
	a.tmpl.file = naming.MustParse(cfg.Filename)
	a.up = &uploader{sp: sp, open: cfg.OpenStore, log: a.log, minWait: cfg.RetryMin, maxWait: cfg.RetryMax,
		wake: make(chan struct{}, 1), onResult: cfg.OnUpload}
	return a, nil
}

// Socket returns the trainer socket's path.
func (a *Agent) Socket() string { return a.cfg.Socket }

// Run serves the trainer socket and uploads snapshots until ctx ends; it returns
// nil then.
func (a *Agent) Run(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(a.cfg.Socket), 0o700); err != nil {
		return fmt.Errorf("rankagent: socket folder: %w", err)
	}
	if c, err := net.Dial("unix", a.cfg.Socket); err == nil {
		c.Close()
		return fmt.Errorf("rankagent: another agent is listening on %s", a.cfg.Socket)
	}
	os.Remove(a.cfg.Socket) // a stale socket from an agent that died
	ln, err := net.Listen("unix", a.cfg.Socket)
	if err != nil {
		return fmt.Errorf("rankagent: listening on %s: %w", a.cfg.Socket, err)
	}
	if err := os.Chmod(a.cfg.Socket, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("rankagent: %w", err)
	}
	a.mu.Lock()
	a.ln = ln
	a.mu.Unlock()
	a.log.Info("agent listening", "socket", a.cfg.Socket, "spool", a.cfg.Spool, "world_size", a.cfg.Identity.WorldSize, "run", a.cfg.Identity.RunName)
	a.sp.recover(a.log)

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); a.up.run(ctx) }()
	go func() { defer wg.Done(); a.accept(ctx, ln) }()
	a.up.kick()
	<-ctx.Done()
	a.shutdown()
	wg.Wait()
	os.Remove(a.cfg.Socket)
	close(a.done)
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
	if a.conn != nil {
		a.conn.c.Close()
	}
	if a.sampling != nil {
		a.sampling()
	}
}

// Arm asks the trainer to record window w (now, or as soon as it connects).
func (a *Agent) Arm(start, stop int64) (Window, error) {
	if start < 0 || stop <= start {
		return Window{}, fmt.Errorf("rankagent: window [%d, %d) is empty or negative", start, stop)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return Window{}, ErrStopped
	}
	if a.active != nil {
		return Window{}, fmt.Errorf("rankagent: %s is still recording", a.active)
	}
	if a.batch >= start {
		return Window{}, fmt.Errorf("rankagent: the trainer is at batch %d, past the window's start %d", a.batch, start)
	}
	a.lastID++
	w := Window{ID: a.lastID, Start: start, Stop: stop}
	a.pending = &w
	a.sendWindowLocked()
	return w, nil
}

// Batch returns the trainer's current batch (-1 before it reported one).
func (a *Agent) Batch() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.batch
}

// Idle reports whether nothing waits in the spool and no window records.
func (a *Agent) Idle() bool {
	a.mu.Lock()
	busy := a.pending != nil || a.active != nil
	a.mu.Unlock()
	return !busy && a.up.idle()
}

// Stats returns the uploader's counters.
func (a *Agent) Stats() UploadStats {
	a.up.mu.Lock()
	defer a.up.mu.Unlock()
	return a.up.stats
}

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

func (a *Agent) accept(ctx context.Context, ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			a.mu.Lock()
			stopped := a.stopped
			a.mu.Unlock()
			if stopped {
				return
			}
			a.log.Warn("accept failed", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go a.serve(ctx, c)
	}
}

func (a *Agent) serve(ctx context.Context, c net.Conn) {
	tc := &trainerConn{c: c}
	defer c.Close()
	r := bufio.NewReaderSize(c, 4096)
	first := true
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
			if !a.attach(tc, m) {
				return
			}
			continue
		}
		a.handle(ctx, tc, m)
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
	a.log.Info("trainer connected", "pid", m.PID, "torch", m.Torch, "device", m.DeviceUUID)
	tc.send(&Message{V: ProtocolVersion, Type: "welcome", Spool: a.sp.incoming(), Rank: &a.cfg.Identity.Rank})
	a.mu.Lock()
	// a window that was sent to a trainer that went away is sent again
	if a.active != nil && a.pending == nil {
		w := *a.active
		a.pending, a.active = &w, nil
	}
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
	if a.conn == tc {
		a.conn = nil
		if !a.stopped {
			a.log.Info("trainer disconnected")
		}
	}
}

// sendWindowLocked sends the pending window to a connected trainer.
func (a *Agent) sendWindowLocked() {
	if a.pending == nil || a.conn == nil {
		return
	}
	if a.cfg.RequireGPU && a.device == nil {
		a.log.Error("a GPU is required and the trainer's could not be opened; the window is not armed", "window", a.pending.ID)
		a.pending = nil
		return
	}
	w := *a.pending
	if err := a.conn.send(&Message{Type: "window", ID: w.ID, Start: w.Start, Stop: w.Stop, MaxEntries: a.cfg.MaxEntries, Stacks: a.cfg.Stacks}); err != nil {
		a.log.Warn("could not send the window; it is sent again when the trainer reconnects", "err", err)
		return
	}
	a.pending, a.active = nil, &w
	a.samples = nil
	if a.device != nil && a.sampling == nil {
		ctx, cancel := context.WithCancel(context.Background())
		a.sampling = cancel
		go a.sample(ctx, a.device, a.hookPID)
	}
	a.log.Info("window armed", "window", w.ID, "start", w.Start, "stop", w.Stop)
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
			a.samples = append(a.samples, merge.MemorySample{TimeUS: s.TimeUS, DeviceUsedBytes: s.DeviceUsedBytes, ProcessUsedBytes: s.ProcessUsedBytes})
			a.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (a *Agent) handle(ctx context.Context, tc *trainerConn, m *Message) {
	switch m.Type {
	case "batch":
		a.mu.Lock()
		a.batch = *m.Batch
		a.mu.Unlock()
	case "error":
		a.log.Error("the trainer could not record", "window", m.Window, "message", m.Message)
		a.mu.Lock()
		if a.active != nil && a.active.ID == m.Window {
			a.active = nil
			a.stopSamplingLocked()
		}
		a.mu.Unlock()
	case "snapshot":
		if err := a.takeSnapshot(m); err != nil {
			a.log.Error("could not spool the trainer's snapshot", "file", m.File, "err", err)
		}
	case "hello":
		a.log.Warn("a second hello on one connection is ignored")
	}
}

func (a *Agent) stopSamplingLocked() []merge.MemorySample {
	if a.sampling != nil {
		a.sampling()
		a.sampling = nil
	}
	s := a.samples
	a.samples = nil
	return s
}

// takeSnapshot moves a finished snapshot into a spool job and wakes the uploader.
func (a *Agent) takeSnapshot(m *Message) error {
	src, err := a.sp.incomingFile(m.File)
	if err != nil {
		return err
	}
	a.mu.Lock()
	var w Window
	switch {
	case m.Reason == "oom":
		w = Window{ID: 0, Start: a.batch, Stop: a.batch + 1}
	case a.active != nil && a.active.ID == m.Window:
		w = *a.active
		a.active = nil
	default:
		a.mu.Unlock()
		return fmt.Errorf("snapshot for window %d, which this agent did not arm", m.Window)
	}
	var samples []merge.MemorySample
	if m.Reason == "window" {
		samples = a.stopSamplingLocked()
	}
	var info *merge.GPUInfo
	if a.device != nil {
		i := a.device.Info()
		info = &merge.GPUInfo{UUID: i.UUID, Name: i.Name, TotalBytes: i.TotalBytes, PCIBusID: i.PCIBusID}
	} else if a.uuid != "" {
		info = &merge.GPUInfo{UUID: a.uuid}
	}
	a.mu.Unlock()

	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	s, err := snapshot.DecodeAny(data)
	if err != nil {
		return fmt.Errorf("the trainer's snapshot does not decode: %w", err)
	}
	events := 0
	for _, tr := range s.DeviceTraces {
		events += len(tr)
	}
	id := a.cfg.Identity
	vars := naming.Vars{"run_name": id.RunName, "rank": id.Rank, "local_rank": id.LocalRank, "node_rank": id.NodeRank,
		"world_size": id.WorldSize, "local_world_size": max(id.LocalWorldSize, 1), "batch": w.Stop, "window": int64(w.ID)}
	folder, err := a.tmpl.remote.Render(vars)
	if err != nil {
		return err
	}
	name, err := a.tmpl.file.Render(vars)
	if err != nil {
		return err
	}
	if m.Reason == "oom" {
		name += ".oom"
	}
	key, err := naming.Join(folder, name+".pickle")
	if err != nil {
		return err
	}
	meta := merge.RankMeta{Version: 1, RunName: id.RunName, Rank: id.Rank, LocalRank: id.LocalRank, NodeRank: id.NodeRank,
		WorldSize: id.WorldSize, LocalWorldSize: id.LocalWorldSize, GPU: info, Reason: m.Reason, Samples: samples}
	meta.Hostname, _ = os.Hostname()
	if m.Reason == "window" {
		meta.Window = &merge.WindowInfo{ID: w.ID, Start: w.Start, Stop: w.Stop}
	}
	for _, b := range m.Batches {
		meta.Batches = append(meta.Batches, merge.BatchMark{Batch: b.Batch, StartUS: b.StartUS, EndUS: b.EndUS})
	}
	mb, _ := json.MarshalIndent(meta, "", "  ")
	sum, size := sha256Hex(data), int64(len(data))
	j := job{Key: key, MetaKey: merge.MetaName(key), SHA256: sum, Size: size, Events: events, Overwrite: a.cfg.Overwrite,
		Created: time.Now().UTC(), Window: w.ID, Rank: id.Rank}
	jobID, err := a.sp.addJob(m.File, src, j, mb)
	if err != nil {
		return err
	}
	a.log.Info("snapshot spooled", "window", w.ID, "reason", m.Reason, "events", events, "bytes", size, "key", key, "nvml_samples", len(samples), "job", jobID)
	a.up.kick()
	return nil
}
