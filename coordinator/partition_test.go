package coordinator

import (
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

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
// to everything sent and received.
type cutTransport struct {
	*memberlist.NetTransport
	p       *partition
	self    string
	packets chan *memberlist.Packet
	streams chan net.Conn
}

var _ memberlist.NodeAwareTransport = (*cutTransport)(nil)

func newCutTransport(t *testing.T, p *partition, group int) *cutTransport {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, BindPort: 0})
	if err != nil {
		t.Fatal(err)
	}
	ct := &cutTransport{NetTransport: nt, p: p, self: fmt.Sprintf("127.0.0.1:%d", nt.GetAutoBindPort()),
		packets: make(chan *memberlist.Packet), streams: make(chan net.Conn)}
	p.mu.Lock()
	p.group[ct.self] = group
	p.mu.Unlock()
	go func() {
		for pk := range nt.PacketCh() {
			if !p.blocked(pk.From.String(), ct.self) {
				ct.packets <- pk
			}
		}
	}()
	go func() {
		for c := range nt.StreamCh() {
			if p.blocked(c.RemoteAddr().String(), ct.self) {
				c.Close()
				continue
			}
			ct.streams <- c
		}
	}()
	return ct
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
// leader and records a window, but only one set of merged outputs is published
// under the window's name: the other leader's merge is refused, changing nothing.
// When the cut heals, the cluster is one again under rank 0 and records all ranks.
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
	if published < 1 || len(manifests) != published {
		t.Fatalf("%d groups published, %d manifests: %+v", published, len(manifests), results)
	}
	for g, r := range results {
		if r.State != pb.Outcome_OUTCOME_PUBLISHED && r.Error == "" {
			t.Fatalf("group %d's window failed without saying why: %+v", g, r)
		}
		t.Logf("group %d: %s %s", g, r.State, r.Error)
	}
	// heal: one cluster under rank 0 again, and a window of every rank
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
	for _, rk := range tc.ranks {
		rk.Coord.ml.Join([]string{tc.ranks[0].Coord.Addr()})
	}
	testutil.Eventually(t, 60*time.Second, "the cluster to heal", func() bool {
		for _, rk := range tc.ranks {
			if l, ok := rk.Coord.Leader(); !ok || l != 0 || len(rk.Coord.Members()) < 4 {
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

// TestForgedMessagesChangeNothing: plans, acks and results sent straight to a
// member's gossip port by someone without the key, or of another run, are
// dropped: no window is armed, no leader state changes.
func TestForgedMessagesChangeNothing(t *testing.T) {
	tc := startCluster(t, 2)
	target := tc.ranks[1].Coord.Addr()
	env := &pb.Envelope{SenderRank: 0, WindowId: 7, Sender: NodeName(tc.run, 0),
		Body: &pb.Envelope_Plan{Plan: &pb.Plan{Start: 100, Stop: 103, Reason: "forged"}}}
	plan, _ := proto.Marshal(env)
	env.Body = &pb.Envelope_Result{Result: &pb.RankResult{Key: "x", Sha256: "y", Start: 1, Stop: 2}}
	result, _ := proto.Marshal(env)
	// raw packets: a user message with no encryption, with and without the run's label
	conn, err := net.Dial("udp", target)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, body := range [][]byte{plan, result} {
		msg := append([]byte{8}, body...) // memberlist's user message
		conn.Write(msg)
		labelled, _ := memberlist.AddLabelHeaderToPacket(msg, LabelFor(tc.run))
		conn.Write(labelled)
	}
	// members of memberlist itself: with another key, and of another run with the key
	for name, tune := range map[string]func(*memberlist.Config){
		"wrong key": func(c *memberlist.Config) { c.SecretKey = newKey(t); c.Label = LabelFor(tc.run) },
		"other run": func(c *memberlist.Config) { c.SecretKey = tc.key; c.Label = LabelFor(tc.run + "x") },
	} {
		c := memberlist.DefaultLocalConfig()
		c.Name, c.BindAddr, c.BindPort, c.AdvertisePort = "forger-"+name, "127.0.0.1", 0, 0
		c.LogOutput = testutil.LogWriter(t)
		tune(c)
		m, err := memberlist.Create(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, body := range [][]byte{plan, result} {
			m.SendToAddress(memberlist.Address{Addr: target}, body)
		}
		m.Shutdown()
	}
	// a message that did arrive would be handled within a few gossip rounds: the
	// member answers a status request after handling everything queued before it
	c := tc.client()
	ctx := testutil.Context(t, 10*time.Second)
	if _, ok := c.Batches(ctx); !ok {
		t.Fatal("no status")
	}
	if w, _, ok := tc.ranks[1].Agent.Current(); ok {
		t.Fatalf("a forged plan armed %v", w)
	}
	if id := tc.ranks[1].Agent.LastWindow(); id != 0 {
		t.Fatalf("a forged plan moved the window id to %d", id)
	}
}
