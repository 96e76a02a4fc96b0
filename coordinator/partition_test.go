package coordinator

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/rankagent"
)

// partition decides which members can reach which: while cut, traffic between
// the two groups is dropped both ways.
type partition struct {
	mu    sync.Mutex
	group map[string]int // gossip address -> group
	cut   bool
}

func (p *partition) blocked(a, b string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	ga, oka := p.group[a]
	gb, okb := p.group[b]
	return p.cut && oka && okb && ga != gb
}

// cutTransport is memberlist's real network transport with the partition applied
// to everything sent and received. Its two forwarding goroutines end with
// Shutdown, which waits for them.
type cutTransport struct {
	*memberlist.NetTransport
	p       *partition
	self    string
	packets chan *memberlist.Packet
	streams chan net.Conn

	stopping  chan struct{} // closed first: what arrives now is dropped
	innerDone chan struct{} // closed once the inner transport stopped: the forwarders end
	wg        sync.WaitGroup
	once      sync.Once
}

var _ memberlist.NodeAwareTransport = (*cutTransport)(nil)

func newCutTransport(t *testing.T, p *partition, group int) *cutTransport {
	return newCutTransportAt(t, p, group, "127.0.0.1")
}

// newCutTransportAt is newCutTransport bound to ip (another loopback address
// is another host, as far as the members can tell).
func newCutTransportAt(t *testing.T, p *partition, group int, ip string) *cutTransport {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{ip}, BindPort: 0})
	if err != nil {
		t.Fatal(err)
	}
	ct := &cutTransport{NetTransport: nt, p: p, self: net.JoinHostPort(ip, strconv.Itoa(nt.GetAutoBindPort())),
		packets: make(chan *memberlist.Packet), streams: make(chan net.Conn),
		stopping: make(chan struct{}), innerDone: make(chan struct{})}
	p.mu.Lock()
	p.group[ct.self] = group
	p.mu.Unlock()
	// the inner transport's channels never close: the forwarders keep draining
	// them until it has stopped (its listeners may be blocked handing one on)
	ct.wg.Add(2)
	go func() {
		defer ct.wg.Done()
		for {
			select {
			case <-ct.innerDone:
				return
			case pk := <-nt.PacketCh():
				if p.blocked(pk.From.String(), ct.self) {
					continue
				}
				select {
				case ct.packets <- pk:
				case <-ct.stopping:
				}
			}
		}
	}()
	go func() {
		defer ct.wg.Done()
		for {
			select {
			case <-ct.innerDone:
				return
			case c := <-nt.StreamCh():
				if p.blocked(c.RemoteAddr().String(), ct.self) {
					c.Close()
					continue
				}
				select {
				case ct.streams <- c:
				case <-ct.stopping:
					c.Close()
				}
			}
		}
	}()
	t.Cleanup(func() { ct.Shutdown() }) // a transport memberlist never took
	return ct
}

// Shutdown stops the inner transport and then the forwarders, and waits for them.
func (c *cutTransport) Shutdown() error {
	var err error
	c.once.Do(func() {
		close(c.stopping)
		err = c.NetTransport.Shutdown()
		close(c.innerDone)
		c.wg.Wait()
	})
	return err
}

func (c *cutTransport) PacketCh() <-chan *memberlist.Packet { return c.packets }
func (c *cutTransport) StreamCh() <-chan net.Conn           { return c.streams }

func (c *cutTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if c.p.blocked(c.self, a.Addr) {
		return time.Now(), nil // lost on the way
	}
	return c.NetTransport.WriteToAddress(b, a)
}

func (c *cutTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return c.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (c *cutTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if c.p.blocked(c.self, a.Addr) {
		return nil, fmt.Errorf("partitioned from %s", a.Addr)
	}
	return c.NetTransport.DialAddressTimeout(a, timeout)
}

func (c *cutTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return c.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// TestPartition: with the cluster cut in two groups, each group elects its own
// leader and records a window under an id of its own (the run's log in the store
// hands each id out once), and neither leader finishes the other's window while
// it is recorded; both are published, each once. When the cut heals, the two
// parts find each other on their own: one cluster again under rank 0, recording
// all ranks.
func TestPartition(t *testing.T) {
	p := &partition{group: map[string]int{}}
	groupOf := func(rank int) int { return rank / 2 }
	tc := startCluster(t, 4, func(c *Config, a *rankagent.Config) {
		if !c.Client {
			c.Memberlist.Transport = newCutTransport(t, p, groupOf(c.Identity.Rank))
		}
	})
	tc.holding()
	clients := make([]*Coordinator, 2)
	for g := 0; g < 2; g++ {
		cfg := DefaultLocalConfig(rankagent.Identity{RunName: tc.run})
		cfg.Client, cfg.SecretKey, cfg.Logger = true, tc.key, testutil.Logger(t).With("client", g)
		cfg.Memberlist.Transport = newCutTransport(t, p, g)
		cfg.Join = []string{tc.ranks[2*g].Coord.Addr()}
		c, stop := runMember(t, cfg)
		t.Cleanup(stop)
		clients[g] = c
	}
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
	testutil.Eventually(t, 60*time.Second, "two groups with their own leaders", func() bool {
		for r, rk := range tc.ranks {
			l, ok := rk.Coord.Leader()
			if !ok || l != 2*groupOf(r) || len(rk.Coord.Members()) != 3 { // two ranks and the group's client
				return false
			}
		}
		for g, c := range clients {
			if l, ok := c.Leader(); !ok || l != 2*g {
				return false
			}
		}
		return true
	})
	results := make([]*pb.WindowResult, 2)
	var wg sync.WaitGroup
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := clients[g].Snapshot(testutil.Context(t, time.Minute), 2, nil, nil)
			if err != nil {
				t.Error(err)
			}
			results[g] = res
		}()
	}
	wg.Wait()
	published := 0
	for g, r := range results {
		if r == nil {
			t.Fatalf("group %d: no result", g)
		}
		if r.State == pb.Outcome_OUTCOME_PUBLISHED {
			published++
			if len(r.Ranks) != 2 || r.Ranks[0] != int32(2*g) {
				t.Fatalf("group %d published %+v", g, r)
			}
		}
	}
	manifests, _ := filepath.Glob(filepath.Join(tc.dir, tc.run, "torch_memory_traces", "window*", "merged.manifest.json"))
	manifests = publishedOnly(t, manifests)
	// each group's window has an id of its own (the run's log hands each out once):
	// both are published, neither over the other
	if published != 2 || len(manifests) != published {
		t.Fatalf("%d groups published, %d manifests: %+v", published, len(manifests), results)
	}
	for g, r := range results {
		if r.State != pb.Outcome_OUTCOME_PUBLISHED && r.Error == "" {
			t.Fatalf("group %d's window failed without saying why: %+v", g, r)
		}
		t.Logf("group %d: %s %s", g, r.State, r.Error)
	}
	// heal: the two parts find each other on their own (each keeps trying the
	// ranks it saw), one cluster under rank 0 again, and a window of every rank
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
	testutil.Eventually(t, 60*time.Second, "the cluster to heal", func() bool {
		for _, rk := range tc.ranks {
			if l, ok := rk.Coord.Leader(); !ok || l != 0 || len(rk.Coord.rankNodes()) != 4 { // every rank, not two ranks and clients
				return false
			}
		}
		return true
	})
	testutil.Eventually(t, 30*time.Second, "every trainer holding again", func() bool {
		for _, rk := range tc.ranks {
			if _, st, ok := rk.Agent.Current(); ok && st != rankagent.WindowUploaded {
				return false
			}
		}
		return true
	})
	res, err := clients[0].Snapshot(testutil.Context(t, time.Minute), 2, nil, nil)
	if err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != 4 {
		t.Fatalf("after healing: %+v %v", res, err)
	}
}

// TestForgedMessagesChangeNothing: forged plans, cancels, dumps and rank answers
// change nothing. From outside the cluster (no key, another key, another run)
// they are dropped before any member reads them, even one that names the leader
// as its sender. From a member that holds the key but does not lead (a client),
// they are read and refused: a plan, a cancel or a dump from a member that is not
// the leader, whatever term it claims; a rank's result or progress from a member
// whose name is not that rank's, also while a real window of that rank is being
// collected. No rank arms or dumps anything, no window id or term moves, and the
// next window gets the next id and is published with every rank.
func TestForgedMessagesChangeNothing(t *testing.T) {
	var gate atomic.Pointer[chan struct{}] // while set, rank 1's Arm waits until it is closed
	tc := startClusterWith(t, 2, func(r int, a *rankagent.Agent) Recorder {
		if r == 1 {
			return &gatedArm{Agent: a, gate: &gate}
		}
		return a
	})
	tc.holding()
	c := tc.client()
	lead := tc.ranks[0].Coord
	testutil.Eventually(t, 20*time.Second, "rank 0 to lead under a term every member knows", func() bool {
		term := lead.Term()
		return lead.IsLeader() && !lead.Busy() && term > 0 && tc.ranks[1].Coord.Term() == term
	})
	type state struct {
		term, seen, agentLast, postmortem uint64
	}
	stateOf := func(r int) state {
		rk := tc.ranks[r]
		agentLast := rk.Agent.LastWindow()
		pm := rk.Coord.rs.LastPostmortem()
		rk.Coord.mu.Lock()
		defer rk.Coord.mu.Unlock()
		return state{term: rk.Coord.term, seen: rk.Coord.lastWindow, agentLast: agentLast, postmortem: pm}
	}
	before := []state{stateOf(0), stateOf(1)}
	unchanged := func(when string) {
		t.Helper()
		for r := range tc.ranks {
			if w, st, ok := tc.ranks[r].Agent.Current(); ok {
				t.Fatalf("%s: rank %d has %v (%v) in progress", when, r, w, st)
			}
			if now := stateOf(r); now != before[r] {
				t.Fatalf("%s: rank %d's state moved from %+v to %+v", when, r, before[r], now)
			}
		}
		if !lead.IsLeader() || lead.Busy() {
			t.Fatalf("%s: rank 0 leads %v, busy %v", when, lead.IsLeader(), lead.Busy())
		}
		if l, ok := tc.ranks[1].Coord.Leader(); !ok || l != 0 {
			t.Fatalf("%s: rank 1 sees rank %d as leader (%v)", when, l, ok)
		}
		if held, _ := tc.ranks[1].Coord.Silences(); held != 0 {
			t.Fatalf("%s: rank 1 held the leader silent %d times", when, held)
		}
	}
	rank0, rank1 := NodeName(tc.run, 0), NodeName(tc.run, 1)
	const bigTerm = uint64(1) << 40 // newer than any term seen: only the sender check stands in the way
	bigID := before[0].seen + 1<<31 // far ahead, yet within what a leader may jump to

	// from outside: raw packets (a user message with no encryption, with and
	// without the run's label), and members of memberlist itself with another
	// key or of another run, naming the leader as the sender
	plan, _ := proto.Marshal(&pb.Envelope{SenderRank: 0, Sender: rank0, WindowId: bigID, Term: bigTerm,
		Body: &pb.Envelope_Plan{Plan: &pb.Plan{Start: 100000000, Stop: 100000003, Reason: "forged"}}})
	result, _ := proto.Marshal(&pb.Envelope{SenderRank: 1, Sender: rank1, WindowId: before[0].seen + 1,
		Body: &pb.Envelope_Result{Result: &pb.RankResult{Key: "x", Sha256: "y", Start: 1, Stop: 2}}})
	for _, rk := range tc.ranks {
		conn, err := net.Dial("udp", rk.Coord.Addr())
		if err != nil {
			t.Fatal(err)
		}
		for _, body := range [][]byte{plan, result} {
			msg := append([]byte{8}, body...) // memberlist's user message
			conn.Write(msg)
			labelled, _ := memberlist.AddLabelHeaderToPacket(msg, LabelFor(tc.run))
			conn.Write(labelled)
		}
		conn.Close()
	}
	for name, tune := range map[string]func(*memberlist.Config){
		"wrong key": func(c *memberlist.Config) { c.SecretKey = newKey(t); c.Label = LabelFor(tc.run) },
		"other run": func(c *memberlist.Config) { c.SecretKey = tc.key; c.Label = LabelFor(tc.run + "x") },
	} {
		mc := memberlist.DefaultLocalConfig()
		mc.Name, mc.BindAddr, mc.BindPort, mc.AdvertisePort = "forger-"+name, "127.0.0.1", 0, 0
		mc.LogOutput = testutil.LogWriter(t)
		tune(mc)
		m, err := memberlist.Create(mc)
		if err != nil {
			t.Fatal(err)
		}
		for _, rk := range tc.ranks {
			for _, body := range [][]byte{plan, result} {
				m.SendToAddress(memberlist.Address{Addr: rk.Coord.Addr()}, body)
			}
		}
		m.Shutdown()
	}
	// each member reads its datagrams in the order they came: once it answers one
	// sent after them, it has been through them
	barrier(t, c, rank0)
	barrier(t, c, rank1)
	unchanged("after the outsiders' messages")

	// from a member that holds the key: the client, as itself
	acks, ackSeq := c.expect(16, nil)
	defer c.forget(ackSeq)
	forge := func(to string, window, term uint64, senderRank int32, body any) {
		t.Helper()
		env := c.envelope(window)
		env.Term, env.SenderRank, env.Seq = term, senderRank, ackSeq
		switch b := body.(type) {
		case *pb.Plan:
			env.Body = &pb.Envelope_Plan{Plan: b}
		case *pb.Cancel:
			env.Body = &pb.Envelope_Cancel{Cancel: b}
		case *pb.Dump:
			env.Body = &pb.Envelope_Dump{Dump: b}
		case *pb.RankResult:
			env.Seq = 0 // as a rank sends them
			env.Body = &pb.Envelope_Result{Result: b}
		case *pb.Progress:
			env.Seq = 0
			env.Body = &pb.Envelope_Progress{Progress: b}
		case *pb.LeaderSilent:
			env.Seq = 0
			env.Body = &pb.Envelope_LeaderSilent{LeaderSilent: b}
		}
		if err := c.send(to, env, false); err != nil { // datagrams: they arrive in order, before the barrier
			t.Fatal(err)
		}
	}
	forgedPlan := &pb.Plan{Start: 100000000, Stop: 100000003, Reason: "forged", WorldSize: 2, Ranks: []int32{0, 1}}
	for _, to := range []string{rank0, rank1} {
		forge(to, bigID, bigTerm, -1, forgedPlan)
		forge(to, bigID, bigTerm, 0, forgedPlan) // claiming to be rank 0, under the client's own name
		forge(to, wire.MaxWindowID, bigTerm, -1, &pb.Cancel{Reason: "forged"})
		forge(to, bigID, bigTerm, -1, &pb.Cancel{Reason: "forged"})
		forge(to, bigID+1, bigTerm, -1, &pb.Dump{Reason: "forged", FailedRank: 1, Kind: pb.WindowKind_WINDOW_KIND_OOM})
	}
	forge(rank0, before[0].seen+1, bigTerm, 1, &pb.RankResult{Key: tc.run + "/torch_memory_traces/forged.pickle", Sha256: strings.Repeat("0", 64), Size: 1, Start: 1, Stop: 2})
	forge(rank0, before[0].seen+1, bigTerm, 1, &pb.Progress{Rank: 1, State: pb.Step_STEP_FAILED, Reason: "forged"})
	// the leader's successor's notice that the leader is silent, from a member
	// that is not the successor (nor a rank), also claiming rank 1
	forge(rank1, 0, bigTerm, -1, &pb.LeaderSilent{Leader: rank0})
	forge(rank1, 0, bigTerm, 1, &pb.LeaderSilent{Leader: rank0})
	// and one that names rank 1 as silent with its leader's host, to rank 1
	forge(rank1, 0, bigTerm, -1, &pb.LeaderSilent{Leader: rank0, Also: []string{rank1}})
	barrier(t, c, rank0)
	barrier(t, c, rank1)
	// every plan and dump was answered: refused, its sender is not the leader
	refused := map[string]int{}
	for range 6 {
		select {
		case a := <-acks:
			if ack := a.GetAck(); ack == nil || ack.Ok || ack.Code != pb.AckCode_ACK_NOT_LEADER {
				t.Fatalf("%s answered a forged command with %v", a.Sender, a.Body)
			}
			refused[a.Sender]++
		case <-time.After(20 * time.Second):
			t.Fatalf("answers to the forged plans and dumps: %v, want 3 from each rank", refused)
		}
	}
	if refused[rank0] != 3 || refused[rank1] != 3 {
		t.Fatalf("answers to the forged plans and dumps: %v, want 3 from each rank", refused)
	}
	unchanged("after the client's forged messages")

	// a real window: rank 1 holds its arming until the leader has been through a
	// forged result and progress of rank 1 for that window, and both ranks
	// through a forged cancel of it
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	gate.Store(&hold)
	planned := make(chan uint64, 4)
	var sawForged atomic.Bool
	type outcome struct {
		res *pb.WindowResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := c.Snapshot(testutil.Context(t, time.Minute), 3, func(u Update) {
			if u.Rank < 0 && u.State == pb.Step_STEP_PLANNED {
				select {
				case planned <- u.Window:
				default:
				}
			}
			if strings.Contains(u.Reason, "forged") {
				sawForged.Store(true)
			}
		}, nil)
		done <- outcome{res, err}
	}()
	var id uint64
	select {
	case id = <-planned:
	case o := <-done:
		t.Fatalf("the window ended before it was planned: %+v %v", o.res, o.err)
	}
	if want := before[0].seen + 1; id != want {
		t.Fatalf("the window was planned as %d, want the next id %d", id, want)
	}
	forge(rank0, id, bigTerm, 1, &pb.RankResult{Key: tc.run + "/torch_memory_traces/forged.pickle", Sha256: strings.Repeat("0", 64), Size: 1, Start: 1, Stop: 2})
	forge(rank0, id, bigTerm, 1, &pb.Progress{Rank: 1, State: pb.Step_STEP_FAILED, Reason: "forged"})
	forge(rank0, id, bigTerm, -1, &pb.Cancel{Reason: "forged"})
	forge(rank1, id, bigTerm, -1, &pb.Cancel{Reason: "forged"})
	barrier(t, c, rank0)
	release()
	gate.Store(nil)
	barrier(t, c, rank1)
	o := <-done
	if o.err != nil || o.res.State != pb.Outcome_OUTCOME_PUBLISHED || o.res.Window != id || fmt.Sprint(o.res.Ranks) != "[0 1]" || len(o.res.Missing) != 0 {
		t.Fatalf("the window after the forged messages: %+v %v", o.res, o.err)
	}
	for _, in := range readManifest(t, o.res.Manifest).Inputs {
		if strings.Contains(in.Source, "forged") {
			t.Fatalf("rank %d's input is the forged result: %s", in.Rank, in.Source)
		}
	}
	if sawForged.Load() {
		t.Fatal("the leader passed a forged progress on")
	}
	for r := range tc.ranks {
		if term := tc.ranks[r].Coord.Term(); term != before[r].term {
			t.Fatalf("rank %d's term moved from %d to %d", r, before[r].term, term)
		}
	}
}

// gatedArm is a rank's agent whose Arm waits, while gate is set, until it is closed.
type gatedArm struct {
	*rankagent.Agent
	gate *atomic.Pointer[chan struct{}]
}

func (g *gatedArm) Arm(w rankagent.Window) error {
	if ch := g.gate.Load(); ch != nil {
		<-*ch
	}
	return g.Agent.Arm(w)
}

// barrier asks member to for its status by datagram, as often as it takes, and
// returns once it answers: a member reads the datagrams from one sender in the
// order they came, so it has handled every one sent before.
func barrier(t *testing.T, c *Coordinator, to string) {
	t.Helper()
	ch, seq := c.expect(16, fromName(to))
	defer c.forget(seq)
	deadline := time.After(30 * time.Second)
	for {
		env := c.envelope(0)
		env.Seq = seq
		env.Body = &pb.Envelope_StatusRequest{StatusRequest: &pb.StatusRequest{}}
		if err := c.send(to, env, false); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ch:
			return
		case <-time.After(time.Second): // a datagram lost: ask again
		case <-deadline:
			t.Fatalf("%s never answered its status", to)
		}
	}
}
