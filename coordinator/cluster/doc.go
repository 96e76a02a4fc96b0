// Package cluster holds what a member needs to take part in the gossip cluster
// that does not touch a Coordinator's state: the address it advertises to the
// others, and the bridge from memberlist's log lines to slog.
//
// AdvertiseAddr keeps no state; it asks the host each time, on the caller's
// goroutine. The logger MemberlistLogger returns is written to from whichever
// memberlist goroutine logs; its counts of refused attempts are under a mutex.
package cluster
