package coordinator

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/internal/wait"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/merge/synth"
	"github.com/memsnap/memsnap/rankagent"
)

// The simulation runs many members of one run in one process: real coordinators
// (gossip, encryption, leader, planning, collection, merge and publication) on an
// in-memory network, each rank with a simulated trainer in place of its agent.

// --- the network ------------------------------------------------------------------

// simNet is an in-memory network for memberlist. memberlist's own MockNetwork hands
// each packet over an unbuffered channel, so a send waits until the receiver's
// listener takes it: a member that has stopped stalls every member that probes it
// (its channel is never read again), and two listeners that answer each other's
// pings at the same moment (memberlist acks from the listener) wait on each other;
// nor can it add a member while others run (its maps are not locked). Here, as
// with UDP, a packet goes into the receiver's queue or is dropped when the queue
// is full or the receiver is down; streams are in-memory pipes, refused by a
// member that is down.
type simNet struct {
	mu     sync.RWMutex
	nodes  map[string]*simTransport // by address
	next   uint32
	queue  int          // packets one member's receive queue holds
	sent   atomic.Int64 // packets sent
	bytes  atomic.Int64 // their bytes
	conns  atomic.Int64 // streams opened
	closed chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
}

func newSimNet() *simNet {
	return &simNet{nodes: map[string]*simTransport{}, queue: 1024, closed: make(chan struct{})}
}

// transport returns a new member's transport at an address of its own: one host
// per member, every member on the default gossip port.
func (n *simNet) transport() *simTransport {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next++
	ip := net.IPv4(10, byte(n.next>>16), byte(n.next>>8), byte(n.next))
	t := &simTransport{net: n, addr: &net.UDPAddr{IP: ip, Port: DefaultGossipPort},
		packets: make(chan *memberlist.Packet, n.queue), streams: make(chan net.Conn, 256), down: make(chan struct{})}
	n.nodes[t.addr.String()] = t
	return t
}

func (n *simNet) lookup(addr string) *simTransport {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.nodes[addr]
}

// close ends the goroutines that refuse the streams of members that are down.
func (n *simNet) close() {
	n.once.Do(func() { close(n.closed) })
	n.wg.Wait()
}

// dropped counts the packets dropped at full queues, over every member.
func (n *simNet) dropped() int64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var d int64
	for _, t := range n.nodes {
		d += t.dropped.Load()
	}
	return d
}

// simTransport is one member's end of a simNet.
type simTransport struct {
	net     *simNet
	addr    *net.UDPAddr
	packets chan *memberlist.Packet
	streams chan net.Conn
	down    chan struct{} // closed when the member stops or dies
	stop    sync.Once
	dropped atomic.Int64
}

var _ memberlist.NodeAwareTransport = (*simTransport)(nil)

func (t *simTransport) isDown() bool {
	select {
	case <-t.down:
		return true
	default:
		return false
	}
}

// kill takes the member off the network at once: nothing it sends arrives, nothing
// sent to it is taken, and connections to it are refused.
func (t *simTransport) kill() {
	t.stop.Do(func() {
		close(t.down)
		t.net.wg.Add(1)
		go func() {
			defer t.net.wg.Done()
			for {
				select {
				case c := <-t.streams:
					c.Close()
				case <-t.net.closed:
					return
				}
			}
		}()
	})
}

func (t *simTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return t.addr.IP, t.addr.Port, nil
}

func (t *simTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *simTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	if t.isDown() {
		return now, nil
	}
	dest := t.net.lookup(a.Addr)
	if dest == nil {
		return now, fmt.Errorf("sim: no route to %s", a.Addr)
	}
	if dest.isDown() {
		return now, nil
	}
	t.net.sent.Add(1)
	t.net.bytes.Add(int64(len(b)))
	select {
	case dest.packets <- &memberlist.Packet{Buf: bytes.Clone(b), From: t.addr, Timestamp: now}:
	default:
		dest.dropped.Add(1)
	}
	return now, nil
}

func (t *simTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *simTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *simTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.isDown() {
		return nil, errors.New("sim: this member is down")
	}
	dest := t.net.lookup(a.Addr)
	if dest == nil || dest.isDown() {
		return nil, fmt.Errorf("sim: connection to %s refused", a.Addr)
	}
	t.net.conns.Add(1)
	mine, theirs := net.Pipe()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case dest.streams <- theirs:
		return mine, nil
	case <-dest.down:
	case <-timer.C:
	}
	mine.Close()
	theirs.Close()
	return nil, fmt.Errorf("sim: connection to %s refused", a.Addr)
}

func (t *simTransport) StreamCh() <-chan net.Conn { return t.streams }

func (t *simTransport) Shutdown() error {
	t.kill()
	return nil
}

// --- the trainers -----------------------------------------------------------------

// simJob is the training job the simulated ranks run: data-parallel ranks advance
// in lockstep, so one clock serves them all; it ticks every step.
type simJob struct {
	step time.Duration
	tick atomic.Int64

	mu    sync.Mutex
	ranks []*simRank
}

// run ticks every step and wakes the ranks, until ctx ends.
func (j *simJob) run(ctx context.Context) {
	t := time.NewTicker(j.step)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		j.tick.Add(1)
		j.mu.Lock()
		ranks := j.ranks
		j.mu.Unlock()
		for _, r := range ranks {
			select {
			case r.wake <- struct{}{}:
			default:
			}
		}
	}
}

// simSnapshot is a real snapshot a simulated rank uploads as its window's.
type simSnapshot struct {
	data   []byte
	snap   *snapshot.Snapshot // decoded, for the rank's analysis
	sha    string
	events int
	t0, t1 int64 // the span of its trace (µs)

	mu       sync.Mutex
	analyses map[int64]*simAnalysis // by window length, under simConfig.OwnCores
}

// simAnalysis is a snapshot's analysis for windows of one length, computed once
// (as rank 0's, of a window starting at batch 0), and how long that took.
type simAnalysis struct {
	a    *analysis.RankAnalysis
	took time.Duration
}

// analysis returns the snapshot's analysis for a window of n batches, computing
// it the first time (every window's batch marks divide the snapshot's span alike).
func (s *simSnapshot) analysis(ctx context.Context, n int64) (*simAnalysis, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.analyses[n]; a != nil {
		return a, nil
	}
	meta := sidecar.RankMeta{Version: 1, Batches: s.marks(0, n)}
	t0 := time.Now()
	an, err := analysis.AnalyzeSnapshot(ctx, s.snap, &meta, analysis.AnalyzeOptions{Rank: 0})
	if err != nil {
		return nil, err
	}
	if s.analyses == nil {
		s.analyses = map[int64]*simAnalysis{}
	}
	a := &simAnalysis{a: an, took: time.Since(t0)}
	s.analyses[n] = a
	return a, nil
}

// marks divides the snapshot's span among the n batches from start.
func (s *simSnapshot) marks(start, n int64) []sidecar.BatchMark {
	var out []sidecar.BatchMark
	span := s.t1 - s.t0 + 1
	for i := int64(0); i < n; i++ {
		out = append(out, sidecar.BatchMark{Batch: start + i, StartUS: s.t0 + span*i/n, EndUS: s.t0 + span*(i+1)/n - 1})
	}
	return out
}

// as returns the analysis as rank's, of a window starting at batch start: what
// AnalyzeSnapshot gives for that rank's metadata (only the rank and the batch
// numbers differ). It shares everything else with a.
func (a *simAnalysis) as(rank int, start int64) *analysis.RankAnalysis {
	cp := *a.a
	cp.Rank = rank
	cp.Batches = slices.Clone(a.a.Batches)
	for i := range cp.Batches {
		cp.Batches[i].Batch += start
	}
	if a.a.PeakBatch != nil {
		b := *a.a.PeakBatch + start
		cp.PeakBatch = &b
	}
	return &cp
}

// simSnapshots returns four snapshots, one per rank of the recorded 4-rank DDP job;
// with events > 0 each is grown to at least that many trace events.
func simSnapshots(tb testing.TB, events int) []*simSnapshot {
	tb.Helper()
	var out []*simSnapshot
	for r := 0; r < 4; r++ {
		data, err := os.ReadFile(testutil.Snapshot(tb, fmt.Sprintf("ddp4/rank%d.5.memory_snapshot.pickle", r)))
		if err != nil {
			tb.Fatal(err)
		}
		s, err := snapshot.Decode(data)
		if err != nil {
			tb.Fatal(err)
		}
		if events > 0 {
			s = synth.Grow(s, events, int64(r)*4096)
			if data, err = snapshot.EncodeBytes(s); err != nil {
				tb.Fatal(err)
			}
		}
		ss := &simSnapshot{data: data, snap: s}
		sum := sha256.Sum256(data)
		ss.sha = hex.EncodeToString(sum[:])
		for _, tr := range s.DeviceTraces {
			ss.events += len(tr)
			for _, e := range tr {
				if ss.t0 == 0 || e.TimeUS < ss.t0 {
					ss.t0 = e.TimeUS
				}
				ss.t1 = max(ss.t1, e.TimeUS)
			}
		}
		out = append(out, ss)
	}
	return out
}

// simRank is one rank's simulated trainer and agent: the coordinator's Recorder.
// Its trainer follows the job's clock, one batch a tick; with holdAt set it waits
// before batch holdAt until it has a window armed (as the replay trainer's HoldAt
// does), so a test never depends on the machine's speed. It arms windows as the agent does (refusing stale ids, a second window, a start the
// trainer has passed), and reports each window's steps through Coordinator.Observe:
// armed, recording once the job reaches the start, and uploaded once it reaches
// the stop, after storing its snapshot and the sidecar whose batch marks are
// exactly the window's batches.
type simRank struct {
	id    rankagent.Identity
	job   *simJob
	st    store.Store
	snap  *simSnapshot
	coord *Coordinator
	wake  chan struct{}
	dead  atomic.Bool

	mu      sync.Mutex
	holdAt  int64 // > 0: the trainer waits before this batch until it has a window
	skew    int64 // the ticks it spent waiting
	win     rankagent.Window
	state   rankagent.WindowState
	active  bool
	lastID  uint64
	offset  time.Duration
	rtt     time.Duration
	offsetK bool
	queue   []rankagent.WindowEvent
	ended   map[uint64]time.Time // when the trainer passed each window's last batch
	gate    chan struct{}        // non-nil: a window's upload waits until it is closed (simLiveHeap)
	arrived chan struct{}        // closed when an upload first waits at the gate

	ownCores bool // simConfig.OwnCores
}

var _ Recorder = (*simRank)(nil)

func (r *simRank) Arm(w rankagent.Window) error {
	if w.Start < 0 || w.Stop <= w.Start || w.ID == 0 {
		return fmt.Errorf("sim: window %v", w)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch b := r.batchLocked(); {
	case r.dead.Load():
		return rankagent.ErrStopped
	case r.active && r.win == w:
		return nil
	case w.ID <= r.lastID:
		return fmt.Errorf("%w: %d, the agent has seen %d", rankagent.ErrStale, w.ID, r.lastID)
	case r.active:
		return fmt.Errorf("%w: %s is %s", rankagent.ErrBusy, r.win, r.state)
	case b >= w.Start:
		return fmt.Errorf("%w: the trainer is at batch %d, the window starts at %d", rankagent.ErrPassed, b, w.Start)
	}
	if r.holdAt > 0 {
		// released: from now on the trainer follows the clock from where it waits
		r.skew = max(r.job.tick.Load()-(r.holdAt-1), 0)
		r.holdAt = 0
	}
	r.lastID, r.win, r.active, r.state = w.ID, w, true, rankagent.WindowArmed
	r.postLocked(rankagent.WindowEvent{Window: w, State: rankagent.WindowArmed})
	return nil
}

func (r *simRank) Cancel(id uint64, reason string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.active || r.win.ID != id {
		r.lastID = max(r.lastID, id)
		return nil
	}
	r.active, r.state = false, rankagent.WindowCancelled
	r.postLocked(rankagent.WindowEvent{Window: r.win, State: rankagent.WindowCancelled, Reason: reason})
	return nil
}

// Batch is the batch the rank's trainer is in.
// Memory is the simulated trainer's memory figures (what a rank agent has once
// its trainer reports them), so every member sends its figures to the leader as
// a real one does.
func (r *simRank) Memory() (rankagent.MemoryView, bool) {
	b := r.Batch()
	return rankagent.MemoryView{Batch: b, At: time.Now(), Memory: rankagent.Memory{Allocated: 20 << 30, Reserved: 22 << 30, Peak: 21 << 30},
		DeviceTotal: 80 << 30, DeviceUsed: 60 << 30, Headroom: 20 << 30}, b >= 0
}

func (r *simRank) Batch() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.batchLocked()
}

func (r *simRank) batchLocked() int64 {
	b := r.job.tick.Load() - r.skew
	if r.holdAt > 0 {
		b = min(b, r.holdAt-1)
	}
	return b
}

func (r *simRank) Progress() (int64, time.Duration) {
	b := r.Batch()
	if b < 1 {
		return b, 0
	}
	return b, r.job.step
}

func (r *simRank) Current() (rankagent.Window, rankagent.WindowState, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.win, r.state, r.active
}

func (r *simRank) SetClockOffset(offset, rtt time.Duration) {
	r.mu.Lock()
	r.offset, r.rtt, r.offsetK = offset, rtt, true
	r.mu.Unlock()
}

func (r *simRank) Dump(id uint64) error {
	return errors.New("sim: the simulated trainer takes no post-mortems")
}

// postLocked queues an event for the rank's goroutine to hand to Observe (the
// agent, too, never calls out while it holds its lock).
func (r *simRank) postLocked(ev rankagent.WindowEvent) {
	ev.Batch, ev.Time = r.batchLocked(), time.Now()
	r.queue = append(r.queue, ev)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// run follows the job's batches and reports the window's steps until ctx ends.
func (r *simRank) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		}
		if r.dead.Load() {
			return
		}
		r.follow(ctx)
		r.mu.Lock()
		q := r.queue
		r.queue = nil
		r.mu.Unlock()
		for _, ev := range q {
			r.coord.Observe(ev)
		}
	}
}

// follow moves the armed window along with the job's batch.
func (r *simRank) follow(ctx context.Context) {
	r.mu.Lock()
	b := r.batchLocked()
	w := r.win
	if r.active && r.state == rankagent.WindowArmed && b >= w.Start {
		r.state = rankagent.WindowRecording
		r.postLocked(rankagent.WindowEvent{Window: w, State: rankagent.WindowRecording})
	}
	done := r.active && r.state == rankagent.WindowRecording && b >= w.Stop
	if done {
		r.state = rankagent.WindowSpooled
		if r.ended == nil {
			r.ended = map[uint64]time.Time{}
		}
		r.ended[w.ID] = time.Now()
	}
	var gate, arrived chan struct{}
	if done {
		gate, arrived = r.gate, r.arrived
		r.arrived = nil
	}
	r.mu.Unlock()
	if !done {
		return
	}
	if arrived != nil {
		close(arrived)
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	res := r.upload(ctx, w)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.active || r.win != w {
		return // cancelled meanwhile
	}
	r.active = false
	r.state = rankagent.WindowUploaded
	if res.Err != nil {
		r.state = rankagent.WindowFailed
	}
	r.postLocked(rankagent.WindowEvent{Window: w, State: r.state, Upload: res})
}

// setGate holds the rank's uploads until gate is closed (nil: never), and closes
// arrived when the first one waits.
func (r *simRank) setGate(gate, arrived chan struct{}) {
	r.mu.Lock()
	r.gate, r.arrived = gate, arrived
	r.mu.Unlock()
}

// simKey32 returns a fresh gossip key.
func simKey32() []byte {
	k := make([]byte, 32)
	rand.Read(k)
	return k
}

// simKey is where rank stores window w's snapshot: Composer's default name, whose
// {batch} is the window's stop.
func simKey(run string, rank int, w rankagent.Window) string {
	return fmt.Sprintf("%s/torch_memory_traces/rank%d.%d.memory_snapshot.pickle", run, rank, w.Stop)
}

// upload stores the rank's snapshot of w, its sidecar and its analysis, as the
// agent does. The batch marks divide the snapshot's own time span among the
// window's batches, so the merged timeline shows each batch over the events
// recorded in it.
func (r *simRank) upload(ctx context.Context, w rankagent.Window) *rankagent.UploadResult {
	key := simKey(r.id.RunName, r.id.Rank, w)
	res := &rankagent.UploadResult{Key: key, MetaKey: sidecar.MetaName(key), Size: int64(len(r.snap.data)), SHA256: r.snap.sha,
		Events: r.snap.events, Window: w, Reason: "window"}
	meta := sidecar.RankMeta{Version: 1, RunName: r.id.RunName, Rank: r.id.Rank, LocalRank: r.id.LocalRank, NodeRank: r.id.NodeRank,
		WorldSize: r.id.WorldSize, LocalWorldSize: r.id.LocalWorldSize, Hostname: fmt.Sprintf("node%04d", r.id.NodeRank),
		GPU: &sidecar.GPUInfo{UUID: fmt.Sprintf("GPU-sim-%d", r.id.Rank)}, Window: &sidecar.WindowInfo{ID: w.ID, Start: w.Start, Stop: w.Stop}, Reason: "window"}
	meta.Batches = r.snap.marks(w.Start, w.Stop-w.Start)
	r.mu.Lock()
	if r.offsetK {
		off, rtt := r.offset.Microseconds(), r.rtt.Microseconds()
		meta.ClockOffsetUS, meta.ClockRTTUS = &off, &rtt
	}
	r.mu.Unlock()
	mb, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		res.Err = err
		return res
	}
	var ab []byte
	analyze := func() (*analysis.RankAnalysis, error) {
		return analysis.AnalyzeSnapshot(ctx, r.snap.snap, &meta, analysis.AnalyzeOptions{Rank: r.id.Rank})
	}
	if r.ownCores {
		// the rank's analysis takes as long as on a core of its own, and none of
		// the cores every member shares here
		analyze = func() (*analysis.RankAnalysis, error) {
			a, err := r.snap.analysis(ctx, w.Stop-w.Start)
			if err != nil {
				return nil, err
			}
			t := time.NewTimer(a.took)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return a.as(r.id.Rank, w.Start), nil
		}
	}
	if an, err := analyze(); err == nil {
		an.Snapshot = analysis.SnapshotRef{Size: res.Size, SHA256: res.SHA256}
		if ab, err = an.Marshal(); err == nil {
			res.AnalysisKey = analysis.AnalysisName(key)
		}
	}
	put := func(k string, b []byte, sum string, overwrite bool) error {
		_, err := r.st.Put(ctx, k, bytes.NewReader(b), store.PutOptions{Size: int64(len(b)), SHA256: sum, Overwrite: overwrite})
		return err
	}
	err = put(key, r.snap.data, res.SHA256, false)
	if err == nil {
		err = put(res.MetaKey, mb, "", true)
	}
	if err == nil && res.AnalysisKey != "" {
		err = put(res.AnalysisKey, ab, "", true)
	}
	res.Err = err
	return res
}

// slowStore adds a fixed latency to every request, as an object store across a
// network does (the folder store answers in microseconds).
type slowStore struct {
	store.Store
	delay time.Duration
}

func (s slowStore) wait(ctx context.Context) error {
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (s slowStore) Put(ctx context.Context, key string, r io.Reader, opts store.PutOptions) (store.ObjectInfo, error) {
	if err := s.wait(ctx); err != nil {
		return store.ObjectInfo{}, err
	}
	return s.Store.Put(ctx, key, r, opts)
}

func (s slowStore) Get(ctx context.Context, key string) (io.ReadCloser, store.ObjectInfo, error) {
	if err := s.wait(ctx); err != nil {
		return nil, store.ObjectInfo{}, err
	}
	return s.Store.Get(ctx, key)
}

func (s slowStore) Stat(ctx context.Context, key string) (store.ObjectInfo, error) {
	if err := s.wait(ctx); err != nil {
		return store.ObjectInfo{}, err
	}
	return s.Store.Stat(ctx, key)
}

func (s slowStore) List(ctx context.Context, prefix string) ([]store.ObjectInfo, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.Store.List(ctx, prefix)
}

// --- what the members log ------------------------------------------------------

// simStep is one step of a window as a leader logged it, at the time it logged it.
type simStep struct {
	At     time.Time
	Member int    // the rank that logged it
	Msg    string // the log message: "window planned", "window progress", ...
	Window uint64
	Rank   int // the rank a progress step is about (-1: the window)
	State  string
}

// simLog collects what the members log: the leaders' steps of each window, and a
// count of every warning (memberlist's included).
type simLog struct {
	fwd   slog.Handler // also receives warnings (nil: none)
	lead  slog.Handler // also receives every leader's own records (nil: none)
	quiet atomic.Bool  // stops forwarding (memberlist's goroutines outlive its Shutdown)

	mu    sync.Mutex
	steps []simStep
	warns map[string]int
}

func newSimLog(fwd, lead slog.Handler) *simLog {
	return &simLog{fwd: fwd, lead: lead, warns: map[string]int{}}
}

// handler returns the log handler of one member.
func (l *simLog) handler(member int) slog.Handler { return &simHandler{log: l, member: member} }

func (l *simLog) warn(msg string) {
	if i := strings.IndexAny(msg, "0123456789"); i > 0 {
		msg = msg[:i]
	}
	l.mu.Lock()
	l.warns[msg]++
	l.mu.Unlock()
}

// Warnings returns the warnings logged, counted by message.
func (l *simLog) Warnings() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int, len(l.warns))
	for k, v := range l.warns {
		out[k] = v
	}
	return out
}

// Steps returns the steps logged that keep pick.
func (l *simLog) Steps(pick func(simStep) bool) []simStep {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []simStep
	for _, s := range l.steps {
		if pick(s) {
			out = append(out, s)
		}
	}
	return out
}

// RankTimes returns, for window id, when the leader saw each rank reach state (the
// first time).
func (l *simLog) RankTimes(id uint64, state string) map[int]time.Time {
	out := map[int]time.Time{}
	for _, s := range l.Steps(func(s simStep) bool {
		return s.Msg == "window progress" && s.Window == id && s.State == state && s.Rank >= 0
	}) {
		if _, ok := out[s.Rank]; !ok {
			out[s.Rank] = s.At
		}
	}
	return out
}

// First returns the first step with message msg about window id (0: any window)
// logged at or after since.
func (l *simLog) First(msg string, id uint64, since time.Time) (simStep, bool) {
	ss := l.Steps(func(s simStep) bool { return s.Msg == msg && (id == 0 || s.Window == id) && !s.At.Before(since) })
	if len(ss) == 0 {
		return simStep{}, false
	}
	return ss[0], true
}

type simHandler struct {
	log    *simLog
	member int
	attrs  []slog.Attr
	ml     bool // memberlist's bridged logger: everything at debug, its level in the text
	leader bool // the leader's logger
}

func (h *simHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *simHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	for _, a := range as {
		if a.Key == "from" && a.Value.String() == "memberlist" {
			c.ml = true
		}
		if a.Key == "role" && a.Value.String() == "leader" {
			c.leader = true
		}
	}
	return &c
}

func (h *simHandler) WithGroup(string) slog.Handler { return h }

var simSteps = map[string]bool{"window planned": true, "window progress": true, "window published": true, "window answered": true, "leading": true,
	"finishing the window a previous leader left": true, "the merge failed": true}

func (h *simHandler) Handle(ctx context.Context, r slog.Record) error {
	if h.ml {
		m := r.Message
		switch {
		case strings.HasPrefix(m, "[WARN]"), strings.HasPrefix(m, "[ERR]"):
			h.log.warn(m)
		case strings.HasPrefix(m, "[INFO] memberlist: Suspect"), strings.HasPrefix(m, "[INFO] memberlist: Marking"):
			h.log.warn(m) // counted: a live member taken for a failed one
			return nil
		default:
			return nil
		}
		if h.log.fwd != nil && !h.log.quiet.Load() {
			return h.log.fwd.WithAttrs(h.attrs).Handle(ctx, r)
		}
		return nil
	}
	if h.leader && h.log.lead != nil && !h.log.quiet.Load() {
		h.log.lead.WithAttrs(append(h.attrs, slog.Int("member", h.member))).Handle(ctx, r)
	}
	if r.Level >= slog.LevelWarn {
		h.log.warn(r.Message)
		if h.log.fwd != nil && !h.log.quiet.Load() {
			return h.log.fwd.WithAttrs(h.attrs).Handle(ctx, r)
		}
	}
	if !h.leader || !simSteps[r.Message] {
		return nil
	}
	s := simStep{At: r.Time, Member: h.member, Msg: r.Message, Rank: -1}
	set := func(a slog.Attr) bool {
		switch a.Key {
		case "window":
			s.Window = a.Value.Uint64()
		case "state":
			s.State = a.Value.String()
		case "of_rank":
			if r.Message == "window progress" {
				s.Rank = int(a.Value.Int64())
			}
		}
		return true
	}
	for _, a := range h.attrs {
		if a.Key == "window" {
			set(a)
		}
	}
	r.Attrs(set)
	h.log.mu.Lock()
	h.log.steps = append(h.log.steps, s)
	h.log.mu.Unlock()
	return nil
}

// --- the cluster ----------------------------------------------------------------

// simConfig describes a simulated cluster.
type simConfig struct {
	Members int           // ranks
	Step    time.Duration // the job's batch time
	HoldAt  int64         // > 0: each trainer holds before this batch until it has a window armed
	Events  int           // trace events per snapshot (0: the recorded snapshots as they are)
	Logs    slog.Handler  // receives the members' warnings (nil: they are only counted)
	// LeaderLogs receives every leader's own records, at any level (nil: none)
	LeaderLogs slog.Handler
	// StoreLatency is added to every store request (0: the folder store as it is).
	StoreLatency time.Duration
	// Tune, when set, adjusts each member's configuration after simTune (rank -1:
	// the client).
	Tune func(rank int, c *Config)
	// Loopback puts every member on memberlist's own UDP and TCP transport on
	// 127.0.0.1 instead of the in-memory network (which alone counts packets).
	Loopback bool
	// OwnCores gives each simulated rank's own work, its snapshot's analysis,
	// a core of its own, as on a real job's host: the analysis of each snapshot
	// and window length is computed once, and a rank uploading takes that long
	// before it stores its copy of it, without using the shared cores. Without
	// it every rank analyses its snapshot itself, and 1,024 ranks' analyses
	// compete for this machine's cores just when the window ends.
	OwnCores bool
}

// simTune sets a member up for a cluster of n members sharing one machine's
// cores. Each member does its own share of gossip, as it would on its own host,
// but here all of it competes for the same cores, and the cluster's total grows as
// n squared (each member relays every member's news), so:
//   - failure detection runs on production's timers (DefaultConfig): probes
//     every second with a 500 ms timeout, its suspicion multiplier, a 10 s TCP
//     timeout. The local preset's 100 ms probe timeout
//     takes a member waiting for a core for a dead one;
//   - gossip goes out at the LAN interval (200 ms) above 64 members, and the full
//     state is exchanged at the LAN interval (memberlist stretches it further with
//     the cluster's size); messages are retransmitted at the local preset's
//     multiplier (2, LAN: 4);
//   - gossip is not compressed: memberlist's LZW compression of every packet was
//     a quarter of the simulation's CPU time at 256 members;
//   - above 256 members two cores cannot keep up with memberlist's own gossip
//     while the cluster forms (each member gets a few thousandths of a core, and
//     its queue of news backs up for tens of seconds), so failure detection is
//     slowed until it survives that: probes every 5 s with a 2.5 s timeout, a
//     suspicion multiplier of 6, and a queue of 8,192 messages (1,024; past 1,024
//     members simQueues sets it, bounded by the machine's memory). Failover
//     times at those sizes then count this slower detection; BenchmarkScale
//     reports the detection and the new leader's work apart;
//   - each rank measures its clock against the leader every 10 minutes, not
//     every 30 s, so that the idle figures are gossip's alone (the measurement
//     is a round trip to the leader; it no longer makes a rank gossip its
//     metadata, which only the leader's window and term changes do).
func simTune(n int, c *Config) {
	ml := c.Memberlist
	ml.ProbeInterval = time.Second
	ml.ProbeTimeout = 500 * time.Millisecond
	ml.SuspicionMult = DefaultSuspicionMult
	ml.TCPTimeout = 10 * time.Second
	ml.PushPullInterval = 30 * time.Second
	if n > 64 {
		ml.GossipInterval = 200 * time.Millisecond
	}
	ml.EnableCompression = false
	if n > 256 {
		ml.ProbeInterval = 5 * time.Second
		ml.ProbeTimeout = 2500 * time.Millisecond
		ml.SuspicionMult = 6
		ml.HandoffQueueDepth = 8192
	}
	c.ClockInterval = 10 * time.Minute
}

// simCluster is a running simulated cluster.
type simCluster struct {
	tb     testing.TB
	cfg    simConfig
	run    string
	key    []byte
	net    *simNet
	job    *simJob
	st     *store.Dir
	dir    string
	log    *simLog
	ranks  []*simRank
	coords []*Coordinator
	trs    []*simTransport // nil on loopback
	seed   string          // rank 0's gossip address, which every member joins
	client *Coordinator

	ctx     context.Context
	cancel  context.CancelFunc
	cancels []context.CancelFunc // each rank's, then the client's
	wg      sync.WaitGroup
	// Formed is how long the cluster took to form.
	Formed time.Duration
}

// startSim starts cfg.Members ranks and a client on a simNet and waits until every
// member sees every other; the cluster stops when the test ends.
func startSim(tb testing.TB, cfg simConfig) *simCluster {
	tb.Helper()
	t0 := time.Now()
	dir := tb.TempDir()
	st, err := store.OpenDir(dir, true)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sn := newSimNet()
	packets, news := simQueues(cfg.Members)
	sn.queue = max(sn.queue, packets)
	sc := &simCluster{tb: tb, cfg: cfg, run: fmt.Sprintf("sim%d", time.Now().UnixNano()%1e6), key: simKey32(), net: sn,
		job: &simJob{step: cfg.Step}, st: st, dir: dir, log: newSimLog(cfg.Logs, cfg.LeaderLogs), ctx: ctx, cancel: cancel}
	tb.Cleanup(sc.stop)
	snaps := simSnapshots(tb, cfg.Events)
	if cfg.OwnCores {
		for _, s := range snaps { // timed now, on a quiet machine
			if _, err := s.analysis(ctx, 3); err != nil {
				tb.Fatal(err)
			}
		}
	}
	n := cfg.Members
	if cfg.Loopback {
		sc.seed = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(tb))
	}
	var sst store.Store = st
	if cfg.StoreLatency > 0 {
		sst = slowStore{Store: st, delay: cfg.StoreLatency}
	}
	openStore := func(context.Context) (store.Store, error) { return sst, nil }
	for r := 0; r < n; r++ {
		id := rankagent.Identity{RunName: sc.run, Rank: r, LocalRank: r % 8, NodeRank: r / 8, WorldSize: n, LocalWorldSize: min(n, 8), Launcher: "sim"}
		rk := &simRank{id: id, job: sc.job, st: sst, snap: snaps[r%len(snaps)], wake: make(chan struct{}, 1), holdAt: cfg.HoldAt, ownCores: cfg.OwnCores}
		c := DefaultLocalConfig(id)
		c.SecretKey, c.OpenStore, c.Logger = sc.key, openStore, slog.New(sc.log.handler(r))
		var tr *simTransport
		if cfg.Loopback {
			if r == 0 {
				_, port, _ := net.SplitHostPort(sc.seed)
				c.Memberlist.BindPort, _ = strconv.Atoi(port)
			}
		} else {
			tr = sc.net.transport()
			c.Memberlist.Transport = tr
			if r == 0 {
				sc.seed = tr.addr.String()
			}
		}
		simTune(n, &c)
		if r > 0 {
			c.Join = []string{sc.seed}
		}
		if cfg.Tune != nil {
			cfg.Tune(r, &c)
		}
		if n > 1024 {
			// (memberlist's queue of news to handle, for the same reason, in
			// place of simTune's: simQueues)
			c.Memberlist.HandoffQueueDepth = news
		}
		coord, err := New(c, rk)
		if err != nil {
			tb.Fatal(err)
		}
		rk.coord = coord
		sc.ranks, sc.coords, sc.trs = append(sc.ranks, rk), append(sc.coords, coord), append(sc.trs, tr)
	}
	sc.job.ranks = sc.ranks
	sc.wg.Add(1)
	go func() { defer sc.wg.Done(); sc.job.run(ctx) }()
	// members join rank 0 a wave at a time, as a launcher's hosts come up; above
	// 256 members the next wave waits until the gossip announcing the last one has
	// died down, so that it never starves failure detection of the cores every
	// member shares
	wave := max(32, n/32)
	if n > 1024 {
		// the forming's gossip allocates for every message it decodes, and
		// thousands of members' state is a heap of gigabytes that each
		// collection marks again: while the cluster forms the collector runs
		// half as often (under a soft limit of 70% of the machine's memory);
		// the windows measured later run at the default again
		gc, limit := debug.SetGCPercent(200), debug.SetMemoryLimit(-1)
		if mem := totalMemory(); mem > 0 {
			debug.SetMemoryLimit(int64(mem / 10 * 7))
		}
		defer debug.SetMemoryLimit(limit)
		defer debug.SetGCPercent(gc)
	}
	load := newSimLoad()
	for r := range sc.ranks {
		sc.startMember(sc.coords[r], sc.ranks[r])
		if r == 0 {
			sc.wait(10*time.Second, "rank 0's gossip", func() bool { return sc.coords[0].Addr() != "" })
		}
		if started := r + 1; started%wave == 0 || started == n {
			sc.wait(5*time.Minute, fmt.Sprintf("%d ranks to join rank 0", started), func() bool { return sc.coords[0].numMembers() >= started })
			if n > 2048 {
				// (thousands of idle members keep most cores busy by themselves:
				// a wave waits for the last one's gossip a while, not for quiet)
				quiet(5*time.Second, started)
			} else if n > 256 {
				quiet(time.Minute, started)
			}
			if n >= 1024 {
				// (seen as it goes: forming thousands of members takes minutes)
				fmt.Fprintf(os.Stderr, "# %d of %d members joined, %v; since the last wave %s; %d packets dropped at full queues, %d news at full handler queues\n",
					started, n, time.Since(t0).Round(time.Second), load.since(),
					sc.net.dropped(), sc.log.Warnings()["[WARN] memberlist: handler queue full, dropping message ("])
			}
		}
	}
	// every member has the membership rank 0 had when it joined, and gossip brings
	// it the later ones; a member that missed some (gossip drops what a full
	// queue cannot take) exchanges full state once more with a member that
	// sees them all, picked at random (rank 0 alone serves 128 exchanges at a
	// time, and past a thousand members many miss a few)
	lacking := func() (k int) {
		for _, c := range sc.coords {
			if c.numMembers() < n {
				k++
			}
		}
		return k
	}
	converged := func() bool { return lacking() == 0 }
	if n > 2048 {
		// thousands of members go on passing the last waves' news on for
		// minutes after the last join, and it reaches most of the members that
		// missed some: the exchanges (each a member's whole state) wait while
		// that gossip still fills in members: up to 2 minutes, until their count
		// has not fallen for 30 s
		load := newSimLoad()
		best, bestAt := lacking(), time.Now()
		for end := time.Now().Add(2 * time.Minute); best > 0 && time.Since(bestAt) < 30*time.Second; {
			time.Sleep(15 * time.Second)
			k := lacking()
			if k < best {
				best, bestAt = k, time.Now()
			}
			fmt.Fprintf(os.Stderr, "# %d of %d members miss some of the others, %v; %s\n", k, n, time.Since(t0).Round(time.Second), load.since())
			if !time.Now().Before(end) {
				break
			}
		}
	}
	for try := 0; try < 30 && !converged(); try++ {
		full := []string{sc.seed}
		for _, c := range sc.coords[1:] {
			if c.numMembers() >= n {
				full = append(full, c.Addr())
			}
		}
		var behind []*memberlist.Memberlist
		for _, c := range sc.coords[1:] {
			if c.numMembers() >= n {
				continue
			}
			if m := c.memberlist(); m != nil {
				behind = append(behind, m)
			}
		}
		if n >= 1024 {
			fmt.Fprintf(os.Stderr, "# %d of %d members missed some of the others, %d see them all; exchanging state, %v\n", len(behind), n, len(full), time.Since(t0).Round(time.Second))
		}
		var done, failed atomic.Int64
		var firstErr atomic.Value
		load := newSimLoad()
		line := func() {
			e, _ := firstErr.Load().(string)
			if e != "" {
				e = " (the first: " + e + ")"
			}
			fmt.Fprintf(os.Stderr, "# %d of %d exchanges done, %d failed%s, %v; %s\n", done.Load(), len(behind), failed.Load(), e, time.Since(t0).Round(time.Second), load.since())
		}
		stopLines, linesDone := make(chan struct{}), make(chan struct{})
		go func() { // (a line every 15 s while the exchanges last)
			defer close(linesDone)
			tick := time.NewTicker(15 * time.Second)
			defer tick.Stop()
			for n >= 1024 {
				select {
				case <-stopLines:
					return
				case <-tick.C:
					line()
				}
			}
		}()
		sem, joins := make(chan struct{}, 32), sync.WaitGroup{}
		for _, m := range behind {
			sem <- struct{}{} // (32 at a time: one member's join waits on its exchange)
			joins.Go(func() {
				defer func() { <-sem }()
				if _, err := m.Join([]string{full[mrand.IntN(len(full))]}); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
				done.Add(1)
			})
		}
		joins.Wait()
		close(stopLines)
		<-linesDone
		if n >= 1024 {
			line()
		}
		sc.waitFor(10*time.Second, converged)
	}
	sc.wait(time.Minute, "every rank to see every rank", converged)
	cc := DefaultLocalConfig(rankagent.Identity{RunName: sc.run})
	cc.Client, cc.SecretKey, cc.Logger = true, sc.key, slog.New(sc.log.handler(-1))
	if !cfg.Loopback {
		cc.Memberlist.Transport = sc.net.transport()
	}
	cc.Join = []string{sc.seed}
	simTune(n, &cc)
	if cfg.Tune != nil {
		cfg.Tune(-1, &cc)
	}
	client, err := New(cc, nil)
	if err != nil {
		tb.Fatal(err)
	}
	sc.client = client
	sc.startMember(client, nil)
	sc.wait(time.Minute, "the client to see the leader", func() bool {
		_, ok := client.Leader()
		return ok && sc.coords[0].numMembers() > n
	})
	sc.Formed = time.Since(t0)
	return sc
}

// startMember runs a member (and its trainer) until the cluster stops or it is killed.
func (sc *simCluster) startMember(c *Coordinator, rk *simRank) {
	ctx, cancel := context.WithCancel(sc.ctx)
	sc.cancels = append(sc.cancels, cancel)
	sc.wg.Add(1)
	// labelled, for BenchmarkScale's CPU profile (every goroutine the member
	// starts carries its label)
	member, trainer := "client", ""
	if rk != nil {
		member, trainer = fmt.Sprintf("rank%d", rk.id.Rank), fmt.Sprintf("trainer%d", rk.id.Rank)
	}
	go pprof.Do(ctx, pprof.Labels("member", member), func(ctx context.Context) { defer sc.wg.Done(); c.Run(ctx) })
	if rk != nil {
		sc.wg.Add(1)
		go pprof.Do(ctx, pprof.Labels("member", trainer), func(ctx context.Context) { defer sc.wg.Done(); rk.run(ctx) })
	}
}

// quiet waits until this process uses less than one core (an eighth of the
// machine's cores on a larger machine: 1,024 idle members use more than one of
// 16), up to timeout.
func quiet(timeout time.Duration, members int) {
	// (the members' own idle load, about 2.5 ms of CPU a second each, is not
	// the gossip of a join: above an eighth of the cores it sets the bar, up
	// to three quarters of them; at 4,096 members it would be past the whole
	// machine, and a bar no process can exceed holds no wave back)
	cores := float64(runtime.NumCPU())
	limit := min(max(max(1, cores/8), float64(members)*0.004), max(1, 0.75*cores))
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		c0, t0 := processCPU(), time.Now()
		time.Sleep(500 * time.Millisecond)
		if float64(processCPU()-c0) < limit*float64(time.Since(t0)) {
			return
		}
	}
}

// simQueues is how many packets a member's receive queue holds and how many
// messages its queue of news (memberlist's HandoffQueueDepth) in a cluster of n
// members. Past 1,024 members the forming's gossip keeps every core busy for
// minutes and a member's listener waits its turn for one (a real member on its
// own host drains its socket's buffer as packets come), so its queues hold more:
// four and eight times 1,024, but, above a floor of 1,024 each, never more over
// every member than a fifth of this machine's memory at a full packet (1,400
// bytes) a slot. A queued message holds its whole packet: at 4,096 members full
// queues of four and eight times 1,024 would hold 66 GiB (the 16-core machine's
// memory stayed at 85 to 88 of its 128 GiB once they were full). At 1,024
// members or fewer it is 1,024 packets and no news queue (0: simTune's stands).
func simQueues(n int) (packets, news int) {
	if n <= 1024 {
		return 1024, 0
	}
	packets, news = 4096, 8192
	if mem := totalMemory(); mem > 0 {
		slots := int(mem / 5 / 1400 / uint64(n)) // (per member, both queues)
		packets = min(packets, max(1024, slots/3))
		news = min(news, max(1024, slots-packets))
	}
	return packets, news
}

// simLoad is the process's load between two progress lines.
type simLoad struct {
	cpu time.Duration
	at  time.Time
	gc  gcStats
}

func newSimLoad() *simLoad { return &simLoad{cpu: processCPU(), at: time.Now(), gc: readGC()} }

// since says the load since the last call (or newSimLoad): the cores busy, the
// collections and the collector's share of the CPU (the runtime's estimate,
// brought up to date at the end of each collection), and the heap in use.
func (l *simLoad) since() string {
	cpu, at, g := processCPU(), time.Now(), readGC()
	gc := "no collection"
	if c := g.cycles - l.gc.cycles; c > 0 {
		gc = fmt.Sprintf("%d collections", c)
		if c == 1 {
			gc = "1 collection"
		}
		if busy := g.busy - l.gc.busy; busy > 0 {
			gc += fmt.Sprintf(", %.0f%% of the CPU the collector's", 100*min(1, (g.gc-l.gc.gc)/busy))
		}
	}
	s := fmt.Sprintf("%.1f cores busy (%s), heap %.1f GiB", float64(cpu-l.cpu)/float64(max(at.Sub(l.at), time.Millisecond)), gc, float64(heapNow())/(1<<30))
	l.cpu, l.at, l.gc = cpu, at, g
	return s
}

// gcStats is the collector's CPU time and the CPU time not idle (seconds, as
// runtime/metrics estimates them), and the collections so far.
type gcStats struct {
	gc, busy float64
	cycles   uint64
}

func readGC() gcStats {
	ms := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/cpu/classes/total:cpu-seconds"},
		{Name: "/cpu/classes/idle:cpu-seconds"}, {Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(ms)
	f := func(i int) float64 {
		if ms[i].Value.Kind() != metrics.KindFloat64 {
			return 0
		}
		return ms[i].Value.Float64()
	}
	var g gcStats
	g.gc, g.busy = f(0), f(1)-f(2)
	if ms[3].Value.Kind() == metrics.KindUint64 {
		g.cycles = ms[3].Value.Uint64()
	}
	return g
}

// heapNow is the heap in use (HeapInuse, read without stopping the world).
func heapNow() uint64 {
	ms := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"}}
	metrics.Read(ms)
	return ms[0].Value.Uint64() + ms[1].Value.Uint64()
}

// totalMemory is this machine's memory in bytes (0 where /proc has none).
func totalMemory() uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// processCPU is the process's user and system time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// waitFor polls cond until it holds or timeout passes, and reports which.
func (sc *simCluster) waitFor(timeout time.Duration, cond func() bool) bool {
	ok, _ := wait.Until(context.Background(), timeout, cond)
	return ok
}

// wait polls cond until it holds; past timeout the test fails, saying what the
// members logged.
func (sc *simCluster) wait(timeout time.Duration, what string, cond func() bool) {
	sc.tb.Helper()
	if ok, _ := wait.Until(context.Background(), timeout, cond); !ok {
		sc.tb.Fatalf("timed out after %v waiting for %s; %d packets dropped at full queues; warnings logged: %v", timeout, what, sc.net.dropped(), sc.log.Warnings())
	}
}

// kill stops rank r as a crash would: it drops off the network at once, its
// trainer reports nothing more, and its coordinator shuts down unheard.
func (sc *simCluster) kill(r int) {
	sc.ranks[r].dead.Store(true)
	if t := sc.trs[r]; t != nil {
		t.kill()
	} else {
		sc.coords[r].Shutdown() // memberlist stops unheard, without leaving
	}
	sc.cancels[r]()
}

// holding waits until every trainer holds before the hold batch.
func (sc *simCluster) holding() {
	sc.tb.Helper()
	sc.wait(time.Minute, "every trainer to hold", func() bool {
		for _, r := range sc.ranks {
			if r.Batch() != sc.cfg.HoldAt-1 {
				return false
			}
		}
		return true
	})
}

// stop stops every member and waits for them.
func (sc *simCluster) stop() {
	sc.log.quiet.Store(true)
	for _, t := range sc.trs {
		if t != nil {
			t.kill() // no member waits on another's goodbye
		}
	}
	sc.cancel()
	sc.wg.Wait()
	sc.net.close()
}

// leader returns the rank every live member agrees leads, or -1.
func (sc *simCluster) leader() int {
	l := -1
	for r, c := range sc.coords {
		if sc.ranks[r].dead.Load() {
			continue
		}
		got, ok := c.Leader()
		if !ok || (l >= 0 && got != l) {
			return -1
		}
		l = got
	}
	return l
}

// manifest reads a published window's manifest.
func (sc *simCluster) manifest(url string) *publish.Manifest {
	sc.tb.Helper()
	b, err := os.ReadFile(url)
	if err != nil {
		sc.tb.Fatal(err)
	}
	m, err := publish.ParseManifest(b)
	if err != nil {
		sc.tb.Fatal(err)
	}
	return m
}

// quantile returns the q-quantile (0..1) of ds, nearest rank.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q*float64(len(s)) + 0.5)
	return s[min(max(i-1, 0), len(s)-1)]
}

// TestSimWindow: 64 members of one run on an in-memory network, each rank with a
// simulated trainer; a client asks for a window; every rank acks it (as the leader
// sees), records it and uploads a real snapshot, and the leader publishes the
// window with every rank merged.
func TestSimWindow(t *testing.T) {
	const n = 64
	sc := startSim(t, simConfig{Members: n, Step: 20 * time.Millisecond, HoldAt: 5, Logs: testutil.Logger(t).Handler()})
	sc.holding()
	res, err := sc.client.Snapshot(testutil.Context(t, 2*time.Minute), 3, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != n || len(res.Missing) != 0 || res.Stop-res.Start != 3 {
		t.Fatalf("result: state %s, %d ranks merged, missing %v, batches [%d, %d): %s", res.State, len(res.Ranks), res.Missing, res.Start, res.Stop, res.Error)
	}
	m := sc.manifest(res.Manifest)
	if m.Window == nil || len(m.RanksMerged) != n || len(m.MissingRanks) != 0 || len(m.Inputs) != n || fmt.Sprint(m.Batches) != fmt.Sprint([]int64{res.Start, res.Start + 1, res.Start + 2}) {
		t.Fatalf("manifest: window %+v, %d ranks merged, missing %v, %d inputs, batches %v", m.Window, len(m.RanksMerged), m.MissingRanks, len(m.Inputs), m.Batches)
	}
	acked := sc.log.RankTimes(m.Window.ID, "acked")
	uploaded := sc.log.RankTimes(m.Window.ID, "uploaded")
	for r := 0; r < n; r++ {
		if _, ok := acked[r]; !ok {
			t.Errorf("the leader never saw rank %d ack window %d", r, m.Window.ID)
		}
		if _, ok := uploaded[r]; !ok {
			t.Errorf("the leader never saw rank %d's upload of window %d", r, m.Window.ID)
		}
	}
	for _, in := range m.Inputs {
		if want := fmt.Sprintf("rank%d.%d.memory_snapshot.pickle", in.Rank, res.Stop); filepath.Base(in.Source) != want {
			t.Errorf("rank %d's input %s, want %s", in.Rank, in.Source, want)
		}
	}
}

// TestSimQueues: past 1,024 members the simulation's queues hold more, but
// never, over every member, more than a fifth of the machine's memory (above
// the floor of 1,024 each).
func TestSimQueues(t *testing.T) {
	if p, q := simQueues(1024); p != 1024 || q != 0 {
		t.Errorf("1,024 members: queues %d and %d, want 1,024 and simTune's", p, q)
	}
	mem := totalMemory()
	for _, n := range []int{1056, 2048, 4096, 16384} {
		p, q := simQueues(n)
		if p < 1024 || q < 1024 || p > 4096 || q > 8192 {
			t.Errorf("%d members: queues %d and %d, want 1,024 to 4,096 and 1,024 to 8,192", n, p, q)
		}
		if mem > 0 && (p > 1024 || q > 1024) && uint64(n)*uint64(p+q)*1400 > mem/5 {
			t.Errorf("%d members: queues %d and %d hold %d MiB, over a fifth of %d MiB", n, p, q, uint64(n)*uint64(p+q)*1400>>20, mem>>20)
		}
	}
}
