package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/coordinator/cluster"
	"github.com/memsnap/memsnap/coordinator/view"
	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/wait"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
)

func init() {
	register(&command{
		name:    "snapshot",
		summary: "ask a running cluster for a window now; show every rank's progress; print where the merged outputs are",
		usage:   "--join HOST[:PORT] --run NAME (--key-file FILE | --key KEY | $MEMSNAP_KEY) [--batches N] [--wait | --wait-all] [--json]",
		exits:   "0 the window is published (or planned, without --wait); 1 it failed, is not finished, or could not be asked for (the last line says why); 2 a usage error",
		run:     runSnapshot,
	})
	register(&command{
		name:    "keygen",
		summary: "print a new gossip key (give the same one to every agent and to memsnap snapshot)",
		usage:   "",
		run:     runKeygen,
	})
}

// memberFlags are the flags of every member of a cluster.
type memberFlags struct {
	join, bind, advertise string
	iface                 string
	chose                 string // how the advertised address was chosen, for the log
	port                  int
	key, keyFile          string
	insecure              bool
}

func (f *memberFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.join, "join", "", "members to join, host[:port],... (default: $MEMSNAP_JOIN, torchrun's MASTER_ADDR, SLURM's first node, Open MPI's head node)")
	fs.StringVar(&f.bind, "bind", "", "the address gossip listens on (default 0.0.0.0, or 127.0.0.1 when every member to join is on loopback)")
	fs.StringVar(&f.advertise, "advertise", "", "the address other members reach this one at (default: --iface's, else the source address of the route to the first join target, else of the default route)")
	fs.StringVar(&f.iface, "iface", os.Getenv(cluster.IfaceEnv), "advertise this interface's address (a name, or a prefix as NCCL_SOCKET_IFNAME takes; default $"+cluster.IfaceEnv+")")
	fs.IntVar(&f.port, "gossip-port", -1, fmt.Sprintf("the base gossip port: local rank L listens on it + L, and a host to join without a port is tried at it + 0 ... + local world size - 1 (default %d; 0 picks a free port)", coordinator.DefaultGossipPort))
	fs.StringVar(&f.key, "key", "", "the gossip key, base64 (default: --key-file, or $"+coordinator.KeyEnv+"; make one with memsnap keygen)")
	fs.StringVar(&f.keyFile, "key-file", "", "a file holding the gossip key (mode 600, or 640: its group may read it)")
	fs.BoolVar(&f.insecure, "insecure", false, "run without a gossip key: no encryption, anyone who reaches the port can join")
}

// apply fills a coordinator configuration from the flags; localRank is this
// member's rank on its host (0 for a client).
func (f *memberFlags) apply(cfg *coordinator.Config, localRank, localWorld int) error {
	key, err := coordinator.LoadKey(f.key, f.keyFile, nil)
	if err != nil {
		return err
	}
	cfg.SecretKey, cfg.Insecure = key, f.insecure
	base := coordinator.DefaultGossipPort
	if f.port > 0 {
		base = f.port
	}
	if f.join != "" {
		if cfg.Join, err = coordinator.ParseJoin(f.join, base, localWorld); err != nil {
			return err
		}
	} else if cfg.Join, _, err = coordinator.JoinAddrs(nil, base, localWorld); err != nil {
		return err
	}
	if f.port == 0 {
		cfg.Memberlist.BindPort, cfg.Memberlist.AdvertisePort = 0, 0
	} else if f.port > 0 {
		cfg.Memberlist.BindPort = f.port + localRank
		cfg.Memberlist.AdvertisePort = cfg.Memberlist.BindPort
	}
	switch {
	case f.bind != "":
		cfg.Memberlist.BindAddr = f.bind
	case len(cfg.Join) > 0 && allLoopback(cfg.Join):
		cfg.Memberlist.BindAddr = "127.0.0.1"
	}
	switch {
	case f.advertise != "":
		cfg.Memberlist.AdvertiseAddr, f.chose = f.advertise, "--advertise"
	case f.iface == "" && cfg.Memberlist.BindAddr != "0.0.0.0" && cfg.Memberlist.BindAddr != "":
		cfg.Memberlist.AdvertiseAddr, f.chose = cfg.Memberlist.BindAddr, "the bind address"
	default:
		ip, how, settled, err := cluster.AdvertiseAddr(cfg.Join, f.iface)
		if err != nil {
			return err
		}
		if ip != "" {
			cfg.Memberlist.AdvertiseAddr, f.chose = ip, how
		} else {
			f.chose = "memberlist's choice (no join target to route to, no default route, no interface with a global address)"
		}
		if !settled {
			// chosen without a join target to go by: once one resolves, the route
			// to it says (a pod starts before its headless Service lists it)
			join := cfg.Join
			cfg.Readvertise = func() (string, string) {
				if ip, how, settled, _ := cluster.AdvertiseAddr(join, ""); settled {
					return ip, how
				}
				return "", ""
			}
		}
	}
	return nil
}

func allLoopback(addrs []string) bool {
	for _, a := range addrs {
		h, _, err := net.SplitHostPort(a)
		if err != nil {
			return false
		}
		if h == "localhost" {
			continue
		}
		ip := net.ParseIP(h)
		if ip == nil || !ip.IsLoopback() {
			return false
		}
	}
	return true
}

// leaderFlags are the flags of what a rank does when it leads.
type leaderFlags struct {
	skip, interval, every int64
	noSchedule            bool
	noPostmortem          bool
	mergedName            string
	collect               time.Duration
	headroom, growth      string
	cooldown              time.Duration
}

func (f *leaderFlags) register(fs *flag.FlagSet) {
	d := coordinator.DefaultConfig(rankagent.Identity{})
	fs.Int64Var(&f.skip, "skip-batches", d.Schedule.Skip, "the scheduled window starts at this batch (Composer's skip_batches)")
	fs.Int64Var(&f.interval, "interval", d.WindowBatches, "batches in a window (Composer's interval)")
	fs.Int64Var(&f.every, "every", 0, "record a window every N batches (0: once, as Composer does)")
	fs.BoolVar(&f.noSchedule, "no-schedule", false, "record only on demand (memsnap snapshot) and on OOM")
	fs.BoolVar(&f.noPostmortem, "no-postmortem", false, "when a rank hits an OOM, do not ask every rank for a snapshot")
	fs.StringVar(&f.mergedName, "merged-name", d.MergedName, "name template of a window's merged outputs (run_name, window, batch, world_size)")
	fs.DurationVar(&f.collect, "collect-timeout", d.CollectTimeout, "a rank silent this long after its window should have ended is merged as missing")
	fs.StringVar(&f.headroom, "trigger-headroom", "", "take a window of every rank as soon as a rank's headroom falls below this: a share of its device (5%) or a size (2GiB)")
	fs.StringVar(&f.growth, "trigger-growth", "", "take a window of every rank as soon as a rank's memory grows this much over N batches: SIZE[/N] (256MiB/10; N is 10 unless given)")
	fs.DurationVar(&f.cooldown, "trigger-cooldown", 10*time.Minute, "the least time between two trigger windows")
}

func (f *leaderFlags) apply(cfg *coordinator.Config) error {
	cfg.Schedule = coordinator.Schedule{Enabled: !f.noSchedule, Skip: f.skip, Every: f.every}
	cfg.OnOOM = !f.noPostmortem
	cfg.WindowBatches, cfg.MergedName, cfg.CollectTimeout = f.interval, f.mergedName, f.collect
	t, err := parseTriggers(f.headroom, f.growth, f.cooldown)
	if err != nil {
		return err
	}
	cfg.Triggers = t
	return nil
}

// parseTriggers reads --trigger-headroom (5% or 2GiB), --trigger-growth
// (SIZE[/N]) and --trigger-cooldown.
func parseTriggers(headroom, growth string, cooldown time.Duration) (view.Triggers, error) {
	t := view.Triggers{Cooldown: cooldown, GrowthBatches: 10}
	if cooldown < 10*time.Second {
		return t, fmt.Errorf("--trigger-cooldown %v: at least 10s (each trigger window stalls every rank for its batches)", cooldown)
	}
	if h := strings.TrimSpace(headroom); h != "" {
		if p, ok := strings.CutSuffix(h, "%"); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
			if err != nil || !(v > 0 && v < 100) {
				return t, fmt.Errorf("--trigger-headroom %q: a share above 0%% and below 100%%, or a size (2GiB)", headroom)
			}
			t.HeadroomRatio = v / 100
		} else {
			if _, err := strconv.ParseFloat(h, 64); err == nil {
				return t, fmt.Errorf("--trigger-headroom %q: a share needs its %% (5%%), a size its unit (2GiB)", headroom)
			}
			n, err := parseBytes(h)
			if err != nil || n == 0 {
				return t, fmt.Errorf("--trigger-headroom %q: a share (5%%) or a size above 0 (2GiB)", headroom)
			}
			t.HeadroomBytes = n
		}
	}
	if g := strings.TrimSpace(growth); g != "" {
		size, over, hasOver := strings.Cut(g, "/")
		n, err := parseBytes(size)
		if err != nil || n == 0 {
			return t, fmt.Errorf("--trigger-growth %q: SIZE[/N], a size above 0 over N batches (256MiB/10)", growth)
		}
		t.GrowthBytes = n
		if hasOver {
			b, err := strconv.ParseInt(strings.TrimSpace(over), 10, 64)
			if err != nil || b < 1 || b > 1<<20 {
				return t, fmt.Errorf("--trigger-growth %q: N is a number of batches from 1 to 1048576", growth)
			}
			t.GrowthBatches = b
		}
	}
	return t, nil
}

func runKeygen(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["keygen"], stderr)
	if _, err := parse(fs, args); err != nil {
		return err
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return err
	}
	fmt.Fprintln(stdout, base64.StdEncoding.EncodeToString(k))
	return nil
}

func runSnapshot(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	jout := &jsonOut{w: stdout}
	err := snapshotCmd(ctx, args, jout, stderr, &asJSON)
	if err != nil && asJSON && !jout.wrote && !errors.Is(err, errUsage) && !errors.Is(err, flag.ErrHelp) {
		// with --json, every failure is one JSON object on stdout too
		var ee exitError
		if !errors.As(err, &ee) {
			json.NewEncoder(stdout).Encode(struct {
				State string `json:"state"`
				Error string `json:"error"`
			}{"error", err.Error()})
		}
	}
	return err
}

// jsonOut is stdout, noting whether a JSON result was written to it.
type jsonOut struct {
	w     io.Writer
	wrote bool
}

func (j *jsonOut) Write(p []byte) (int, error) {
	j.wrote = true
	return j.w.Write(p)
}

func snapshotCmd(ctx context.Context, args []string, stdout io.Writer, stderr io.Writer, jsonFlag *bool) error {
	fs := newFlags(commands["snapshot"], stderr)
	var cf clientFlags
	cf.register(fs)
	batches := fs.Int64("batches", 0, "batches in the window (default: the leader's --interval)")
	waitAnswer := fs.Bool("wait", false, "wait until the window's answer is published: the summary, the report and the findings (default: return once it is planned)")
	waitAll := fs.Bool("wait-all", false, "wait until the merged pickles and the timeline are published too")
	asJSON := fs.Bool("json", false, "print the result as one JSON object (a failure too)")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up after this long (the leader's own bound on the window is printed when it is planned)")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	*jsonFlag = *asJSON
	name, err := clientRunName(cf.run)
	if err != nil {
		return err
	}
	if *waitAll {
		*waitAnswer = true
	}
	if *timeout <= 0 || cf.joinTimeout <= 0 {
		return fmt.Errorf("--timeout %v, --join-timeout %v: both must be more than zero", *timeout, cf.joinTimeout)
	}
	if *batches < 0 || *batches > coordinator.MaxWindowBatches {
		return fmt.Errorf("--batches %d: a window is 1 to %d batches (0: the leader's --interval)", *batches, coordinator.MaxWindowBatches)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	c, leave, err := joinCluster(ctx, name, &cf.mf, cf.joinTimeout, *timeout, "--timeout", cf.verbose, stderr)
	if err != nil {
		return err
	}
	defer leave()
	p := newProgressPrinter(stderr, *asJSON)
	planned := make(chan struct{})
	var once, answerOnce sync.Once
	var answered *pb.WindowResult // --wait-all: the answer, printed as it came
	res, err := c.Request(ctx, *batches, coordinator.RequestOptions{Progress: func(u coordinator.Update) {
		p.update(u)
		if u.State == pb.Step_STEP_PLANNED && !*waitAnswer {
			once.Do(func() { close(planned) })
		}
		if u.Answer != nil && !*asJSON {
			// --wait-all: the answer now (once), the rest once published
			answerOnce.Do(func() {
				p.mu.Lock()
				printAnswer(stdout, u.Answer, u.Window, true)
				answered = u.Answer
				p.mu.Unlock()
			})
		}
	}, Detach: planned, AnswerFirst: !*waitAll})
	if err != nil && !errors.Is(err, coordinator.ErrDetached) {
		return requestFailed(err, p, *timeout)
	}
	if res == nil { // planned, not waited for
		fmt.Fprintf(stdout, "window %d planned: %s (memsnap ls shows it once published)\n", p.window, p.batches)
		return nil
	}
	answer := func() *pb.WindowResult { // the answer printed as it came (nil: none)
		p.mu.Lock()
		defer p.mu.Unlock()
		return answered
	}
	return printResult(stdout, p, res, answer, *asJSON, *waitAll)
}

// requestFailed says why a window's request failed and what it left behind:
// the cluster goes on with a window it planned, so it says which, and where its
// outcome will be.
func requestFailed(err error, p *progressPrinter, timeout time.Duration) error {
	p.mu.Lock()
	left := "the request may still be planned by the leader (memsnap ls shows the run's windows)"
	if p.window != 0 {
		left = fmt.Sprintf("window %d goes on in the cluster (memsnap ls shows how it ends)", p.window)
	}
	p.mu.Unlock()
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("gave up after --timeout %v: %w; %s", timeout, err, left)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("interrupted; %s", left)
	}
	return err
}

// printResult prints the result of a window waited for (as JSON with asJSON)
// and says how the command ends: with an error for a window that failed, and
// exit status 1 when waitAll found its pickles not published. answer is the
// answer the progress already printed (nil: none).
func printResult(stdout io.Writer, p *progressPrinter, res *pb.WindowResult, answer func() *pb.WindowResult, asJSON, waitAll bool) error {
	p.done()
	if res.Window != 0 {
		p.window = res.Window
	}
	// --wait-all asked for the pickles too: a window whose answer alone was
	// published (the rest could not be written) did not give them
	incomplete := waitAll && res.State == pb.Outcome_OUTCOME_PUBLISHED && res.Pending
	if asJSON {
		if err := json.NewEncoder(stdout).Encode(resultJSON(res, p.window)); err != nil {
			return err
		}
		if res.State != pb.Outcome_OUTCOME_PUBLISHED || incomplete {
			return exitError{1}
		}
		return nil
	}
	if res.State != pb.Outcome_OUTCOME_PUBLISHED {
		for _, r := range sortedMissing(res.Missing) {
			fmt.Fprintf(stdout, "  rank %d missing: %s\n", r, res.Missing[int32(r)])
		}
		switch {
		case p.window == 0:
			return fmt.Errorf("the window failed before it was planned: %s", res.Error)
		case res.State == pb.Outcome_OUTCOME_UNFINISHED || res.State == pb.Outcome_OUTCOME_UNKNOWN:
			// not failed: the leader finishes it once it can
			return fmt.Errorf("window %d is not finished: %s (memsnap ls shows how it ends)", p.window, res.Error)
		}
		return fmt.Errorf("window %d failed: %s", p.window, res.Error)
	}
	first := answer()
	if first != nil {
		printRest(stdout, res, first, p.window) // the answer is printed already
	} else {
		printAnswer(stdout, res, p.window, false)
	}
	if incomplete {
		return exitError{1}
	}
	return nil
}

// printRest prints what a published window adds to its answer, printed before:
// that all of it is published, and the outputs the answer did not name.
func printRest(w io.Writer, res, answer *pb.WindowResult, window uint64) {
	if res.Pending {
		fmt.Fprintf(w, "window %d: the merged pickles and the timeline were not written: %s\n", window, printableN(res.Error, 4096))
		return
	}
	fmt.Fprintf(w, "window %d published: the merged pickles and the timeline too\n", window)
	if res.Manifest != answer.Manifest {
		fmt.Fprintf(w, "manifest: %s\n", res.Manifest)
	}
	for _, o := range res.Outputs {
		if !slices.Contains(answer.Outputs, o) {
			fmt.Fprintf(w, "  %s\n", o)
		}
	}
}

// kindLabel is a window's kind, as the run's log names it ("trigger"), as people
// read it ("trigger window"); a kind it does not know as it is.
func kindLabel(kind string) string {
	switch kind {
	case runlog.KindWindow:
		return "window"
	case runlog.KindTrigger:
		return "trigger window"
	case runlog.KindOOM:
		return "OOM post-mortem"
	case runlog.KindCrash:
		return "crash post-mortem"
	}
	return kind
}

// printAnswer prints a published window's result: what it is, the findings,
// the manifest and the outputs, and, when its merged pickles and timeline are
// still being written (res.Pending), that they are coming (unless the command
// waits for them: waiting).
func printAnswer(w io.Writer, res *pb.WindowResult, window uint64, waiting bool) {
	what := kindLabel(runlog.KindWindow)
	if res.Kind != pb.WindowKind_WINDOW_KIND_UNSPECIFIED {
		what = kindLabel(pb.Name(res.Kind)) // the run's log's name of the kind
	}
	verb := "published"
	if res.Pending {
		verb = "answered"
	}
	fmt.Fprintf(w, "%s %d (batches %d-%d) %s: %d ranks merged", what, window, res.Start, res.Stop-1, verb, len(res.Ranks))
	if len(res.Missing) > 0 {
		fmt.Fprintf(w, ", %d missing", len(res.Missing))
	}
	fmt.Fprintln(w)
	for _, r := range sortedMissing(res.Missing) {
		fmt.Fprintf(w, "  rank %d missing: %s\n", r, res.Missing[int32(r)])
	}
	for _, f := range res.Findings {
		fmt.Fprintln(w, printableN(f, 4096)) // from the store's manifest
	}
	fmt.Fprintf(w, "manifest: %s\n", res.Manifest)
	for _, o := range res.Outputs {
		fmt.Fprintf(w, "  %s\n", o)
	}
	switch {
	case res.Pending && res.Error != "":
		fmt.Fprintf(w, "%s\n", printableN(res.Error, 4096))
	case res.Pending && !waiting:
		fmt.Fprintln(w, "the merged pickles and the timeline are being written: the manifest names them once published (memsnap ls; --wait-all waits for them)")
	}
}

func sortedMissing(m map[int32]string) []int {
	out := make([]int, 0, len(m))
	for r := range m {
		out = append(out, int(r))
	}
	sort.Ints(out)
	return out
}

func outcomeName(o pb.Outcome) string { return pb.Name(o) }

func resultJSON(r *pb.WindowResult, window uint64) any {
	missing := map[string]string{}
	for k, v := range r.Missing {
		missing[fmt.Sprint(k)] = v
	}
	ranks := r.Ranks
	if ranks == nil {
		ranks = []int32{}
	}
	return struct {
		Window   uint64            `json:"window"`
		State    string            `json:"state"`
		Start    int64             `json:"start"`
		Stop     int64             `json:"stop"`
		Manifest string            `json:"manifest,omitempty"`
		Outputs  []string          `json:"outputs"`
		Ranks    []int32           `json:"ranks"`
		Missing  map[string]string `json:"missing"`
		Error    string            `json:"error,omitempty"`
		Findings []string          `json:"findings,omitempty"`
		// Pending: the answer is published; the merged pickles and the timeline are being written
		Pending bool `json:"pending,omitempty"`
	}{window, outcomeName(r.State), r.Start, r.Stop, r.Manifest, r.Outputs, ranks, missing, r.Error, r.Findings, r.Pending}
}

// progressPrinter shows a window's progress: a line per rank and step for small
// jobs, a count per step (at most once a second) for large ones.
type progressPrinter struct {
	w       io.Writer
	quiet   bool
	mu      sync.Mutex
	window  uint64
	batches string
	// span is the window's batches [start, stop) as the leader planned them
	// (zero until it says)
	span   [2]int64
	states map[int]pb.Step
	last   time.Time
}

func newProgressPrinter(w io.Writer, quiet bool) *progressPrinter {
	return &progressPrinter{w: w, quiet: quiet, states: map[int]pb.Step{}}
}

func (p *progressPrinter) update(u coordinator.Update) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if u.Window != 0 {
		p.window = u.Window
	}
	if u.Rank < 0 {
		if u.State == pb.Step_STEP_PLANNED {
			p.batches = u.Reason
			p.span = plannedSpan(u.Reason)
		}
		if !p.quiet {
			line := fmt.Sprintf("window %d %s %s", p.window, coordinator.StepName(u.State), u.Reason)
			switch {
			case u.State == pb.Step_STEP_UNSPECIFIED && p.window == 0:
				line = u.Reason // about the request, before it has a window
			case u.State == pb.Step_STEP_UNSPECIFIED:
				line = fmt.Sprintf("window %d: %s", p.window, u.Reason)
			}
			if !u.Deadline.IsZero() {
				line += fmt.Sprintf("; the leader gives up on it at %s (in %v)", u.Deadline.Format("15:04:05"), time.Until(u.Deadline).Round(time.Second))
			}
			fmt.Fprintln(p.w, line)
		}
		return
	}
	// progress travels as datagrams: show a rank's steps only forwards, once each
	if window.StepOrder(u.State) <= window.StepOrder(p.states[u.Rank]) && window.StepOrder(u.State) < window.EndOrder {
		return
	}
	p.states[u.Rank] = u.State
	if p.quiet || u.State == pb.Step_STEP_QUEUED || u.State == pb.Step_STEP_SENT {
		return
	}
	if len(p.states) <= 16 {
		fmt.Fprintln(p.w, rankProgressLine(u, p.span))
		return
	}
	if time.Since(p.last) >= time.Second {
		p.summary()
	}
}

// plannedSpan reads the window's batches [start, stop) from the leader's planned
// step ("batches [12, 15) on 4 of 4 ranks"); zero when it names none.
func plannedSpan(reason string) [2]int64 {
	var start, stop int64
	if n, _ := fmt.Sscanf(reason, "batches [%d, %d)", &start, &stop); n != 2 || start < 0 || stop <= start {
		return [2]int64{}
	}
	return [2]int64{start, stop}
}

// rankProgressLine is a rank's step as a line: before it records, the batch the
// rank is at and the window it will record; from recording on, the window's
// batches (the same on every rank, whichever batch each was at when it said so);
// else, and when the window's batches are not known, the batch the rank was at.
func rankProgressLine(u coordinator.Update, span [2]int64) string {
	line := fmt.Sprintf("  rank %-3d %-10s", u.Rank, coordinator.StepName(u.State))
	known := span[1] > span[0]
	batches := fmt.Sprintf("batches %d-%d", span[0], span[1]-1)
	if span[1]-span[0] == 1 {
		batches = fmt.Sprintf("batch %d", span[0])
	}
	var what []string
	switch {
	case known && (u.State == pb.Step_STEP_RECORDING || u.State == pb.Step_STEP_SPOOLED || u.State == pb.Step_STEP_UPLOADED):
		what = append(what, batches)
	case known && (u.State == pb.Step_STEP_ACKED || u.State == pb.Step_STEP_ARMED):
		if u.Batch >= 0 {
			what = append(what, fmt.Sprintf("at batch %d", u.Batch))
		}
		what = append(what, "records "+batches)
	case u.Batch >= 0:
		what = append(what, fmt.Sprintf("at batch %d", u.Batch))
	}
	if len(what) > 0 {
		line += " " + strings.Join(what, "; ")
	}
	if u.Reason != "" {
		line += "  " + u.Reason
	}
	return strings.TrimRight(line, " ")
}

func (p *progressPrinter) summary() {
	counts := map[string]int{}
	for _, s := range p.states {
		counts[coordinator.StepName(s)]++
	}
	names := make([]string, 0, len(counts))
	for s := range counts {
		names = append(names, s)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, s := range names {
		parts = append(parts, fmt.Sprintf("%s %d", s, counts[s]))
	}
	fmt.Fprintf(p.w, "window %d: %s\n", p.window, strings.Join(parts, ", "))
	p.last = time.Now()
}

func (p *progressPrinter) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.quiet && len(p.states) > 16 {
		p.summary()
	}
}

// clientFlags are the flags of a command that joins a run's cluster as a
// client (snapshot, top).
type clientFlags struct {
	mf          memberFlags
	run         string
	joinTimeout time.Duration
	verbose     bool
}

func (f *clientFlags) register(fs *flag.FlagSet) {
	f.mf.register(fs)
	fs.StringVar(&f.mf.join, "agent", "", "an agent's gossip address (same as --join)")
	fs.StringVar(&f.run, "run", "", "the run's name (default: $MEMSNAP_RUN_NAME or the launcher's job id)")
	fs.DurationVar(&f.joinTimeout, "join-timeout", 15*time.Second, "give up joining the cluster after this long, saying why")
	fs.BoolVar(&f.verbose, "v", false, "log gossip")
}

// joinCluster joins run name's cluster as a client (a member that is not a
// rank), through the agents mf names, and waits until it knows a leader, or
// says why not, within timeout (set by timeoutFlag). leave ends
// the membership and waits for it.
func joinCluster(ctx context.Context, name string, mf *memberFlags, joinTimeout, timeout time.Duration, timeoutFlag string, verbose bool, stderr io.Writer) (*coordinator.Coordinator, func(), error) {
	level := slog.LevelError
	if verbose {
		level = slog.LevelDebug
	}
	cfg := coordinator.DefaultConfig(rankagent.Identity{RunName: name})
	cfg.Client = true
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg.Memberlist.BindPort, cfg.Memberlist.AdvertisePort = 0, 0
	cfg.JoinTimeout = joinTimeout
	if err := mf.apply(&cfg, 0, 1); err != nil {
		return nil, nil, err
	}
	cfg.Memberlist.BindPort, cfg.Memberlist.AdvertisePort = 0, 0 // a client takes any free port
	if len(cfg.Join) == 0 {
		return nil, nil, errors.New("no agent to ask: pass --join host[:port] (an agent's gossip address)")
	}
	c, err := coordinator.New(cfg, nil)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(ctx) }()
	leave := func() {
		cancel()
		<-runDone
	}
	// joined and a leader known, or why not (Run returns the join's diagnosis)
	leader := make(chan struct{})
	go func() {
		wait.Until(ctx, timeout, func() bool { _, ok := c.Leader(); return ok })
		close(leader)
	}()
	select {
	case runErr := <-runDone:
		cancel()
		if runErr == nil {
			runErr = ctx.Err()
		}
		return nil, nil, fmt.Errorf("joining the cluster of run %q: %w", name, runErr)
	case <-leader:
		if _, ok := c.Leader(); !ok {
			leave()
			if err := ctx.Err(); err == nil || errors.Is(err, context.DeadlineExceeded) {
				return nil, nil, fmt.Errorf("gave up after %s %v: joined through %v, and no rank of run %q became a member", timeoutFlag, timeout, cfg.Join, name)
			}
			return nil, nil, fmt.Errorf("joined through %v, but no rank of run %q is a member: %w", cfg.Join, name, ctx.Err())
		}
	}
	return c, leave, nil
}
