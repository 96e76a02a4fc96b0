// Package transport is the gossip transport of a memsnap member: memberlist's
// own UDP/TCP transport, with inbound streams bounded so that a sender that has
// not proved it holds the run's key cannot make the member hold much memory.
//
// A limitedTransport hands streams on from one goroutine of its own (forward);
// the set of open streams, the bytes they reserved and the refusals not yet
// logged are under its mutex, and its counters are atomic. Each limitedConn's
// header state belongs to the one goroutine memberlist reads it from; Close may
// come from another.
package transport
