package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/rankagent"
)

func TestForLocalRank(t *testing.T) {
	for _, c := range []struct {
		addr string
		rank int
		want string
	}{{":9400", 0, "127.0.0.1:9400"}, {":9400", 3, "127.0.0.1:9403"}, {"0.0.0.0:9400", 7, "0.0.0.0:9407"}, {"127.0.0.1:0", 5, "127.0.0.1:0"}} {
		if got, err := ForLocalRank(c.addr, c.rank); err != nil || got != c.want {
			t.Errorf("ForLocalRank(%q, %d) = %q, %v; want %q", c.addr, c.rank, got, err, c.want)
		}
	}
	if got, err := ForLocalRank(":65535", 1); err == nil {
		t.Errorf("past 65535: %q", got)
	}
}

func TestListenAddr(t *testing.T) {
	for in, want := range map[string]string{":9400": "127.0.0.1:9400", "0.0.0.0:9400": "0.0.0.0:9400", "[::1]:0": "[::1]:0", "localhost:80": "localhost:80"} {
		if got, err := ListenAddr(in); err != nil || got != want {
			t.Errorf("ListenAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"9400", "host:", ":port", ":70000", ""} {
		if got, err := ListenAddr(in); err == nil {
			t.Errorf("ListenAddr(%q) = %q, want an error", in, got)
		}
	}
}

// TestServed: the metrics are served at /metrics with the run, rank and node
// labels; no memory figures are made up before the trainer reports any, and a
// standalone agent has no cluster figures.
func TestServed(t *testing.T) {
	var have bool
	src := Source{Run: "r1", Rank: 3, Node: "n7",
		Memory: func() (rankagent.MemoryView, bool) {
			return rankagent.MemoryView{Batch: 9, Memory: rankagent.Memory{Allocated: 1234, Reserved: 4096, Peak: 2000}, DeviceTotal: 8192, DeviceUsed: 4096, Headroom: 6192}, have
		},
		Stats:      func() rankagent.Stats { return rankagent.Stats{WindowsRecorded: 2, Pending: 1} },
		SpoolBytes: func() int64 { return 77 }}
	s, err := Listen("127.0.0.1:0", src, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	get := func() string {
		c := &http.Client{Timeout: 10 * time.Second}
		resp, err := c.Get("http://" + s.Addr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	out := get()
	for _, want := range []string{`memsnap_windows_total{node="n7",outcome="recorded",rank="3",run="r1"} 2`, `memsnap_uploads_pending{node="n7",rank="3",run="r1"} 1`,
		`memsnap_spool_bytes{node="n7",rank="3",run="r1"} 77`, "go_goroutines", "process_resident_memory_bytes"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
	for _, absent := range []string{"memsnap_allocated_bytes", "memsnap_leader", "memsnap_members"} {
		if strings.Contains(out, absent+"{") {
			t.Errorf("%s served before a report / without a cluster:\n%s", absent, out)
		}
	}
	have = true
	out = get()
	for _, want := range []string{`memsnap_allocated_bytes{node="n7",rank="3",run="r1"} 1234`, `memsnap_headroom_ratio{node="n7",rank="3",run="r1"} 0.755859375`,
		`memsnap_batch{node="n7",rank="3",run="r1"} 9`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
}

// TestSilencesServed: a member's count of leaders it held silent, and of those
// heard from again, are served as counters beside its leadership.
func TestSilencesServed(t *testing.T) {
	src := Source{Run: "r1", Rank: 2, Node: "n1", Leading: func() bool { return false }, Silences: func() (uint64, uint64) { return 2, 1 }}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(newCollector(src)); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP memsnap_leader_silent_alive_total Leaders this agent held silent that were heard from again: alive all along, a term was taken while they lived.
# TYPE memsnap_leader_silent_alive_total counter
memsnap_leader_silent_alive_total{node="n1",rank="2",run="r1"} 1
# HELP memsnap_leader_silent_total Times this agent held its leader silent (it answered no ping for the silence time) and elected without it.
# TYPE memsnap_leader_silent_total counter
memsnap_leader_silent_total{node="n1",rank="2",run="r1"} 2
`
	if err := promtest.GatherAndCompare(reg, strings.NewReader(want), "memsnap_leader_silent_total", "memsnap_leader_silent_alive_total"); err != nil {
		t.Fatal(err)
	}
}
