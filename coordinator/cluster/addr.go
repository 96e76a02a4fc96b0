package cluster

import (
	"fmt"
	"net"
	"strings"
)

// IfaceEnv names the interface to advertise (as --iface does).
const IfaceEnv = "MEMSNAP_IFACE"

// netEnv is what choosing an address asks of the host; tests give stubs.
type netEnv struct {
	// route returns the local address the host would send from to reach ip (the
	// source address of its route there).
	route func(ip net.IP) (net.IP, error)
	// lookup resolves a host name.
	lookup func(host string) ([]net.IP, error)
	// ifaces lists the host's interfaces and their addresses.
	ifaces func() ([]Iface, error)
}

// Iface is one network interface and its addresses.
type Iface struct {
	Name  string
	Up    bool
	Addrs []net.IP
}

// hostEnv is the real host.
var hostEnv = netEnv{
	route: func(ip net.IP) (net.IP, error) {
		// a UDP "connection" sends nothing: it only asks the kernel for the route
		c, err := net.Dial("udp", net.JoinHostPort(ip.String(), "9"))
		if err != nil {
			return nil, err
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).IP, nil
	},
	lookup: net.LookupIP,
	ifaces: func() ([]Iface, error) {
		list, err := net.Interfaces()
		if err != nil {
			return nil, err
		}
		var out []Iface
		for _, i := range list {
			addrs, _ := i.Addrs()
			f := Iface{Name: i.Name, Up: i.Flags&net.FlagUp != 0}
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok {
					f.Addrs = append(f.Addrs, n.IP)
				}
			}
			out = append(out, f)
		}
		return out, nil
	},
}

// AdvertiseAddr chooses the address other members reach this one at, as NCCL
// and gloo choose theirs: the address of the interface named iface (an exact
// name, else the first whose name starts with it), or else the local address the
// host would send from to reach the first join target that resolves (the source
// of its route there, so a host with several interfaces, or with an IPv4 address
// outside the private ranges, advertises the one that reaches the job). With no
// join target that resolves and routes, it takes the source of the default route
// (IPv4 first), else the first global address of an interface that is up (IPv4
// first, public addresses too); settled is then false: a join name that resolves
// later (a Kubernetes pod starts before its headless Service lists it) may call
// for another choice. It returns "" when there is nothing to go by (memberlist
// then picks), and says how it chose.
func AdvertiseAddr(join []string, iface string) (ip, how string, settled bool, err error) {
	return hostEnv.advertise(join, iface)
}

// defaultRoutes are addresses whose route is the host's default one (nothing is
// sent to them: the kernel is only asked which source it would use).
var defaultRoutes = []net.IP{net.ParseIP("192.0.2.1"), net.ParseIP("2001:db8::1")}

func (e netEnv) advertise(join []string, iface string) (string, string, bool, error) {
	if iface != "" {
		ifs, err := e.ifaces()
		if err != nil {
			return "", "", false, fmt.Errorf("coordinator: listing the interfaces: %w", err)
		}
		f, ok := pickIface(ifs, iface)
		if !ok {
			var names []string
			for _, i := range ifs {
				names = append(names, i.Name)
			}
			return "", "", false, fmt.Errorf("coordinator: no interface named %q is up with an address (there are: %s)", iface, strings.Join(names, ", "))
		}
		return f.addr.String(), fmt.Sprintf("interface %s", f.name), true, nil
	}
	for _, j := range join {
		host, _, err := net.SplitHostPort(j)
		if err != nil {
			host = j
		}
		ips := []net.IP{net.ParseIP(host)}
		if ips[0] == nil {
			if ips, err = e.lookup(host); err != nil || len(ips) == 0 {
				continue
			}
		}
		for _, target := range ips {
			src, err := e.route(target)
			if err != nil || src == nil || src.IsUnspecified() {
				continue
			}
			return src.String(), fmt.Sprintf("the route to %s (%s)", target, j), true, nil
		}
	}
	why := "no join target resolves yet"
	if len(join) == 0 {
		why = "no join target"
	}
	settled := len(join) == 0 // nothing to resolve later
	for _, d := range defaultRoutes {
		if src, err := e.route(d); err == nil && src != nil && !src.IsUnspecified() && !src.IsLoopback() {
			return src.String(), fmt.Sprintf("the default route (%s)", why), settled, nil
		}
	}
	if ifs, err := e.ifaces(); err == nil {
		if f, ok := firstGlobal(ifs); ok {
			return f.addr.String(), fmt.Sprintf("interface %s, the first up with a global address (%s, and no default route)", f.name, why), settled, nil
		}
	}
	return "", "", settled, nil
}

// firstGlobal is the first interface that is up with a global address (IPv4
// first, private or public), loopback excluded.
func firstGlobal(ifs []Iface) (picked, bool) {
	for _, v4 := range []bool{true, false} {
		for _, f := range ifs {
			if !f.Up {
				continue
			}
			for _, a := range f.Addrs {
				if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified() || a.IsMulticast() || (a.To4() != nil) != v4 {
					continue
				}
				return picked{f.Name, a}, true
			}
		}
	}
	return picked{}, false
}

type picked struct {
	name string
	addr net.IP
}

// pickIface finds the interface iface names (exact, else by prefix) that is up,
// and its first global address (IPv4 first).
func pickIface(ifs []Iface, name string) (picked, bool) {
	try := func(match func(string) bool) (picked, bool) {
		for _, f := range ifs {
			if !f.Up || !match(f.Name) {
				continue
			}
			var v6 net.IP
			for _, a := range f.Addrs {
				if a.IsLinkLocalUnicast() || a.IsUnspecified() || a.IsMulticast() {
					continue
				}
				if a.To4() != nil {
					return picked{f.Name, a}, true
				}
				if v6 == nil {
					v6 = a
				}
			}
			if v6 != nil {
				return picked{f.Name, v6}, true
			}
		}
		return picked{}, false
	}
	if p, ok := try(func(n string) bool { return n == name }); ok {
		return p, true
	}
	return try(func(n string) bool { return strings.HasPrefix(n, name) })
}
