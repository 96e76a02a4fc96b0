package coordinator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/internal/retry"
	"github.com/memsnap/memsnap/merge/sidecar"
)

// JoinEnv is the environment variable that lists members to join (comma-separated
// host or host:port), as --join does.
const JoinEnv = "MEMSNAP_JOIN"

// JoinAddrs finds where to join from the launcher's environment: $MEMSNAP_JOIN,
// torchrun's MASTER_ADDR, the first host of SLURM's job node list, or Open MPI's
// head node. The head host is joined at the gossip port of each of its local ranks
// (basePort, basePort+1, ...), so the cluster forms while any of them lives. It
// returns the launcher's name, or "" when none is recognised.
func JoinAddrs(getenv func(string) string, basePort, localWorld int) ([]string, string, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	localWorld = max(localWorld, 1)
	head := func(host string) []string {
		out := make([]string, 0, localWorld)
		for i := 0; i < localWorld; i++ {
			out = append(out, net.JoinHostPort(host, strconv.Itoa(basePort+i)))
		}
		return out
	}
	if v := strings.TrimSpace(getenv(JoinEnv)); v != "" {
		addrs, err := ParseJoin(v, basePort, localWorld)
		return addrs, JoinEnv, err
	}
	if h := strings.TrimSpace(getenv("MASTER_ADDR")); h != "" {
		return head(h), "torchrun", nil
	}
	for _, n := range []string{"SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
		if v := strings.TrimSpace(getenv(n)); v != "" {
			hosts, err := ExpandNodeList(v, 1)
			if err != nil {
				return nil, "slurm", fmt.Errorf("coordinator: %s=%q: %w", n, v, err)
			}
			return head(hosts[0]), "slurm", nil
		}
	}
	for _, n := range []string{"OMPI_MCA_orte_hnp_uri", "OMPI_MCA_prte_hnp_uri"} {
		if v := getenv(n); v != "" {
			if h := hnpHost(v); h != "" {
				return head(h), "mpi", nil
			}
		}
	}
	return nil, "", nil
}

// ParseJoin splits a comma-separated list of host or host:port. A host without a
// port means every local rank's port on it, basePort to basePort+localWorld-1, so
// the cluster is joined through whichever of that host's agents lives.
func ParseJoin(v string, basePort, localWorld int) ([]string, error) {
	var out []string
	for _, a := range strings.Split(v, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			if strings.Count(a, ":") > 1 && !strings.HasPrefix(a, "[") { // a bare IPv6 address
				a = "[" + a + "]"
			}
			for i := 0; i < max(localWorld, 1); i++ {
				out = append(out, net.JoinHostPort(strings.Trim(a, "[]"), strconv.Itoa(basePort+i)))
			}
			continue
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("coordinator: no address in %q", v)
	}
	return out, nil
}

var hnpAddr = regexp.MustCompile(`tcp6?://\[?([^\],:;/]+)`)

// hnpHost finds the head node's address in Open MPI's HNP URI
// ("1234.0;tcp://10.0.0.1,192.168.1.1:45678").
func hnpHost(uri string) string {
	if m := hnpAddr.FindStringSubmatch(uri); m != nil {
		return m[1]
	}
	return ""
}

// maxHosts bounds how many hosts a node list may expand to.
const maxHosts = 1 << 20

// ExpandNodeList expands a SLURM host list ("node[01-04,07],gpu-a[1-2]-x[3-4]")
// into host names, keeping zero padding; limit > 0 stops after that many.
func ExpandNodeList(list string, limit int) ([]string, error) {
	var out []string
	for _, item := range splitTop(list) {
		hosts, err := expandItem(item, limit-len(out))
		if err != nil {
			return nil, err
		}
		out = append(out, hosts...)
		if limit > 0 && len(out) >= limit {
			return out[:limit], nil
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("an empty node list")
	}
	return out, nil
}

// splitTop splits at the commas outside brackets.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				if p := strings.TrimSpace(s[start:i]); p != "" {
					out = append(out, p)
				}
				start = i + 1
			}
		}
	}
	if p := strings.TrimSpace(s[start:]); p != "" {
		out = append(out, p)
	}
	return out
}

// expandItem expands one host pattern with any number of bracket groups.
func expandItem(item string, limit int) ([]string, error) {
	open := strings.IndexByte(item, '[')
	if open < 0 {
		if strings.ContainsAny(item, "]") {
			return nil, fmt.Errorf("unbalanced ']' in %q", item)
		}
		return []string{item}, nil
	}
	end := strings.IndexByte(item[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("unclosed '[' in %q", item)
	}
	end += open
	prefix, ranges, rest := item[:open], item[open+1:end], item[end+1:]
	tails, err := expandItem(rest, 0)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, rg := range strings.Split(ranges, ",") {
		lo, hi, ok := strings.Cut(rg, "-")
		if !ok {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a < 0 || b < a {
			return nil, fmt.Errorf("bad range %q in %q", rg, item)
		}
		if limit <= 0 && b-a >= maxHosts {
			return nil, fmt.Errorf("range %q in %q names more than %d hosts", rg, item, maxHosts)
		}
		width := len(lo)
		for n := a; n <= b; n++ {
			num := strconv.Itoa(n)
			if len(num) < width {
				num = strings.Repeat("0", width-len(num)) + num
			}
			for _, t := range tails {
				out = append(out, prefix+num+t)
				if (limit > 0 && len(out) >= limit) || len(out) >= maxHosts {
					return out, nil
				}
			}
		}
	}
	return out, nil
}

// join joins the cluster through the join addresses (every one but this member's
// own), retrying until a member other than this one answers or ctx ends. A member
// with nothing to join (the first of the cluster) is joined at once.
func (c *Coordinator) join(ctx context.Context) error {
	if len(c.joinTargets(nil)) == 0 {
		return nil
	}
	wait := retry.Backoff{Min: 200 * time.Millisecond, Max: 5 * time.Second}
	var give <-chan time.Time
	if c.cfg.JoinTimeout > 0 {
		t := time.NewTimer(c.cfg.JoinTimeout)
		defer t.Stop()
		give = t.C
	}
	var targets []string
	start := time.Now()
	for attempt := 1; ; attempt++ {
		m := c.memberlist()
		if m == nil {
			return ErrStopped
		}
		targets = c.joinTargets(nil) // resolved again: pods come up behind a name
		if len(targets) == 0 {
			return nil
		}
		if ask := c.cfg.Readvertise; ask != nil && m.NumMembers() <= 1 {
			if ip, how := ask(); ip != "" {
				c.cfg.Readvertise = nil // (only this goroutine reads it)
				if err := c.readvertise(ip, how); err != nil {
					return err
				}
				if m = c.memberlist(); m == nil {
					return ErrStopped
				}
			}
		}
		_, err := m.Join(targets)
		if m.NumMembers() > 1 {
			c.log.Info("joined the cluster", "via", targets, "members", m.NumMembers())
			return nil
		}
		// a member that gives up (a client: JoinTimeout) hears at once what no
		// wait can change: agents of another key or run, as soon as they answer;
		// no agent at any address, or no address that resolves, after a second
		if give != nil {
			if cause, ok := definitiveJoin(err); ok && (cause == joinKey || cause == joinRun || time.Since(start) >= joinSettle) {
				return diagnoseJoin(targets, err, 0) // (no wait can change it: said at once)
			}
		}
		if attempt == 1 || attempt%10 == 0 {
			c.log.Info("no member answered yet; retrying", "join", targets, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-give:
			return diagnoseJoin(targets, err, c.cfg.JoinTimeout)
		case <-time.After(wait.Next()):
		}
	}
}

// ErrJoin is wrapped by every join that gave up.
var ErrJoin = errors.New("coordinator: could not join")

// joinSettle is how long a member that gives up keeps trying addresses where
// nothing listens, or that do not resolve, before it says so: an agent started a
// moment after its client is still found.
const joinSettle = time.Second

// Why a join failed, from memberlist's error.
type joinCause int

const (
	joinUnknown joinCause = iota
	joinResolve           // the address does not resolve
	joinRefused           // nothing listens there
	joinSilent            // no answer
	joinKey               // the agents there use another key
	joinRun               // the agents there are of another run
)

var joinWhy = [...]string{
	joinUnknown: "no member answered",
	joinResolve: "the join address does not resolve (a typo in the host name?)",
	joinRefused: "nothing listens at the join address (is the agent running, and is the port its --gossip-port + local rank?)",
	joinSilent:  "no answer at the join address (a firewall, or the wrong host?)",
	joinKey:     "the agents there use another key (--key, --key-file or $MEMSNAP_KEY must be the agents' own)",
	joinRun:     "the agents there closed the connection: they belong to another run (check --run: the run's name labels its gossip)",
}

// joinCauseOf reads why one join attempt failed.
func joinCauseOf(msg string) joinCause {
	low := strings.ToLower(msg)
	switch {
	case strings.Contains(low, "no such host") || strings.Contains(low, "lookup "):
		return joinResolve
	case strings.Contains(low, "connection refused"):
		return joinRefused
	case strings.Contains(low, "i/o timeout") || strings.Contains(low, "no route") || strings.Contains(low, "deadline exceeded"):
		return joinSilent
	case strings.Contains(low, "decrypt") || strings.Contains(low, "encrypt"):
		return joinKey
	case strings.Contains(low, "eof") || strings.Contains(low, "reset by peer") || strings.Contains(low, "label"):
		return joinRun
	}
	return joinUnknown
}

// definitiveJoin says whether every address of a failed join failed for a
// reason no wait can change (the same one for all), and which.
func definitiveJoin(err error) (joinCause, bool) {
	if err == nil {
		return joinUnknown, false
	}
	var cause joinCause
	n := 0
	for _, l := range strings.Split(oneLine(err.Error()), "; ") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		c := joinCauseOf(l)
		if c == joinUnknown || c == joinSilent || n > 0 && c != cause {
			return joinUnknown, false
		}
		cause, n = c, n+1
	}
	return cause, n > 0
}

// diagnoseJoin says why no member answered, from memberlist's last error,
// within after (0: a cause no wait can change, said at once).
func diagnoseJoin(targets []string, err error, after time.Duration) error {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	why := joinWhy[joinCauseOf(msg)]
	within := ""
	if after > 0 {
		within = fmt.Sprintf(" within %v", after)
	}
	return fmt.Errorf("%w through %s%s: %s (%s)", ErrJoin, strings.Join(targets, ", "), within, why, oneLine(msg))
}

// oneLine turns memberlist's multi-line error list into one line.
func oneLine(s string) string {
	var parts []string
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "* "))
		if l != "" && !strings.HasSuffix(l, "error occurred:") && !strings.HasSuffix(l, "errors occurred:") {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, "; ")
}

// resolveJoin turns each join address whose host is a name into one address per
// IP the name resolves to (a headless service's name resolves to every pod), so
// every one is joined; an address that does not resolve stays as it is (the join
// says why it failed).
func (c *Coordinator) resolveJoin(addrs []string) []string {
	lookup := c.cfg.Resolve
	if lookup == nil {
		lookup = net.LookupIP
	}
	var out []string
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil || net.ParseIP(host) != nil {
			out = append(out, a)
			continue
		}
		ips, err := lookup(host)
		if err != nil || len(ips) == 0 {
			out = append(out, a)
			continue
		}
		for _, ip := range ips {
			out = append(out, net.JoinHostPort(ip.String(), port))
		}
	}
	return out
}

// joinTargets are the join addresses, each name resolved (without this member's
// own address and those of members already here), and then extra.
func (c *Coordinator) joinTargets(extra []string) []string {
	join := c.resolveJoin(c.cfg.Join)
	c.mu.Lock()
	defer c.mu.Unlock()
	self := c.addr
	var out []string
	seen := map[string]bool{}
	for _, a := range append(join, extra...) {
		if c.addrs[a] > 0 || a == self || seen[a] || isSelf(a, self) {
			continue
		}
		seen[a] = true
		out = append(out, a)
	}
	return out
}

// isSelf reports whether addr names this member's own address (localhost and the
// unspecified address included).
func isSelf(addr, self string) bool {
	h, p, err := net.SplitHostPort(addr)
	sh, sp, err2 := net.SplitHostPort(self)
	if err != nil || err2 != nil || p != sp {
		return false
	}
	if h == sh {
		return true
	}
	ip := net.ParseIP(h)
	return (h == "localhost" || (ip != nil && (ip.IsLoopback() || ip.IsUnspecified()))) && net.ParseIP(sh) != nil && net.ParseIP(sh).IsLoopback()
}

// rejoinLoop keeps a rank that sees fewer ranks than its world size (a client
// that sees no rank) trying to join: its join addresses (a restarted agent that
// came up alone, a job relaunched under a client that waits for its window) and
// every rank it has seen that is not a member now (the other side of a split).
// Two parts of one run that reach each other become one cluster again:
// memberlist merges their states on the join. The wait doubles up to 30 s while
// nothing changes.
func (c *Coordinator) rejoinLoop(ctx context.Context) {
	wait := retry.Backoff{Min: c.cfg.RejoinInterval, Max: 30 * time.Second}
	for wait.Wait(ctx) {
		want := c.cfg.Identity.WorldSize
		if c.cfg.Client {
			want = 1
		}
		// a whole cluster costs a counter's read a tick: every member runs this
		// loop, and at 1,024 members a walk over every member and every address
		// seen, on every member, was most of an idle simulation's CPU
		c.mu.Lock()
		ranks, m := c.nranks, c.ml
		var gone []string
		if ranks < want && m != nil {
			for name, a := range c.seenAddrs {
				if len(gone) == 64 {
					break
				}
				if _, ok := c.members[name]; !ok {
					gone = append(gone, a)
				}
			}
		}
		c.mu.Unlock()
		if ranks >= want || m == nil {
			wait.Reset()
			continue
		}
		targets := c.joinTargets(gone)
		if len(targets) == 0 {
			continue
		}
		before := m.NumMembers()
		n, err := m.Join(targets)
		if after := m.NumMembers(); after > before {
			c.log.Info("rejoined members that were apart", "members", after, "was", before, "world_size", c.cfg.Identity.WorldSize)
			wait.Reset()
			continue
		}
		c.log.Debug("rejoin found no one new", "tried", len(targets), "answered", n, "err", err)
	}
}

// pings carries, in each member's answer to a probe, how many ranks it sees. A
// member whose agent was restarted at once under its old name and address, with
// no one to join (the launcher's rank 0, say), comes up alone; the others never
// saw it die, for the new process answers their probes, so none of them rejoins
// it, and it would stay alone until a push-pull found it (30 s and more). The
// first member to probe it learns from the answer that it sees far fewer ranks and
// joins it: the join's push-pull gives each the other's whole membership.
type pings struct{ c *Coordinator }

var _ memberlist.PingDelegate = (*pings)(nil)

// pingVersion is the first byte of a probe answer's payload.
const pingVersion = 1

// pingJoinEvery is the least time between two joins of one member that a probe
// answer asked for.
const pingJoinEvery = 10 * time.Second

// pingJoins rate-limits the joins that probe answers ask for.
type pingJoins struct {
	mu       sync.Mutex
	last     map[string]time.Time
	inFlight bool
}

func (p *pings) AckPayload() []byte {
	return binary.AppendUvarint([]byte{pingVersion}, uint64(max(p.c.nranksSeen.Load(), 0)))
}

func (p *pings) NotifyPingComplete(other *memberlist.Node, rtt time.Duration, payload []byte) {
	theirs, ok := parsePingPayload(payload)
	if !ok || other == nil {
		return
	}
	p.c.probeAnswered(other.Name, other.Address(), theirs)
}

// parsePingPayload reads a probe answer's payload: the count of ranks its sender
// sees. Anything else (a newer version, garbage) is ignored.
func parsePingPayload(b []byte) (int64, bool) {
	if len(b) < 2 || b[0] != pingVersion {
		return 0, false
	}
	n, k := binary.Uvarint(b[1:])
	if k <= 0 || n > sidecar.MaxRanks {
		return 0, false
	}
	return int64(n), true
}

// apart says whether a member that sees theirs ranks is missing most of the
// ranks this member sees (ours): it sees only itself, or fewer than half. Two
// members a join or two apart while the cluster forms are not.
func apart(theirs, ours int64) bool {
	return theirs < ours && (theirs <= 1 || 2*theirs < ours)
}

// probeAnswered joins the member that answered a probe when it sees far fewer
// ranks than this one (apart), at most once per pingJoinEvery per member and one
// join at a time.
func (c *Coordinator) probeAnswered(name, addr string, theirs int64) {
	ours := c.nranksSeen.Load()
	if !apart(theirs, ours) {
		return
	}
	j := &c.pingJoin
	j.mu.Lock()
	now := time.Now()
	if j.inFlight || now.Sub(j.last[name]) < pingJoinEvery {
		j.mu.Unlock()
		return
	}
	if j.last == nil || len(j.last) > 4096 {
		j.last = map[string]time.Time{}
	}
	j.last[name], j.inFlight = now, true
	j.mu.Unlock()
	started := c.spawn(func() {
		defer func() { j.mu.Lock(); j.inFlight = false; j.mu.Unlock() }()
		m := c.memberlist()
		if m == nil {
			return
		}
		_, err := m.Join([]string{addr})
		c.log.Info("joined a member that saw few of the ranks (restarted alone?)", "peer", name, "addr", addr,
			"its_ranks", theirs, "ranks", ours, "err", err)
	})
	if !started {
		j.mu.Lock()
		j.inFlight = false
		j.mu.Unlock()
	}
}

// readvertise restarts gossip advertising ip, when that is not the address it
// advertises: the address was chosen before a join target resolved, and the
// route to it now goes from ip. Nobody knows this member yet (it joined no one,
// and no one joined it), so nothing is lost.
func (c *Coordinator) readvertise(ip, how string) error {
	c.mu.Lock()
	was, custom := c.cfg.Memberlist.AdvertiseAddr, c.cfg.Memberlist.Transport != nil
	c.mu.Unlock()
	if ip == was {
		return nil
	}
	if custom {
		c.log.Warn("the join target routes from another address than the one advertised, and gossip runs on a transport of its own: it keeps its address", "advertise", was, "routes_from", ip)
		return nil
	}
	c.lifeMu.Lock()
	m := c.memberlist()
	if m == nil || m.NumMembers() > 1 {
		c.lifeMu.Unlock()
		return nil
	}
	err := m.Shutdown()
	c.lifeMu.Unlock()
	if err != nil {
		return fmt.Errorf("coordinator: stopping gossip to advertise %s: %w", ip, err)
	}
	c.log.Info("the join target resolves now: gossip restarts on the address that routes to it", "advertise", ip, "by", how, "was", was)
	ml := *c.cfg.Memberlist
	ml.AdvertiseAddr = ip
	c.mu.Lock()
	c.cfg.Memberlist = &ml
	c.mu.Unlock()
	return c.start()
}
