package coordinator

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
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
		addrs, err := ParseJoin(v, basePort)
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

// ParseJoin splits a comma-separated list of host or host:port, adding basePort
// where no port is given.
func ParseJoin(v string, basePort int) ([]string, error) {
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
			a = net.JoinHostPort(strings.Trim(a, "[]"), strconv.Itoa(basePort))
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
