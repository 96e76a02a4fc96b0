package coordinator

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/coordinator/leader"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/sidecar"
)

var (
	simSizes        = flag.String("sim.sizes", "64,256,1024", "BenchmarkScale: members per simulated cluster")
	simEvents       = flag.String("sim.events", "100000,20000,5000", "BenchmarkScale: trace events of each rank's snapshot, per size (0: the recorded 549-event snapshots)")
	simRepeats      = flag.Int("sim.repeats", 5, "BenchmarkScale: windows per size")
	simFailovers    = flag.Int("sim.failovers", 3, "BenchmarkScale: leaders killed mid-window per size")
	simBatch        = flag.Duration("sim.step", 250*time.Millisecond, "BenchmarkScale: the simulated job's batch time")
	simIdle         = flag.Duration("sim.idle", 10*time.Second, "BenchmarkScale: how long the idle cluster's load is measured")
	simSettleMax    = flag.Duration("sim.settle", 3*time.Minute, "BenchmarkScale: how long, at most, the formed cluster's gossip is given to settle before its idle load is measured (0: not at all)")
	simLatency      = flag.Duration("sim.store-latency", 0, "BenchmarkScale: latency added to every store request (0: the folder store as it is)")
	simLoopback     = flag.Bool("sim.loopback", false, "BenchmarkScale: members on memberlist's UDP/TCP transport over 127.0.0.1 instead of the in-memory network (packets are then not counted)")
	simCompress     = flag.Bool("sim.compress", false, "BenchmarkScale: memberlist's compression of gossip (memberlist's default; off in the simulation, see simTune)")
	simFiguresEvery = flag.Duration("sim.figures", 5*time.Second, "BenchmarkScale: how often each member sends its memory figures to the leader (Config.FiguresInterval; 0: never)")
	simOwnCores     = flag.Bool("sim.own-cores", true, "BenchmarkScale: each simulated rank's analysis takes its time on a core of its own, as on a real job's host (simConfig.OwnCores); false: every rank analyses its snapshot on the shared cores")
	simProfile      = flag.String("sim.cpuprofile", "", "BenchmarkScale: write a CPU profile of each size's timed windows to this path with the size appended (FILE-1024.prof); samples carry the label member=rankR (rank R's agent and its goroutines), client or trainerR")
	simLeaderLog    = flag.String("sim.leader-log", "", "BenchmarkScale: write every leader's own log records (its windows' plans, progress, recoveries) to this file, to trace where a window's time goes")
	simProd         = flag.Bool("sim.production", false, "BenchmarkScale: every member on production's timers (DefaultConfig: probes, suspicion, gossip, push-pull, clock refresh) at every size, not simTune's slower detection above 256 members (for a machine with cores enough)")
)

// simFigures is what BenchmarkScale measures for one size.
type simFigures struct {
	members, events, snapBytes int
	formed                     time.Duration
	analysis                   time.Duration // a rank's analysis on a core of its own (OwnCores), 0 when each rank analyses on the shared cores
	idleCores                  float64       // CPU in use while no window records, in cores
	idleHeap                   uint64        // heap in use then
	idlePackets                float64       // packets a second then
	settled                    time.Duration // how long the gossip of the cluster's forming took to settle (simSettle)
	settleRate                 float64       // packets a second then
	idleRSS                    uint64        // the process's resident memory then, less before the cluster started
	idleSilences, idleTerms    uint64        // over the idle span: leaders held silent (summed over members), terms taken
	toPlan                     []time.Duration
	acks                       []time.Duration // every rank's, trigger to the leader taking its ack, over every window
	planAcks                   []time.Duration // the same from the plan
	allAcked                   []time.Duration // per window
	published                  []time.Duration // trigger to the client's published result
	answered                   []time.Duration // trigger to the leader's answer (summary, report, diff) published
	answerMerge                []time.Duration // last rank's upload to the answer published
	merge                      []time.Duration // last rank's upload to publication
	toEnd, endUpload           []time.Duration // trigger to the first trainer past the window's last batch; from then to the last upload
	collectHeap, mergeHeap     []uint64        // peak heap growth over the window's start
	packets, conns, cpu        []float64       // per window: packets and streams on the network, CPU time (s)
	live                       []liveHeap      // the leader's live heap while it collects (simLiveHeap)
	replans                    int
	detect, takeover, recover  []time.Duration // failovers
	recoverAnswer              []time.Duration // a failover's old leader's death to the window's answer
	failed                     []string
	dropped                    int64
	warnings                   map[string]int
}

// BenchmarkScale runs a simulated cluster of each size in -sim.sizes and measures
// on-demand windows (-sim.repeats of them) and leader failures mid-window
// (-sim.failovers); it prints a table of the figures. Run it with -benchtime 1x
// (scripts/bench-scale.sh does).
func BenchmarkScale(b *testing.B) {
	sizes, err := intList(*simSizes)
	if err != nil {
		b.Fatal(err)
	}
	events, err := intList(*simEvents)
	if err != nil {
		b.Fatal(err)
	}
	var all []*simFigures
	for i, n := range sizes {
		ev := 0
		if i < len(events) {
			ev = events[i]
		}
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			f := simBench(b, n, ev)
			all = append(all, f)
			if len(f.acks) > 0 {
				b.ReportMetric(ms(quantile(f.acks, 0.5)), "ack-p50-ms")
				b.ReportMetric(ms(quantile(f.acks, 0.99)), "ack-p99-ms")
			}
			if len(f.published) > 0 {
				b.ReportMetric(ms(quantile(f.published, 0.5)), "published-ms")
			}
			if len(f.recover) > 0 {
				b.ReportMetric(ms(quantile(f.recover, 0.5)), "failover-ms")
			}
		})
	}
	printFigures(os.Stdout, all)
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("sim: %q: %w", s, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// productionTimers puts a simulated member on production's timers (DefaultConfig's:
// failure detection, gossip, the leader's waits), whatever simTune chose for the
// cluster's size.
func productionTimers(c *Config) {
	d := DefaultConfig(c.Identity)
	ml, p := c.Memberlist, d.Memberlist
	ml.ProbeInterval, ml.ProbeTimeout, ml.SuspicionMult = p.ProbeInterval, p.ProbeTimeout, p.SuspicionMult
	ml.IndirectChecks, ml.RetransmitMult, ml.AwarenessMaxMultiplier = p.IndirectChecks, p.RetransmitMult, p.AwarenessMaxMultiplier
	ml.GossipInterval, ml.GossipNodes, ml.GossipToTheDeadTime = p.GossipInterval, p.GossipNodes, p.GossipToTheDeadTime
	ml.PushPullInterval, ml.TCPTimeout, ml.HandoffQueueDepth = p.PushPullInterval, p.TCPTimeout, p.HandoffQueueDepth
	// and the coordinator's own timers (the local preset's are shorter)
	c.LeadMargin, c.StatusTimeout, c.JoinGrace, c.RejoinGrace, c.AckTimeout = d.LeadMargin, d.StatusTimeout, d.JoinGrace, d.RejoinGrace, d.AckTimeout
	c.CollectTimeout, c.ClockInterval, c.PostmortemDeadline = d.CollectTimeout, d.ClockInterval, d.PostmortemDeadline
	c.MaxWindowWait, c.PublishTimeout, c.SweepInterval, c.RejoinInterval = d.MaxWindowWait, d.PublishTimeout, d.SweepInterval, d.RejoinInterval
	c.LeaderProbe, c.LeaderSilence = d.LeaderProbe, d.LeaderSilence
}

// processRSS is this process's resident memory in bytes (0 where /proc has none).
func processRSS() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return pages * uint64(os.Getpagesize())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// heapSampler samples the heap in use until stopped.
type heapSampler struct {
	mu      sync.Mutex
	samples []heapSample
	stop    chan struct{}
	done    chan struct{}
}

type heapSample struct {
	at   time.Time
	heap uint64
}

func sampleHeap(every time.Duration) *heapSampler {
	h := &heapSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			heap := heapNow() // (no stop of the world every sample)
			h.mu.Lock()
			h.samples = append(h.samples, heapSample{time.Now(), heap})
			h.mu.Unlock()
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func (h *heapSampler) end() {
	close(h.stop)
	<-h.done
}

// peak is the largest sample taken in [from, to].
func (h *heapSampler) peak(from, to time.Time) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var p uint64
	for _, s := range h.samples {
		if !s.at.Before(from) && !s.at.After(to) {
			p = max(p, s.heap)
		}
	}
	return p
}

// collected is the heap's figures after a forced collection.
func collected() runtime.MemStats {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms
}

// heapInuse is the heap in use after a forced collection: the live heap in
// whole spans, as heapNow reads the heap, garbage and all.
func heapInuse() uint64 { return collected().HeapInuse }

// heapLive is the live heap: the bytes of live objects after a forced
// collection.
func heapLive() uint64 { return collected().HeapAlloc }

// leaderPackages are the packages whose code only a leader runs here: its own,
// and the merge's (whose goroutines' stacks do not go back to the leader's).
// The ranks' analyses are merge/analysis's, not the merge's.
var leaderPackages = []string{"github.com/memsnap/memsnap/coordinator/leader.", "github.com/memsnap/memsnap/merge."}

// leaderHeapAlloc is the live heap that leader code allocated, and the bytes it
// has allocated since the program started, as of the last collection (heapLive
// forces one): the heap profile's records whose stack holds a frame of the
// leaderPackages, scaled from their samples as runtime/pprof scales them. Every
// member runs the same code, but only the leader runs those packages', so it is
// the leader's own memory however the rest of the simulation's heap moves
// meanwhile (what other code allocated and the leader keeps is not in it). It
// reads the profile's text form, whose stacks keep up to GODEBUG's
// profstackdepth frames (128; runtime.MemProfile's records keep 32).
func leaderHeapAlloc() (inuse, alloc uint64) {
	var buf bytes.Buffer
	if err := pprof.Lookup("heap").WriteTo(&buf, 1); err != nil {
		return 0, 0
	}
	return leaderHeapOf(buf.String(), float64(runtime.MemProfileRate))
}

// leaderHeapOf sums, in a heap profile's text form (debug=1) sampled at rate, the
// scaled bytes in use, and allocated, of the records with a frame of the
// leaderPackages.
func leaderHeapOf(text string, rate float64) (inuse, alloc uint64) {
	var total, allocated float64
	var count, size, acount, asize int64
	leader := false
	scaled := func(count, size int64) float64 {
		if count <= 0 || size <= 0 {
			return 0
		}
		if rate <= 1 {
			return float64(size)
		}
		return float64(size) / (1 - math.Exp(-float64(size)/float64(count)/rate))
	}
	flush := func() {
		if leader {
			total += scaled(count, size)
			allocated += scaled(acount, asize)
		}
		count, size, acount, asize, leader = 0, 0, 0, 0, false
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "#") {
			// (a frame: "#\t0x…\tpackage.function+0x…\tfile:line")
			if f := strings.Fields(line); len(f) > 2 {
				for _, p := range leaderPackages {
					leader = leader || strings.HasPrefix(f[2], p)
				}
			}
			continue
		}
		var c, sz, ac, as int64
		if n, _ := fmt.Sscanf(line, "%d: %d [%d: %d] @", &c, &sz, &ac, &as); n == 4 {
			flush()
			count, size, acount, asize = c, sz, ac, as
		}
	}
	flush()
	return uint64(total), uint64(allocated)
}

// simProfileTo starts a CPU profile to path when -sim.cpuprofile is set and there
// is something to profile; the function returned stops it.
func simProfileTo(b *testing.B, path string, any bool) func() {
	if *simProfile == "" || !any {
		return func() {}
	}
	pf, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(pf); err != nil {
		pf.Close()
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		pf.Close()
	}
}

// simBench measures one size.
func simBench(b *testing.B, n, events int) *simFigures {
	runtime.GC()
	rss0 := processRSS()
	var leaderLog slog.Handler
	if *simLeaderLog != "" {
		lf, err := os.OpenFile(*simLeaderLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		defer lf.Close()
		leaderLog = slog.NewTextHandler(lf, &slog.HandlerOptions{Level: slog.LevelInfo})
		fmt.Fprintf(lf, "# %d members\n", n)
	}
	sc := startSim(b, simConfig{Members: n, Step: *simBatch, Events: events, StoreLatency: *simLatency, Loopback: *simLoopback, OwnCores: *simOwnCores, LeaderLogs: leaderLog,
		Tune: func(_ int, c *Config) {
			if *simProd {
				productionTimers(c)
			}
			c.Memberlist.EnableCompression = *simCompress
			c.FiguresInterval = *simFiguresEvery
		}})
	f := &simFigures{members: n, events: sc.ranks[0].snap.events, snapBytes: len(sc.ranks[0].snap.data), formed: sc.Formed}
	if a := sc.ranks[0].snap.analyses[3]; a != nil {
		f.analysis = a.took
	}
	b.Logf("%d members formed a cluster in %v", n, sc.Formed.Round(time.Millisecond))
	progress := func(f string, a ...any) { fmt.Fprintf(os.Stderr, "# %d members: "+f+"\n", append([]any{n}, a...)...) } // (seen even if the run is cut short)
	// (while thousands of members form on shared cores, a successor may hear
	// nothing from its leader for a while: counted here, as the idle rows count
	// them once formed)
	progress("formed in %v; while forming, members held their leader silent %d times, and the newest term is %d", sc.Formed.Round(time.Millisecond), simSilences(sc), simTerm(sc))
	sc.wait(time.Minute, "every trainer to run", func() bool {
		for _, r := range sc.ranks {
			if r.Batch() < 2 {
				return false
			}
		}
		return true
	})
	f.settled, f.settleRate = simSettle(sc, *simSettleMax)
	progress("gossip settled after %v: %.0f packets/s", f.settled.Round(time.Second), f.settleRate)
	f.idleHeap = heapInuse()
	f.idleRSS = sub(processRSS(), rss0)
	c0, p0, t0 := processCPU(), sc.net.sent.Load(), time.Now()
	s0, term0 := simSilences(sc), simTerm(sc)
	time.Sleep(*simIdle) // the idle cluster's own load, measured over a fixed span
	f.idleCores = float64(processCPU()-c0) / float64(time.Since(t0))
	f.idlePackets = float64(sc.net.sent.Load()-p0) / time.Since(t0).Seconds()
	f.idleSilences, f.idleTerms = simSilences(sc)-s0, simTerm(sc)-term0
	progress("idle: %.2f cores, %.0f packets/s, %d silences, %d terms taken", f.idleCores, f.idlePackets, f.idleSilences, f.idleTerms)
	stop := simProfileTo(b, fmt.Sprintf("%s-%d.prof", *simProfile, n), *simRepeats > 0)
	for i := 0; i < *simRepeats; i++ {
		k0 := len(f.answered)
		simWindow(b, sc, f)
		if k := len(f.answered); k > k0 {
			progress("window %d: first answer %v after the trigger; heap grew %d MiB collecting, %d MiB merging", i+1, f.answered[k-1].Round(time.Millisecond),
				f.collectHeap[len(f.collectHeap)-1]>>20, f.mergeHeap[len(f.mergeHeap)-1]>>20)
		}
	}
	stop()
	// one more window, untimed, for the leader's live heap while it collects: a
	// forced collection of the whole simulation's heap then would slow the
	// leader's answer in a timed one
	if lh, ok := simLiveHeap(b, sc); ok {
		f.live = append(f.live, lh)
		r := float64(lh.reports)
		progress("the leader's live heap with %d of %d reports in, the last held back, before the merge: its own code's %.0f MiB, %.1f KiB a report; "+
			"the whole heap over the window's start %+.0f MiB, %.1f KiB a report, over the heap once published %+.0f MiB, %.1f KiB a report (measured %v after the trigger; "+
			"in the %v before it, the rest of the heap moved %+.0f MiB and leader code allocated %.0f MiB); then the last report and the merge: leader code allocated %.0f MiB, %.1f KiB a rank",
			lh.reports, lh.ranks, float64(lh.leader)/(1<<20), float64(lh.leader)/1024/r, float64(lh.overStart)/(1<<20), float64(lh.overStart)/1024/r,
			float64(lh.overEnd)/(1<<20), float64(lh.overEnd)/1024/r, lh.span.Round(10*time.Millisecond), lh.driftSpan.Round(10*time.Millisecond), float64(lh.drift)/(1<<20),
			float64(lh.idleAlloc)/(1<<20), float64(lh.merged)/(1<<20), float64(lh.merged)/1024/float64(lh.ranks))
	}
	stop = simProfileTo(b, fmt.Sprintf("%s-%d-failover.prof", *simProfile, n), *simFailovers > 0)
	for i := 0; i < *simFailovers; i++ {
		k0 := len(f.recoverAnswer)
		simFailover(b, sc, f)
		if k := len(f.recoverAnswer); k > k0 {
			progress("failover %d: answer %v after the leader died", i+1, f.recoverAnswer[k-1].Round(time.Millisecond))
		}
	}
	stop()
	f.dropped = sc.net.dropped()
	f.warnings = sc.log.Warnings()
	return f
}

// simSilences sums the times each member held its leader silent.
func simSilences(sc *simCluster) uint64 {
	var n uint64
	for _, c := range sc.coords {
		held, _ := c.Silences()
		n += held
	}
	return n
}

// simTerm is the newest leadership term any member has seen.
func simTerm(sc *simCluster) uint64 {
	var t uint64
	for _, c := range sc.coords {
		t = max(t, c.Term())
	}
	return t
}

// liveHeap is the leader's live heap while it collects (simLiveHeap): heap
// figures after forced collections, in bytes.
type liveHeap struct {
	ranks     int           // the window's ranks
	reports   int           // the ranks' reports the leader held then (all but one)
	leader    int64         // what leader code allocated, over the window's start
	overStart int64         // the whole live heap, over the window's start
	overEnd   int64         // the whole live heap, over the heap once the window is published
	span      time.Duration // from the trigger to the measurement's collection
	merged    int64         // what leader code allocated from then to the window's publication: the last report and the merge
	drift     int64         // the whole live heap's change before the window, over driftSpan
	idleAlloc int64         // what leader code allocated over driftSpan, before the window
	driftSpan time.Duration
}

// simLiveHeap asks for one window, untimed, and measures the leader's live heap
// while it collects: the last rank's upload is held back until every other
// rank's report is in and the heap is measured, so the leader then holds all
// reports but one and has not begun to merge. ok is false when the window was
// not published or answered before the measurement.
func simLiveHeap(b *testing.B, sc *simCluster) (lh liveHeap, ok bool) {
	// the heap profile samples an allocation every 32 KiB (or more often, if
	// asked) while the window lasts, not every 512 KiB: the leader's heap at 64
	// ranks is a few MiB, a handful of samples at the default. What was sampled
	// before at the default is then scaled too little, the same at each reading
	// (the differences hold); a heap profile written after the benchmark scales
	// this window's samples too much.
	if r := runtime.MemProfileRate; r > 32<<10 {
		defer func() { runtime.MemProfileRate = r }()
		runtime.MemProfileRate = 32 << 10
	}
	held := sc.ranks[len(sc.ranks)-1]
	gate, arrived := make(chan struct{}), make(chan struct{})
	held.setGate(gate, arrived)
	release := sync.OnceFunc(func() { held.setGate(nil, nil); close(gate) })
	defer release()
	// how far the rest of the heap, and what leader code allocates, move by
	// themselves, over about as long as the measurement takes (past a few
	// thousand members, with the forming's gossip still queued, the heap moves
	// by more than the leader holds)
	d0, td := heapLive(), time.Now()
	_, idle0 := leaderHeapAlloc()
	base := heapLive()
	leader0, idle1 := leaderHeapAlloc()
	lh.drift, lh.driftSpan, lh.idleAlloc = int64(base)-int64(d0), time.Since(td), int64(idle1)-int64(idle0)
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var res *pb.WindowResult
	var err error
	answered := make(chan struct{})
	go func() { defer close(answered); res, err = sc.client.Snapshot(ctx, 3, nil, nil) }()
	lh.ranks = len(sc.live())
	want := lh.ranks - 1
	early := func() (liveHeap, bool) {
		<-answered
		b.Logf("the live-heap window was answered with %d of %d reports in, before the last rank's upload: %v %v", lh.reports, want, err, res)
		return lh, false
	}
	// every other rank's report taken (the leader's "uploaded"), and the held
	// rank at its gate: it is in the plan, and the leader waits for it
	for in := false; !in; {
		ps := sc.log.Steps(func(s simStep) bool { return s.Msg == "window planned" && !s.At.Before(t0) })
		if len(ps) > 0 {
			lh.reports = len(sc.log.RankTimes(ps[len(ps)-1].Window, "uploaded"))
			select {
			case <-arrived:
				in = lh.reports >= want
			default:
			}
		}
		if !in {
			select {
			case <-answered:
				return early()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	// (the leader reads each report's sidecar and analysis once it has logged
	// it, 16 at a time: measured again until what its code holds stops growing)
	var at, inuse, alloc0 uint64
	for try := 0; try < 5; try++ {
		prev := inuse
		at = heapLive()
		inuse, alloc0 = leaderHeapAlloc()
		if try > 0 && inuse <= prev+prev/50 {
			break
		}
	}
	lh.leader, lh.span = int64(inuse)-int64(leader0), time.Since(t0)
	lh.overStart = int64(at) - int64(base)
	select {
	case <-answered:
		return early()
	default:
	}
	release()
	<-answered
	if err != nil {
		b.Fatal(err)
	}
	if res.State != pb.Outcome_OUTCOME_PUBLISHED {
		b.Logf("the live-heap window %s: %s", res.State, res.Error)
		return lh, false
	}
	lh.overEnd = int64(at) - int64(heapLive())
	_, alloc1 := leaderHeapAlloc()
	lh.merged = int64(alloc1) - int64(alloc0)
	sc.removeWindow(sc.manifest(res.Manifest), res.Manifest)
	return lh, true
}

// simWindow asks for one window as the snapshot command does and measures it.
func simWindow(b *testing.B, sc *simCluster, f *simFigures) {
	base := heapInuse()
	p0, s0, c0 := sc.net.sent.Load(), sc.net.conns.Load(), processCPU()
	hs := sampleHeap(20 * time.Millisecond)
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	res, err := sc.client.Snapshot(ctx, 3, nil, nil)
	cancel()
	tEnd := time.Now()
	hs.end()
	f.packets = append(f.packets, float64(sc.net.sent.Load()-p0))
	f.conns = append(f.conns, float64(sc.net.conns.Load()-s0))
	f.cpu = append(f.cpu, (processCPU() - c0).Seconds())
	if err != nil {
		b.Fatal(err)
	}
	if res.State != pb.Outcome_OUTCOME_PUBLISHED {
		f.failed = append(f.failed, fmt.Sprintf("a window %s after %v: %s", res.State, tEnd.Sub(t0).Round(time.Millisecond), res.Error))
		b.Logf("window %s after %v: %s", res.State, tEnd.Sub(t0).Round(time.Millisecond), res.Error)
		return
	}
	m := sc.manifest(res.Manifest)
	id := m.Window.ID
	live := sc.live()
	if len(m.RanksMerged) != len(live) {
		f.failed = append(f.failed, fmt.Sprintf("window %d: %d of %d ranks merged: %v", id, len(m.RanksMerged), len(live), firstReasons(res)))
	}
	plans := sc.log.Steps(func(s simStep) bool { return s.Msg == "window planned" && !s.At.Before(t0) && s.Window <= id })
	f.replans += max(len(plans)-1, 0)
	plan, ok := sc.log.First("window planned", id, t0)
	if !ok {
		b.Fatalf("window %d was never planned", id)
	}
	f.toPlan = append(f.toPlan, plan.At.Sub(t0))
	var last time.Duration
	for _, at := range sc.log.RankTimes(id, "acked") {
		f.acks = append(f.acks, at.Sub(t0))
		f.planAcks = append(f.planAcks, at.Sub(plan.At))
		last = max(last, at.Sub(t0))
	}
	f.allAcked = append(f.allAcked, last)
	var collected time.Time
	for _, at := range sc.log.RankTimes(id, "uploaded") {
		if at.After(collected) {
			collected = at
		}
	}
	pub, ok := sc.log.First("window published", id, t0)
	if !ok {
		pub.At = tEnd
	}
	f.published = append(f.published, tEnd.Sub(t0))
	var ended time.Time
	for _, r := range sc.ranks {
		r.mu.Lock()
		if at, ok := r.ended[id]; ok && (ended.IsZero() || at.Before(ended)) {
			ended = at
		}
		r.mu.Unlock()
	}
	if !ended.IsZero() && !collected.IsZero() {
		f.toEnd = append(f.toEnd, ended.Sub(t0))
		f.endUpload = append(f.endUpload, collected.Sub(ended))
	}
	if ans, ok := sc.log.First("window answered", id, t0); ok {
		f.answered = append(f.answered, ans.At.Sub(t0))
		f.answerMerge = append(f.answerMerge, ans.At.Sub(collected))
	}
	f.merge = append(f.merge, pub.At.Sub(collected))
	f.collectHeap = append(f.collectHeap, sub(hs.peak(t0, collected), base))
	f.mergeHeap = append(f.mergeHeap, sub(hs.peak(collected, tEnd), base))
	b.Logf("window %d: all %d acks %v after the trigger, published after %v; %.0f packets, %.0f streams, %.1f s of CPU",
		id, len(live), last.Round(time.Millisecond), tEnd.Sub(t0).Round(time.Millisecond), f.packets[len(f.packets)-1], f.conns[len(f.conns)-1], f.cpu[len(f.cpu)-1])
	sc.removeWindow(m, res.Manifest)
}

// simFailover asks for a window, kills the leader once every rank has acked it,
// and measures how the next leader finishes it.
func simFailover(b *testing.B, sc *simCluster, f *simFigures) {
	var leader int
	sc.wait(time.Minute, "one leader", func() bool { leader = sc.leader(); return leader >= 0 })
	live := len(sc.live())
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	type result struct {
		res *pb.WindowResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := sc.client.Snapshot(ctx, 3, nil, nil)
		done <- result{res, err}
	}()
	var id uint64
	sc.wait(2*time.Minute, "every rank to ack", func() bool {
		ps := sc.log.Steps(func(s simStep) bool { return s.Msg == "window planned" && !s.At.Before(t0) })
		if len(ps) == 0 {
			return false
		}
		id = ps[len(ps)-1].Window
		return len(sc.log.RankTimes(id, "acked")) >= live
	})
	tKill := time.Now()
	sc.kill(leader)
	r := <-done
	if r.err != nil {
		b.Fatal(r.err)
	}
	if r.res.State != pb.Outcome_OUTCOME_PUBLISHED {
		f.failed = append(f.failed, fmt.Sprintf("failover window %d %s: %s", id, r.res.State, r.res.Error))
		return
	}
	m := sc.manifest(r.res.Manifest)
	if m.Window.ID != id {
		b.Fatalf("failover: window %d published, %d interrupted", m.Window.ID, id)
	}
	lead, ok1 := sc.log.First("leading", 0, tKill)
	pub, ok2 := sc.log.First("window published", id, tKill)
	if !ok1 || !ok2 {
		b.Fatalf("failover of window %d: no new leader (%v) or no publication (%v)", id, ok1, ok2)
	}
	if len(m.RanksMerged) != live-1 {
		f.failed = append(f.failed, fmt.Sprintf("failover window %d: %d of %d ranks merged: %v", id, len(m.RanksMerged), live-1, firstReasons(r.res)))
	}
	f.detect = append(f.detect, lead.At.Sub(tKill))
	f.takeover = append(f.takeover, pub.At.Sub(lead.At))
	f.recover = append(f.recover, pub.At.Sub(tKill))
	ans, ok := sc.log.First("window answered", id, tKill)
	if !ok { // a window published in one step (no pending outputs) is answered by its publication
		ans = pub
	}
	f.recoverAnswer = append(f.recoverAnswer, ans.At.Sub(tKill))
	b.Logf("failover of window %d: rank %d led after %v, answered %v and published %v after the old leader died", id, lead.Member,
		lead.At.Sub(tKill).Round(time.Millisecond), ans.At.Sub(tKill).Round(time.Millisecond), pub.At.Sub(tKill).Round(time.Millisecond))
	sc.removeWindow(m, r.res.Manifest)
}

func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// firstReasons is a few of the missing ranks' reasons.
func firstReasons(res *pb.WindowResult) []string {
	var out []string
	for r, why := range res.Missing {
		out = append(out, fmt.Sprintf("%d: %s", r, why))
		if len(out) == 3 {
			break
		}
	}
	return out
}

// live returns the ranks not killed.
func (sc *simCluster) live() []int {
	var out []int
	for r, rk := range sc.ranks {
		if !rk.dead.Load() {
			out = append(out, r)
		}
	}
	return out
}

// removeWindow deletes a published window's inputs and outputs, so that repeated
// windows do not fill the disk.
func (sc *simCluster) removeWindow(m *publish.Manifest, manifest string) {
	for _, in := range m.Inputs {
		if rel, err := filepath.Rel(sc.dir, in.Source); err == nil && !strings.HasPrefix(rel, "..") {
			os.Remove(in.Source)
			os.Remove(sidecar.MetaName(in.Source))
			os.Remove(analysis.AnalysisName(in.Source))
		}
	}
	os.RemoveAll(filepath.Dir(manifest))
}

// printFigures writes the table of figures, one column per size, and each
// figure's growth from the first size to the last.
func printFigures(w *os.File, fs []*simFigures) {
	if len(fs) == 0 {
		return
	}
	type row struct {
		name string
		val  func(f *simFigures) float64
		fmt  func(v float64) string
	}
	msf := func(v float64) string { return fmt.Sprintf("%.0f ms", v) }
	mib := func(v float64) string { return fmt.Sprintf("%.0f MiB", v/(1<<20)) }
	kib := func(v float64) string { return fmt.Sprintf("%.1f KiB", v/1024) }
	perReport, perRank := func(l liveHeap) int { return l.reports }, func(l liveHeap) int { return l.ranks }
	q := func(ds func(*simFigures) []time.Duration, p float64) func(*simFigures) float64 {
		return func(f *simFigures) float64 {
			if len(ds(f)) == 0 {
				return math.NaN() // (no window measured it: "-")
			}
			return ms(quantile(ds(f), p))
		}
	}
	hq := func(hs func(*simFigures) []uint64, p float64) func(*simFigures) float64 {
		return func(f *simFigures) float64 {
			s := append([]uint64(nil), hs(f)...)
			sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
			if len(s) == 0 {
				return math.NaN()
			}
			return float64(s[min(int(p*float64(len(s))), len(s)-1)])
		}
	}
	acks := func(f *simFigures) []time.Duration { return f.acks }
	med := func(xs func(*simFigures) []float64) func(*simFigures) float64 {
		return func(f *simFigures) float64 {
			s := append([]float64(nil), xs(f)...)
			if len(s) == 0 {
				return math.NaN()
			}
			sort.Float64s(s)
			return s[len(s)/2]
		}
	}
	rows := []row{
		{"snapshot per rank (events)", func(f *simFigures) float64 { return float64(f.events) }, func(v float64) string { return fmt.Sprintf("%.0f", v) }},
		{"snapshot per rank (bytes)", func(f *simFigures) float64 { return float64(f.snapBytes) }, func(v float64) string { return fmt.Sprintf("%.0f KiB", v/1024) }},
		{"cluster formed in (sim set-up)", func(f *simFigures) float64 { return ms(f.formed) }, msf},
		{"a rank's analysis, on a core of its own", func(f *simFigures) float64 { return ms(f.analysis) }, msf},
		{"gossip of the forming settled after", func(f *simFigures) float64 { return float64(f.settled.Milliseconds()) }, msf},
		{"idle load of the whole simulation", func(f *simFigures) float64 { return f.idleCores }, func(v float64) string { return fmt.Sprintf("%.2f cores", v) }},
		{"idle packets a second, whole simulation", func(f *simFigures) float64 { return f.idlePackets }, func(v float64) string { return fmt.Sprintf("%.0f", v) }},
		{"idle heap of the whole simulation", func(f *simFigures) float64 { return float64(f.idleHeap) }, mib},
		{"one idle agent: CPU (whole / members)", func(f *simFigures) float64 { return 1000 * f.idleCores / float64(f.members) }, func(v float64) string { return fmt.Sprintf("%.2f ms/s", v) }},
		{"one idle agent: packets sent a second", func(f *simFigures) float64 { return f.idlePackets / float64(f.members) }, func(v float64) string { return fmt.Sprintf("%.2f", v) }},
		{"one idle agent: RSS (growth / members)", func(f *simFigures) float64 { return float64(f.idleRSS) / float64(f.members) }, func(v float64) string { return fmt.Sprintf("%.0f KiB", v/1024) }},
		{"idle: leaders held silent (all members)", func(f *simFigures) float64 { return float64(f.idleSilences) }, func(v float64) string { return fmt.Sprintf("%.0f", v) }},
		{"idle: terms taken while the leader lived", func(f *simFigures) float64 { return float64(f.idleTerms) }, func(v float64) string { return fmt.Sprintf("%.0f", v) }},
		{"trigger -> plan sent (median)", q(func(f *simFigures) []time.Duration { return f.toPlan }, 0.5), msf},
		{"trigger -> rank acked, p50", q(acks, 0.5), msf},
		{"trigger -> rank acked, p99", q(acks, 0.99), msf},
		{"plan -> rank acked, p99", q(func(f *simFigures) []time.Duration { return f.planAcks }, 0.99), msf},
		{"trigger -> all acked, median", q(func(f *simFigures) []time.Duration { return f.allAcked }, 0.5), msf},
		{"trigger -> all acked, worst", q(func(f *simFigures) []time.Duration { return f.allAcked }, 1), msf},
		{"re-plans (ranks past the start)", func(f *simFigures) float64 {
			if len(f.toPlan) == 0 {
				return math.NaN()
			}
			return float64(f.replans)
		}, func(v float64) string { return fmt.Sprintf("%.0f", v) }},
		{"trigger -> window's last batch done, median", q(func(f *simFigures) []time.Duration { return f.toEnd }, 0.5), msf},
		{"last batch done -> last upload, median", q(func(f *simFigures) []time.Duration { return f.endUpload }, 0.5), msf},
		{"trigger -> first answer, median", q(func(f *simFigures) []time.Duration { return f.answered }, 0.5), msf},
		{"trigger -> first answer, worst", q(func(f *simFigures) []time.Duration { return f.answered }, 1), msf},
		{"trigger -> published, median", q(func(f *simFigures) []time.Duration { return f.published }, 0.5), msf},
		{"trigger -> published, worst", q(func(f *simFigures) []time.Duration { return f.published }, 1), msf},
		{"last upload -> first answer, median", q(func(f *simFigures) []time.Duration { return f.answerMerge }, 0.5), msf},
		{"last upload -> published, median", q(func(f *simFigures) []time.Duration { return f.merge }, 0.5), msf},
		{"leader code's live heap, all reports but one", liveOf(func(l liveHeap) int64 { return l.leader }, nil), mib},
		{"leader code's live heap per report", liveOf(func(l liveHeap) int64 { return l.leader }, perReport), kib},
		{"whole live heap then, over the start, per report", liveOf(func(l liveHeap) int64 { return l.overStart }, perReport), kib},
		{"whole live heap then, over published, per report", liveOf(func(l liveHeap) int64 { return l.overEnd }, perReport), kib},
		{"leader code allocated merging, per rank", liveOf(func(l liveHeap) int64 { return l.merged }, perRank), kib},
		{"whole live heap's drift before the window", liveOf(func(l liveHeap) int64 { return l.drift }, nil), mib},
		{"leader code allocated idle, as long before", liveOf(func(l liveHeap) int64 { return l.idleAlloc }, nil), mib},
		{"heap growth collecting, worst", hq(func(f *simFigures) []uint64 { return f.collectHeap }, 1), mib},
		{"heap growth merging, worst", hq(func(f *simFigures) []uint64 { return f.mergeHeap }, 1), mib},
		{"leader dies -> new leader leads, median", q(func(f *simFigures) []time.Duration { return f.detect }, 0.5), msf},
		{"new leader leads -> published, median", q(func(f *simFigures) []time.Duration { return f.takeover }, 0.5), msf},
		{"leader dies -> answer published, median", q(func(f *simFigures) []time.Duration { return f.recoverAnswer }, 0.5), msf},
		{"leader dies -> answer published, worst", q(func(f *simFigures) []time.Duration { return f.recoverAnswer }, 1), msf},
		{"leader dies -> published, median", q(func(f *simFigures) []time.Duration { return f.recover }, 0.5), msf},
		{"leader dies -> published, worst", q(func(f *simFigures) []time.Duration { return f.recover }, 1), msf},
		{"packets sent per window, median", med(func(f *simFigures) []float64 { return f.packets }), func(v float64) string { return fmt.Sprintf("%.0f", v) }},
		{"streams opened per window, median", med(func(f *simFigures) []float64 { return f.conns }), func(v float64) string { return fmt.Sprintf("%.0f", v) }},
		{"CPU time per window, median", med(func(f *simFigures) []float64 { return f.cpu }), func(v float64) string { return fmt.Sprintf("%.1f s", v) }},
		{"packets dropped at full queues", func(f *simFigures) float64 { return float64(f.dropped) }, func(v float64) string { return fmt.Sprintf("%.0f", v) }},
	}
	if *simProd {
		fmt.Fprintln(w, "\ntimers: production's (DefaultConfig) at every size")
	}
	if *simLoopback {
		// memberlist's own transport: its packets and streams are not counted
		kept := rows[:0]
		for _, r := range rows {
			if !strings.Contains(r.name, "packets") && !strings.Contains(r.name, "streams") {
				kept = append(kept, r)
			}
		}
		rows = kept
		fmt.Fprintln(w, "\ntransport: memberlist's UDP and TCP over 127.0.0.1")
	}
	fmt.Fprintf(w, "\n%-42s", "members")
	for _, f := range fs {
		fmt.Fprintf(w, "%14d", f.members)
	}
	fmt.Fprintf(w, "%10s\n", "growth")
	for _, r := range rows {
		fmt.Fprintf(w, "%-42s", r.name)
		for _, f := range fs {
			if v := r.val(f); math.IsNaN(v) {
				fmt.Fprintf(w, "%14s", "-") // (not measured: no window, or no failover)
			} else {
				fmt.Fprintf(w, "%14s", r.fmt(v))
			}
		}
		if a, z := r.val(fs[0]), r.val(fs[len(fs)-1]); a > 0 && !math.IsNaN(z) && len(fs) > 1 {
			fmt.Fprintf(w, "%9.1fx", z/a)
		}
		fmt.Fprintln(w)
	}
	for _, f := range fs {
		for _, s := range f.failed {
			fmt.Fprintf(w, "%d members: %s\n", f.members, s)
		}
		var ws []string
		for k, v := range f.warnings {
			ws = append(ws, fmt.Sprintf("%6d  %s", v, k))
		}
		sort.Sort(sort.Reverse(sort.StringSlice(ws)))
		if len(ws) > 8 {
			ws = ws[:8]
		}
		if len(ws) > 0 {
			fmt.Fprintf(w, "%d members, warnings logged (count, message):\n  %s\n", f.members, strings.Join(ws, "\n  "))
		}
	}
	for _, f := range fs {
		if len(f.answered) > 0 {
			worst := quantile(f.answered, 1)
			fmt.Fprintf(w, "target: trigger -> first answer under 2 s at %d members: worst %v -> %s\n", f.members, worst.Round(time.Millisecond), verdict(worst < 2*time.Second))
		}
	}
	last := fs[len(fs)-1]
	if len(last.acks) > 0 {
		p99 := quantile(last.acks, 0.99)
		fmt.Fprintf(w, "target: every agent acks within 1 s of the trigger (p99) at %d members: %v -> %s\n", last.members, p99.Round(time.Millisecond), verdict(p99 <= time.Second))
		if *simProd {
			fmt.Fprintf(w, "target: acks p99 under 100 ms on production timers at %d members: %v -> %s\n", last.members, p99.Round(time.Millisecond), verdict(p99 < 100*time.Millisecond))
		}
	}
	if len(last.recover) > 0 {
		worst := quantile(last.recover, 1)
		take := quantile(last.takeover, 1)
		fmt.Fprintf(w, "target: a new leader finishes an interrupted window within 10 s at %d members: worst %v from the old leader's death (%s), %v from the new leader's start (%s); its answer %v after the death (%s)\n",
			last.members, worst.Round(time.Millisecond), verdict(worst <= 10*time.Second), take.Round(time.Millisecond), verdict(take <= 10*time.Second),
			quantile(last.recoverAnswer, 1).Round(time.Millisecond), verdict(quantile(last.recoverAnswer, 1) <= 10*time.Second))
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// simSettle waits, at most most, for the gossip of the cluster's forming to die
// down: each member passes on every arrival it hears about 4·log10(members)
// times, three members a gossip round, so the rounds carry something for a
// while after the last arrival (about 15 s at 256 members, at 15 packets a
// member a second, then some 2.6), and an idle load measured before is the
// forming's. Settled: two 5 s spans in a row under 60% of the busiest span's
// packets. It returns how long it waited and the last span's packets a
// second.
func simSettle(sc *simCluster, most time.Duration) (time.Duration, float64) {
	const span = 5 * time.Second
	t0 := time.Now()
	busiest, rate, quiet := 0.0, 0.0, 0
	for time.Since(t0) < most {
		p0, s0 := sc.net.sent.Load(), time.Now()
		time.Sleep(span)
		rate = float64(sc.net.sent.Load()-p0) / time.Since(s0).Seconds()
		busiest = max(busiest, rate)
		if quiet++; rate >= 0.6*busiest {
			quiet = 0
		}
		if quiet == 2 {
			break
		}
	}
	return time.Since(t0), rate
}

// liveOf is a figure of the last live-heap measurement, divided by per unless it
// is nil (NaN when there was none: printed as "-").
func liveOf(v func(liveHeap) int64, per func(liveHeap) int) func(*simFigures) float64 {
	return func(f *simFigures) float64 {
		if len(f.live) == 0 {
			return math.NaN()
		}
		l := f.live[len(f.live)-1]
		if per != nil {
			return float64(v(l)) / float64(max(per(l), 1))
		}
		return float64(v(l))
	}
}

// TestLeaderHeap: leaderHeapAlloc counts what leader code allocated and keeps,
// and nothing else.
func TestLeaderHeap(t *testing.T) {
	defer func(r int) { runtime.MemProfileRate = r }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1 // (every allocation sampled: the figures are exact)
	runtime.GC()
	inuse0, alloc0 := leaderHeapAlloc()
	const k = 64
	ls := make([]*leader.Leader, k)
	for i := range ls {
		ls[i] = leader.New(nil, &config.Config{}, slog.New(slog.DiscardHandler))
	}
	other := make([][]byte, k) // (not the leader's)
	for i := range other {
		other[i] = make([]byte, 1<<20)
	}
	runtime.GC()
	inuse1, alloc1 := leaderHeapAlloc()
	runtime.KeepAlive(ls)
	runtime.KeepAlive(other)
	// each leader holds a queue of 1<<14 envelopes (a pointer each); a
	// leader of an earlier test freed meanwhile takes from what is in use, never
	// from what was allocated
	want := int64(k) << 14 * int64(unsafe.Sizeof(uintptr(0)))
	if got := int64(alloc1) - int64(alloc0); got < want || got > want+want/2 {
		t.Errorf("%d leaders: leader code allocated %d bytes, want about %d", k, got, want)
	}
	if got := int64(inuse1) - int64(inuse0); got < want/2 || got > want+want/2 {
		t.Errorf("%d leaders: leader code's live heap grew %d bytes, want about %d", k, got, want)
	}
}

// TestLeaderHeapOf: a heap profile's records with a frame of the leader package,
// scaled as runtime/pprof scales them.
func TestLeaderHeapOf(t *testing.T) {
	text := "heap profile: 4: 11264 [7: 14336] @ heap/1024\n" +
		"1: 1024 [4: 4096] @ 0x1 0x2\n" +
		"#\t0x1\tgithub.com/memsnap/memsnap/merge.Preload+0x10\t/x/merge.go:1\n" +
		"#\t0x2\t" + leaderPackages[0] + "(*Leader).preload.func1+0x20\t/x/drive.go:2\n" +
		"\n" +
		"2: 2048 [2: 2048] @ 0x3\n" +
		"#\t0x3\tgithub.com/memsnap/memsnap/coordinator.(*Coordinator).Run+0x30\t/x/c.go:3\n" +
		"\n" +
		"1: 8192 [1: 8192] @ 0x4 0x5\n" +
		"#\t0x4\tgithub.com/memsnap/memsnap/merge/analysis.AnalyzeSnapshot+0x40\t/x/a.go:4\n" +
		"#\t0x5\tgithub.com/memsnap/memsnap/coordinator.(*simRank).upload+0x50\t/x/s.go:5\n" +
		"\n# runtime.MemStats\n# Alloc = 123\n"
	if inuse, alloc := leaderHeapOf(text, 1); inuse != 1024 || alloc != 4096 {
		t.Errorf("unsampled: %d bytes in use, %d allocated, want 1024 and 4096 (the one record with a leader frame; a rank's analysis is not the merge's)", inuse, alloc)
	}
	// sampled at 512 KiB, a 1 KiB object stands for 1/(1-e^(-1/512)) of itself
	if got, _ := leaderHeapOf(text, 512<<10); got != uint64(1024/(1-math.Exp(-1024.0/(512<<10)))) {
		t.Errorf("sampled: %d bytes in use, want %d", got, uint64(1024/(1-math.Exp(-1024.0/(512<<10)))))
	}
}
