package store

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Temporary files and folders (an upload being written, a merge's outputs before
// they are moved into place) are named PREFIX<host>-<pid>-<random>, so that
// those a killed process left behind can be told from those of one that still
// writes: SweepStale removes them.

// staleAfter is how old a temporary of another host (whose process cannot be
// asked) must be before SweepStale removes it.
const staleAfter = 24 * time.Hour

// deadAfter is how old a temporary of this host whose process is gone must be
// before SweepStale removes it: a process in another PID namespace (a container
// with this host's name) is not seen, and may still be writing.
const deadAfter = time.Hour

// ownerTag is this process's part of its temporaries' names: host-pid-.
func ownerTag() string {
	h, _ := os.Hostname()
	h = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' {
			return r
		}
		return '_'
	}, h)
	if len(h) > 100 { // (host names are at most 64 bytes on Linux; never cut two apart)
		h = h[:100]
	}
	if h == "" {
		h = "host"
	}
	return h + "-" + strconv.Itoa(os.Getpid()) + "-"
}

// OwnedPattern is the os.CreateTemp / os.MkdirTemp pattern of a temporary named
// prefix that this process owns.
func OwnedPattern(prefix string) string { return prefix + ownerTag() + "*" }

// SweepStale removes the temporaries named prefix in folder (not below it) that
// a process no longer running left behind: those of this host whose process is
// gone (an hour old at least), and those of other hosts older than a day. It returns how many it removed
// and the bytes they held; a folder that cannot be read removes nothing.
func SweepStale(folder, prefix string) (int, int64) {
	es, err := os.ReadDir(folder)
	if err != nil {
		return 0, 0
	}
	self := strings.SplitN(ownerTag(), "-", 2)[0]
	var n int
	var bytes int64
	for _, e := range es {
		name := e.Name()
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		parts := strings.SplitN(strings.TrimPrefix(name, prefix), "-", 3)
		if len(parts) != 3 {
			continue // not a name this code makes (an older one's, or another's)
		}
		pid, err := strconv.Atoi(parts[1])
		if err != nil || pid <= 0 {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		age := time.Since(info.ModTime())
		if parts[0] == self {
			if alive(pid) || age < deadAfter {
				continue
			}
		} else if age < staleAfter {
			continue
		}
		p := filepath.Join(folder, name)
		size := sizeOf(p)
		if os.RemoveAll(p) == nil {
			n++
			bytes += size
		}
	}
	return n, bytes
}

// alive reports whether process pid runs on this host (or may: one that cannot be
// signalled for want of permission runs).
func alive(pid int) bool {
	if pid == os.Getpid() {
		return true
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func sizeOf(p string) int64 {
	var n int64
	filepath.WalkDir(p, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if i, err := d.Info(); err == nil {
				n += i.Size()
			}
		}
		return nil
	})
	return n
}
