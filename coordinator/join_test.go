package coordinator

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/merge"
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
	m := &pb.NodeMeta{Version: 1, Run: strings.Repeat("r", maxRunName), Rank: merge.MaxRanks - 1, LocalRank: merge.MaxRanks - 1, NodeRank: merge.MaxRanks - 1,
		WorldSize: merge.MaxRanks, GpuUuid: strings.Repeat("g", 64), LastWindow: maxWindowID, Hostname: strings.Repeat("h", 64), Term: maxWindowID}
	b, err := proto.Marshal(m)
	if err != nil || len(b) > maxMeta {
		t.Fatalf("%d bytes (%v)", len(b), err)
	}
	if _, err := decodeMeta(b); err != nil {
		t.Fatal(err)
	}
}
