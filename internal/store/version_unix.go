//go:build unix

package store

import (
	"fmt"
	"os"
	"syscall"
)

// fileTag is a folder store's version of a file: its inode, size and
// modification time. A Put replaces a file by renaming a new one over it, so
// every replacement has a new inode.
func fileTag(fi os.FileInfo) string {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fmt.Sprintf("%x-%x-%x", st.Ino, fi.Size(), fi.ModTime().UnixNano())
	}
	return fmt.Sprintf("%x-%x", fi.Size(), fi.ModTime().UnixNano())
}

// lockFolder holds an exclusive lock on folder dir until unlock is called: the
// conditional replaces of one folder, by every process on this host, take it in
// turn. The lock is on the folder itself, so it leaves no file behind.
func lockFolder(dir string) (unlock func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
