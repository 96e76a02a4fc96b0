//go:build unix

package snapshot

import (
	"os"
	"syscall"
)

// mapFile maps size bytes of f read-only; ok is false where it cannot (an empty
// file, a file system without mappings), and the caller then reads f instead.
func mapFile(f *os.File, size int64) (data []byte, unmap func(), ok bool) {
	if size <= 0 || int64(int(size)) != size {
		return nil, nil, false
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, false
	}
	return data, func() { syscall.Munmap(data) }, true
}
