// Package metrics serves an agent's Prometheus metrics: its trainer's memory as
// the hook last reported it (with the device's, through NVML when it can be
// read), and the agent's own health. Every figure is read when Prometheus
// scrapes, from the agent and its cluster member, so nothing is kept twice.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/rankagent"
)

// Source is what the metrics are read from. Memory and Stats are the rank
// agent's; the cluster's figures are nil for a standalone agent.
type Source struct {
	Run  string
	Rank int
	Node string // the host the rank runs on

	Memory     func() (rankagent.MemoryView, bool)
	Stats      func() rankagent.Stats
	SpoolBytes func() int64

	Members func() int    // members this agent sees, itself included
	Term    func() uint64 // the leadership term it believes
	Leading func() bool
	// Silences is how many times this agent held its leader silent (it answered
	// no ping: coordinator.Config.LeaderSilence), and how many of those leaders
	// were heard from again (alive: a term was taken while they lived).
	Silences func() (held, alive uint64)
	// View is the job's memory as this member holds it (every rank's, on the
	// leader): served while it leads, so one scrape target answers for the job.
	View func() *pb.ClusterView
}

// collector turns a Source into metrics at each scrape.
type collector struct {
	src    Source
	labels []string
	descs  map[string]*prometheus.Desc
}

type metricDef struct {
	name, help string
	labels     []string // nil: run, rank and node
}

// rankLabels are most metrics' labels: the rank a figure is of.
var rankLabels = []string{"run", "rank", "node"}

var defs = []metricDef{
	{"memsnap_allocated_bytes", "Bytes in the trainer's live tensors at the end of its last reported batch (torch allocated_bytes.all.current).", nil},
	{"memsnap_reserved_bytes", "Bytes the trainer's caching allocator holds from the device (torch reserved_bytes.all.current).", nil},
	{"memsnap_peak_allocated_bytes", "The most the trainer ever had allocated, since it started or last reset its peak (torch allocated_bytes.all.peak).", nil},
	{"memsnap_inactive_split_bytes", "Free bytes inside split blocks of the allocator: fragmentation (torch inactive_split_bytes.all.current).", nil},
	{"memsnap_alloc_retries_total", "Allocations that freed the allocator's cache and tried again (torch num_alloc_retries).", nil},
	{"memsnap_ooms_total", "Out-of-memory errors the trainer's allocator raised (torch num_ooms).", nil},
	{"memsnap_device_used_bytes", "Bytes in use on the trainer's device, by every process (cudaMemGetInfo, else NVML).", nil},
	{"memsnap_device_total_bytes", "What CUDA can allocate of the trainer's device, in bytes (cudaMemGetInfo, else NVML).", nil},
	{"memsnap_nvml_device_used_bytes", "Bytes in use on the trainer's device as NVML reads it.", nil},
	{"memsnap_nvml_device_total_bytes", "The trainer's device's size as NVML reads it (the driver's own share included).", nil},
	{"memsnap_headroom_bytes", "How much more the trainer's peak can grow before an allocation fails: the device's free bytes plus what the allocator holds beyond its peak.", nil},
	{"memsnap_headroom_ratio", "memsnap_headroom_bytes over the device's size.", nil},
	{"memsnap_growth_bytes_per_batch", "Allocated bytes added per batch over the last reports (at a batch's end): a leak makes it positive.", nil},
	{"memsnap_batch", "The batch at whose end the trainer last reported its memory.", nil},
	{"memsnap_memory_report_timestamp_seconds", "When the agent received the trainer's last memory report (Unix time).", nil},
	{"memsnap_windows_total", "Windows this agent took part in, by what became of its rank's part.", []string{"run", "rank", "node", "outcome"}},
	{"memsnap_uploads_total", "Snapshots this agent uploaded to the store.", nil},
	{"memsnap_upload_failures_total", "Snapshots the store refused for good (kept in the spool's failed/ folder).", nil},
	{"memsnap_upload_retries_total", "Failed upload attempts that were retried.", nil},
	{"memsnap_uploads_pending", "Snapshots waiting in the spool for the store.", nil},
	{"memsnap_spool_bytes", "Bytes in the agent's spool.", nil},
	{"memsnap_members", "Cluster members this agent sees, itself included.", nil},
	{"memsnap_leader_term", "The leadership term this agent believes (the run's log holds it).", nil},
	{"memsnap_leader", "1 when this agent leads the cluster, else 0.", nil},
	{"memsnap_leader_silent_total", "Times this agent held its leader silent (it answered no ping for the silence time) and elected without it.", nil},
	{"memsnap_leader_silent_alive_total", "Leaders this agent held silent that were heard from again: alive all along, a term was taken while they lived.", nil},
	// the leader's metrics of every rank: labelled by the rank they are of (and
	// its node), not the leader's
	{"memsnap_cluster_headroom_min_bytes", "The job's least headroom, labelled with the rank that has it (served by the leader).", nil},
	{"memsnap_cluster_ranks_reporting", "Ranks whose memory figures the leader holds (served by the leader).", []string{"run"}},
	{"memsnap_cluster_rank_headroom_bytes", "Each rank's headroom as the leader last heard it.", nil},
	{"memsnap_cluster_rank_allocated_bytes", "Each rank's allocated bytes as the leader last heard them.", nil},
	{"memsnap_cluster_rank_growth_bytes_per_batch", "Each rank's growth per batch as the leader last heard it.", nil},
	{"memsnap_cluster_rank_report_age_seconds", "How long ago the leader heard each rank's figures.", nil},
}

func newCollector(src Source) *collector {
	c := &collector{src: src, labels: []string{src.Run, strconv.Itoa(src.Rank), src.Node}, descs: map[string]*prometheus.Desc{}}
	for _, d := range defs {
		labels := d.labels
		if labels == nil {
			labels = rankLabels
		}
		c.descs[d.name] = prometheus.NewDesc(d.name, d.help, labels, nil)
	}
	return c
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *collector) emit(ch chan<- prometheus.Metric, name string, t prometheus.ValueType, v float64, extra ...string) {
	ch <- prometheus.MustNewConstMetric(c.descs[name], t, v, append(append([]string{}, c.labels...), extra...)...)
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	g, k := prometheus.GaugeValue, prometheus.CounterValue
	if c.src.Memory != nil {
		if v, ok := c.src.Memory(); ok {
			c.emit(ch, "memsnap_allocated_bytes", g, float64(v.Allocated))
			c.emit(ch, "memsnap_reserved_bytes", g, float64(v.Reserved))
			c.emit(ch, "memsnap_peak_allocated_bytes", g, float64(v.Peak))
			c.emit(ch, "memsnap_inactive_split_bytes", g, float64(v.InactiveSplit))
			c.emit(ch, "memsnap_alloc_retries_total", k, float64(v.AllocRetries))
			c.emit(ch, "memsnap_ooms_total", k, float64(v.OOMs))
			c.emit(ch, "memsnap_batch", g, float64(v.Batch))
			c.emit(ch, "memsnap_growth_bytes_per_batch", g, v.Growth)
			c.emit(ch, "memsnap_memory_report_timestamp_seconds", g, float64(v.At.UnixNano())/1e9)
			if v.DeviceTotal > 0 {
				c.emit(ch, "memsnap_device_used_bytes", g, float64(v.DeviceUsed))
				c.emit(ch, "memsnap_device_total_bytes", g, float64(v.DeviceTotal))
				c.emit(ch, "memsnap_headroom_bytes", g, float64(v.Headroom))
				c.emit(ch, "memsnap_headroom_ratio", g, float64(v.Headroom)/float64(v.DeviceTotal))
			}
			if v.NVMLTotal > 0 {
				c.emit(ch, "memsnap_nvml_device_used_bytes", g, float64(v.NVMLUsed))
				c.emit(ch, "memsnap_nvml_device_total_bytes", g, float64(v.NVMLTotal))
			}
		}
	}
	if c.src.Stats != nil {
		s := c.src.Stats()
		c.emit(ch, "memsnap_windows_total", k, float64(s.WindowsRecorded), "recorded")
		c.emit(ch, "memsnap_windows_total", k, float64(s.WindowsPartial), "partial")
		c.emit(ch, "memsnap_windows_total", k, float64(s.WindowsMissed), "missed")
		c.emit(ch, "memsnap_uploads_total", k, float64(s.Uploaded))
		c.emit(ch, "memsnap_upload_failures_total", k, float64(s.UploadFailed))
		c.emit(ch, "memsnap_upload_retries_total", k, float64(s.Retries))
		c.emit(ch, "memsnap_uploads_pending", g, float64(s.Pending))
	}
	if c.src.SpoolBytes != nil {
		c.emit(ch, "memsnap_spool_bytes", g, float64(c.src.SpoolBytes()))
	}
	if c.src.Members != nil {
		c.emit(ch, "memsnap_members", g, float64(c.src.Members()))
	}
	if c.src.Term != nil {
		c.emit(ch, "memsnap_leader_term", g, float64(c.src.Term()))
	}
	if c.src.Leading != nil {
		lead := 0.0
		if c.src.Leading() {
			lead = 1
		}
		c.emit(ch, "memsnap_leader", g, lead)
		if c.src.Silences != nil {
			held, alive := c.src.Silences()
			c.emit(ch, "memsnap_leader_silent_total", k, float64(held))
			c.emit(ch, "memsnap_leader_silent_alive_total", k, float64(alive))
		}
		if lead == 1 && c.src.View != nil {
			c.collectView(ch, c.src.View())
		}
	}
}

// collectView serves the leader's view: every rank's figures, and the least
// headroom with its rank.
func (c *collector) collectView(ch chan<- prometheus.Metric, v *pb.ClusterView) {
	g := prometheus.GaugeValue
	ch <- prometheus.MustNewConstMetric(c.descs["memsnap_cluster_ranks_reporting"], g, float64(len(v.Ranks)), c.src.Run)
	var worst *pb.RankFigures
	for _, r := range v.Ranks {
		lv := []string{c.src.Run, strconv.Itoa(int(r.Rank)), r.Node}
		f := r.Figures
		if f.DeviceTotal > 0 {
			ch <- prometheus.MustNewConstMetric(c.descs["memsnap_cluster_rank_headroom_bytes"], g, float64(f.Headroom), lv...)
			if worst == nil || f.Headroom < worst.Figures.Headroom {
				worst = r
			}
		}
		ch <- prometheus.MustNewConstMetric(c.descs["memsnap_cluster_rank_allocated_bytes"], g, float64(f.Allocated), lv...)
		ch <- prometheus.MustNewConstMetric(c.descs["memsnap_cluster_rank_growth_bytes_per_batch"], g, f.Growth, lv...)
		ch <- prometheus.MustNewConstMetric(c.descs["memsnap_cluster_rank_report_age_seconds"], g, float64(r.AgeMs)/1000, lv...)
	}
	if worst != nil {
		ch <- prometheus.MustNewConstMetric(c.descs["memsnap_cluster_headroom_min_bytes"], g, float64(worst.Figures.Headroom),
			c.src.Run, strconv.Itoa(int(worst.Rank)), worst.Node)
	}
}

// Handler serves src's metrics (and the agent process's own: Go runtime and
// process figures) in Prometheus's text format.
func Handler(src Source) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(src), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, MaxRequestsInFlight: 4, Timeout: 10 * time.Second})
}

// ListenAddr is addr with a loopback host when it names none (":9400" is
// "127.0.0.1:9400"): metrics are served beyond the machine only when asked.
func ListenAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--metrics-addr %q: want [HOST]:PORT: %v", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("--metrics-addr %q: port %q is not a number from 0 to 65535", addr, port)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// Server serves the metrics at /metrics on a listener.
type Server struct {
	ln  net.Listener
	srv *http.Server
	log *slog.Logger
}

// ForLocalRank is addr's port plus localRank (a port of 0 stays 0): every
// agent of a node is started with one command line, as the gossip port is.
func ForLocalRank(addr string, localRank int) (string, error) {
	a, err := ListenAddr(addr)
	if err != nil || localRank <= 0 {
		return a, err
	}
	host, port, _ := net.SplitHostPort(a)
	p, _ := strconv.Atoi(port)
	if p == 0 {
		return a, nil
	}
	if p+localRank > 65535 {
		return "", fmt.Errorf("--metrics-addr %q: port %d plus local rank %d is past 65535", addr, p, localRank)
	}
	return net.JoinHostPort(host, strconv.Itoa(p+localRank)), nil
}

// Listen opens addr (see ListenAddr) for src's metrics; Serve serves them. With
// api, the window endpoint too (api.go).
func Listen(addr string, src Source, api *API, log *slog.Logger) (*Server, error) {
	a, err := ListenAddr(addr)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", a)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", Handler(src))
	if api != nil {
		api.routes(mux)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "memsnap agent: metrics at /metrics")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second,
		IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	return &Server{ln: ln, srv: srv, log: log}, nil
}

// Addr is where the metrics are served.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves until ctx ends.
func (s *Server) Serve(ctx context.Context) {
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s.srv.Shutdown(sctx)
	}()
	if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) && s.log != nil {
		s.log.Warn("the metrics server stopped", "err", err)
	}
}
