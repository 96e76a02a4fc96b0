package wire

import (
	"crypto/rand"
	"encoding/binary"
)

// NewSeq is a random request id (never 0): a reply carries it back.
func NewSeq() uint64 {
	var b [8]byte
	for {
		rand.Read(b[:])
		if s := binary.LittleEndian.Uint64(b[:]); s != 0 {
			return s
		}
	}
}
