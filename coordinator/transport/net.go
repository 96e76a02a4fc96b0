package transport

import (
	"fmt"
	"log/slog"

	"github.com/hashicorp/memberlist"
)

// New makes memberlist's UDP/TCP transport as memberlist itself would
// (retrying a port the system picks), behind limitTransport, which bounds what a
// sender that has not proved it holds the key can make this member hold. When
// ml asks for a port the system picks, New sets ml's bind and advertised ports
// to the one it got.
func New(ml *memberlist.Config, log *slog.Logger) (memberlist.NodeAwareTransport, error) {
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{ml.BindAddr}, BindPort: ml.BindPort, Logger: ml.Logger}
	tries := 1
	if ml.BindPort == 0 {
		tries = 10 // a port the system picks for TCP may be taken for UDP
	}
	var nt *memberlist.NetTransport
	var err error
	for i := 0; i < tries; i++ {
		if nt, err = memberlist.NewNetTransport(nc); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("coordinator: starting gossip on %s:%d: %w", ml.BindAddr, ml.BindPort, err)
	}
	if ml.BindPort == 0 {
		ml.BindPort = nt.GetAutoBindPort()
		ml.AdvertisePort = ml.BindPort
	}
	return limitTransport(nt, defaultStreamLimits(), log), nil
}
