// Package wire checks what members exchange as it comes off the wire: a
// member's gossiped metadata and every message envelope, against the limits a
// receiver relies on (sizes, ranks, window ids, known enum values), before
// anything acts on them.
//
// It keeps no state and starts no goroutine; its checks may run on any
// goroutine at once.
package wire
