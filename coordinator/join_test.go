package coordinator

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/rankagent"
)

func TestExpandNodeList(t *testing.T) {
	cases := []struct {
		in   string
		want string
		err  bool
	}{
		{"node[01-04,07]", "node01 node02 node03 node04 node07", false},
		{"a,b[1-2],c", "a b1 b2 c", false},
		{"gpu-a[1-2]-x[3-4]", "gpu-a1-x3 gpu-a1-x4 gpu-a2-x3 gpu-a2-x4", false},
		{"n[008-010]", "n008 n009 n010", false},
		{"single", "single", false},
		{"n[1-", "", true},
		{"n[3-1]", "", true},
		{"n[a-b]", "", true},
		{"n]", "", true},
		{"", "", true},
	}
	for _, c := range cases {
		got, err := ExpandNodeList(c.in, 0)
		if (err != nil) != c.err || (!c.err && strings.Join(got, " ") != c.want) {
			t.Errorf("%q: %v %v, want %q", c.in, got, err, c.want)
		}
	}
	// the first host of a huge list, without expanding it all
	got, err := ExpandNodeList("n[0-99999999]", 1)
	if err != nil || len(got) != 1 || got[0] != "n0" {
		t.Fatalf("%v %v", got, err)
	}
}

func TestJoinAddrs(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	cases := []struct {
		env      func(string) string
		want, by string
	}{
		{env("MASTER_ADDR", "10.0.0.5"), "10.0.0.5:7946 10.0.0.5:7947", "torchrun"},
		{env("SLURM_JOB_NODELIST", "gpu[017-020]"), "gpu017:7946 gpu017:7947", "slurm"},
		{env("OMPI_MCA_orte_hnp_uri", "1234.0;tcp://10.1.2.3,192.168.0.1:45678"), "10.1.2.3:7946 10.1.2.3:7947", "mpi"},
		{env("MEMSNAP_JOIN", "svc.ns.svc.cluster.local, 10.0.0.9:8000", "MASTER_ADDR", "x"), "svc.ns.svc.cluster.local:7946 svc.ns.svc.cluster.local:7947 10.0.0.9:8000", "MEMSNAP_JOIN"},
		{env(), "", ""},
	}
	for _, c := range cases {
		got, by, err := JoinAddrs(c.env, 7946, 2)
		if err != nil || strings.Join(got, " ") != c.want || by != c.by {
			t.Errorf("got %v %q %v, want %q %q", got, by, err, c.want, c.by)
		}
	}
	if _, _, err := JoinAddrs(env("SLURM_JOB_NODELIST", "n[1-"), 7946, 1); err == nil {
		t.Fatal("a broken node list was accepted")
	}

}

func TestParseKey(t *testing.T) {
	for _, k := range []string{"AAAAAAAAAAAAAAAAAAAAAA==", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="} {
		if _, err := ParseKey(k); err != nil {
			t.Errorf("%q: %v", k, err)
		}
	}
	for _, k := range []string{"", "not base64!", "AAAA"} {
		if _, err := ParseKey(k); err == nil {
			t.Errorf("%q was accepted", k)
		}
	}
}

// TestMetaFits: the largest metadata a member can have fits memberlist's 512 bytes
// and reads back.
func TestMetaFits(t *testing.T) {
	m := &pb.NodeMeta{Version: 1, Run: strings.Repeat("r", config.MaxRunName), Rank: sidecar.MaxRanks - 1, LocalRank: sidecar.MaxRanks - 1, NodeRank: sidecar.MaxRanks - 1,
		WorldSize: sidecar.MaxRanks, GpuUuid: strings.Repeat("g", 64), LastWindow: wire.MaxWindowID, Hostname: strings.Repeat("h", 64), Term: wire.MaxWindowID}
	b, err := proto.Marshal(m)
	if err != nil || len(b) > wire.MaxMeta {
		t.Fatalf("%d bytes (%v)", len(b), err)
	}
	if _, err := wire.DecodeMeta(b); err != nil {
		t.Fatal(err)
	}
}

// TestJoinNameResolvesToEveryAddress: a join address whose name resolves to
// several addresses (a Kubernetes headless service names every pod) joins every
// one of them: two members that never joined each other become one cluster
// through a third that joins the name.
func TestJoinNameResolvesToEveryAddress(t *testing.T) {
	port := testutil.FreePort(t)
	key := newKey(t)
	member := func(bind string, join []string, resolve func(string) ([]net.IP, error)) *Coordinator {
		cfg := DefaultLocalConfig(rankagent.Identity{RunName: "svc"})
		cfg.Client, cfg.SecretKey, cfg.Logger = true, key, testutil.Logger(t)
		cfg.Memberlist.BindAddr, cfg.Memberlist.AdvertiseAddr = bind, bind
		if join == nil {
			cfg.Memberlist.BindPort, cfg.Memberlist.AdvertisePort = port, port
		}
		cfg.Join, cfg.Resolve = join, resolve
		c, stop := runMember(t, cfg)
		t.Cleanup(stop)
		testutil.Eventually(t, 10*time.Second, "gossip on "+bind, func() bool { return c.Addr() != "" })
		return c
	}
	a := member("127.0.0.2", nil, nil)
	b := member("127.0.0.3", nil, nil)
	var asked []string
	var mu sync.Mutex
	stub := func(host string) ([]net.IP, error) {
		mu.Lock()
		asked = append(asked, host)
		mu.Unlock()
		if host != "trainer.default.svc.cluster.local" {
			return nil, errors.New("no such host")
		}
		return []net.IP{net.ParseIP("127.0.0.2"), net.ParseIP("127.0.0.3")}, nil
	}
	c := member("127.0.0.1", []string{fmt.Sprintf("trainer.default.svc.cluster.local:%d", port)}, stub)
	testutil.Eventually(t, 30*time.Second, "one cluster of the three", func() bool {
		return len(a.Members()) == 3 && len(b.Members()) == 3 && len(c.Members()) == 3
	})
	mu.Lock()
	defer mu.Unlock()
	if len(asked) == 0 {
		t.Fatal("the join name was never resolved through the resolver")
	}
}

// TestReadvertiseOnceTheJoinTargetResolves: a member whose address was chosen
// before its join target resolved (here: one nobody can reach it at, as the IPv6
// ULA memberlist picks) chooses again once it does, restarts gossip on that
// address, and forms a cluster whose windows it records. Real memberlist over
// loopback: rank 1 binds 127.0.0.2 and first advertises 127.0.0.3.
func TestReadvertiseOnceTheJoinTargetResolves(t *testing.T) {
	tc := &testCluster{t: t, run: fmt.Sprintf("run%d", time.Now().UnixNano()%1e6), key: newKey(t), dir: t.TempDir(), holdAt: 5}
	base := testutil.FreePorts(t, 2)
	ports := []int{base, base + 1}
	var resolves atomic.Bool
	var asked atomic.Int32
	tc.startRank(1, 2, func(c *Config, a *rankagent.Config) {
		c.Memberlist.BindAddr, c.Memberlist.AdvertiseAddr = "127.0.0.2", "127.0.0.3"
		c.Memberlist.BindPort, c.Memberlist.AdvertisePort = ports[1], ports[1]
		c.Join = []string{fmt.Sprintf("127.0.0.1:%d", ports[0])}
		c.Readvertise = func() (string, string) {
			asked.Add(1)
			if !resolves.Load() {
				return "", ""
			}
			return "127.0.0.2", "the route to 127.0.0.1 (the join name, resolved now)"
		}
	})
	testutil.Eventually(t, 30*time.Second, "rank 1 to ask for its address while its join target does not answer", func() bool { return asked.Load() >= 2 })
	resolves.Store(true)
	tc.startRank(0, 2, func(c *Config, a *rankagent.Config) {
		c.Memberlist.BindPort, c.Memberlist.AdvertisePort = ports[0], ports[0]
		c.Join = nil
	})
	testutil.Eventually(t, 60*time.Second, "both ranks to see each other at 127.0.0.2 and 127.0.0.1", func() bool {
		return tc.ranks[1].Coord.Addr() == fmt.Sprintf("127.0.0.2:%d", ports[1]) &&
			len(tc.ranks[0].Coord.Members()) == 2 && len(tc.ranks[1].Coord.Members()) == 2
	})
	tc.holding()
	res, err := tc.client().Snapshot(testutil.Context(t, 2*time.Minute), 2, nil, nil)
	if err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED || fmt.Sprint(res.Ranks) != "[0 1]" {
		t.Fatalf("a window of both ranks: %+v %v", res, err)
	}
}
