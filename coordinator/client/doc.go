// Package client is a member's side of asking the cluster for a window: a
// request to the leader, asked again of a new leader or after a silence, the
// leader's messages put back in the order it told them, and how the window ends
// (with the answers a leader cannot tell yet, and the progress its answer
// overtook).
//
// It reaches the cluster only through a Member: the coordinator implements it.
// A request is owned by the goroutine running Request (Coordinator.Request):
// its fields, its inOrder and its timers are read and written there alone, and
// Progress is called there. The Member's methods may be called from that
// goroutine while the member's own goroutines run, so they must be safe for
// that.
package client
