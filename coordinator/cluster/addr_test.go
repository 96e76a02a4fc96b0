package cluster

import (
	"errors"
	"net"
	"strings"
	"testing"
)

// stubHost is a host with an Ethernet address outside the private ranges, an
// InfiniBand address, a container bridge and an IPv6 ULA, whose routing table
// sends the job's network out of eth0 and 10.1/16 out of ib0.
func stubHost() netEnv {
	ifs := []Iface{
		{Name: "lo", Up: true, Addrs: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}},
		{Name: "eth0", Up: true, Addrs: []net.IP{net.ParseIP("fe80::1"), net.ParseIP("203.0.113.7"), net.ParseIP("fd00::2")}},
		{Name: "ib0", Up: true, Addrs: []net.IP{net.ParseIP("10.1.0.5")}},
		{Name: "docker0", Up: true, Addrs: []net.IP{net.ParseIP("172.17.0.1")}},
		{Name: "eth1", Up: false, Addrs: []net.IP{net.ParseIP("192.168.9.9")}},
		{Name: "ula0", Up: true, Addrs: []net.IP{net.ParseIP("fe80::9"), net.ParseIP("fd00::3")}},
	}
	return netEnv{
		route: func(ip net.IP) (net.IP, error) {
			switch {
			case ip.IsLoopback():
				return net.ParseIP("127.0.0.1"), nil
			case (&net.IPNet{IP: net.ParseIP("10.1.0.0"), Mask: net.CIDRMask(16, 32)}).Contains(ip):
				return net.ParseIP("10.1.0.5"), nil
			case ip.To4() != nil:
				return net.ParseIP("203.0.113.7"), nil
			}
			return nil, errors.New("network is unreachable")
		},
		lookup: func(host string) ([]net.IP, error) {
			switch host {
			case "head":
				return []net.IP{net.ParseIP("203.0.113.1")}, nil
			case "head-ib":
				return []net.IP{net.ParseIP("10.1.0.1")}, nil
			}
			return nil, errors.New("no such host")
		},
		ifaces: func() ([]Iface, error) { return ifs, nil },
	}
}

// TestAdvertiseAddr: the address advertised is the one that reaches the job:
// the source of the route to the join target (not the IPv6 ULA memberlist
// would pick on a host whose IPv4 address is not private), an interface named
// as NCCL_SOCKET_IFNAME names one, or, with no join target that resolves and
// routes, the default route's source (a public IPv4 address too), else the first
// interface up with a global address; a choice made without a join target to go
// by is not settled while there is one to resolve later.
func TestAdvertiseAddr(t *testing.T) {
	h := stubHost()
	noRoute := stubHost()
	noRoute.route = func(ip net.IP) (net.IP, error) { return nil, errors.New("network is unreachable") }
	onlyULA := stubHost()
	onlyULA.route = noRoute.route
	onlyULA.ifaces = func() ([]Iface, error) {
		return []Iface{{Name: "lo", Up: true, Addrs: []net.IP{net.ParseIP("127.0.0.1")}}, {Name: "ula0", Up: true, Addrs: []net.IP{net.ParseIP("fe80::9"), net.ParseIP("fd00::3")}}}, nil
	}
	onlyLo := stubHost()
	onlyLo.route = noRoute.route
	onlyLo.ifaces = func() ([]Iface, error) {
		return []Iface{{Name: "lo", Up: true, Addrs: []net.IP{net.ParseIP("127.0.0.1")}}}, nil
	}
	for _, c := range []struct {
		host        netEnv
		join        []string
		iface       string
		want, how   string
		unsettled   bool
		errContains string
	}{
		{join: []string{"203.0.113.1:7946"}, want: "203.0.113.7", how: "route to 203.0.113.1"},
		{join: []string{"head:7946", "head:7947"}, want: "203.0.113.7", how: "route to 203.0.113.1"},
		{join: []string{"head-ib:7946"}, want: "10.1.0.5", how: "route to 10.1.0.1"},
		{join: []string{"nowhere:7946", "10.1.2.3:7946"}, want: "10.1.0.5"}, // the first that resolves
		{join: []string{"127.0.0.1:7946"}, want: "127.0.0.1"},
		// no join target to go by: the default route's source, chosen again later
		{join: []string{"[fd00::1]:7946"}, want: "203.0.113.7", how: "the default route (no join target resolves yet)", unsettled: true},
		{join: []string{"nowhere:7946"}, want: "203.0.113.7", how: "the default route", unsettled: true},
		{join: nil, want: "203.0.113.7", how: "the default route (no join target)"},
		{host: noRoute, join: []string{"nowhere:7946"}, want: "203.0.113.7", how: "interface eth0, the first up with a global address", unsettled: true},
		{host: onlyULA, want: "fd00::3", how: "interface ula0"},
		{host: onlyLo, want: ""}, // nothing to go by: memberlist picks
		{join: []string{"head:7946"}, iface: "ib0", want: "10.1.0.5", how: "interface ib0"},
		{iface: "ib", want: "10.1.0.5", how: "interface ib0"},           // a prefix, as NCCL_SOCKET_IFNAME
		{iface: "eth0", want: "203.0.113.7", how: "interface eth0"},     // IPv4 before the ULA
		{iface: "ula0", want: "fd00::3", how: "interface ula0"},         // no IPv4: the global IPv6
		{iface: "eth1", errContains: `no interface named "eth1" is up`}, // down
		{iface: "wlan", errContains: "there are: lo, eth0"},
	} {
		host := h
		if c.host.route != nil {
			host = c.host
		}
		ip, how, settled, err := host.advertise(c.join, c.iface)
		if c.errContains != "" {
			if err == nil || !strings.Contains(err.Error(), c.errContains) {
				t.Errorf("%v %q: err %v, want %q", c.join, c.iface, err, c.errContains)
			}
			continue
		}
		if err != nil || ip != c.want || !strings.Contains(how, c.how) || settled == c.unsettled {
			t.Errorf("%v %q: %q (%s, settled %v) %v, want %q (%s, settled %v)", c.join, c.iface, ip, how, settled, err, c.want, c.how, !c.unsettled)
		}
	}
}
