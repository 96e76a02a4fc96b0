package rankagent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// ErrUnsafeFolder is wrapped when a folder the agent shares with its trainer (the
// socket's, the spool's) could be changed by another local user.
var ErrUnsafeFolder = errors.New("rankagent: folder not private")

// privateDir makes dir (mode 0700) when it is missing, and refuses it unless it is a
// real folder (not a symbolic link) owned by this user and writable by no one else:
// another user who could write there could replace the socket and receive the
// trainer's snapshots.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("rankagent: %w", err)
	}
	return checkPrivate(dir)
}

// checkPrivate refuses dir unless it is a folder owned by this user that group and
// others cannot write.
func checkPrivate(dir string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("rankagent: %w", err)
	}
	if st.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("%w: %s is a symbolic link", ErrUnsafeFolder, dir)
	}
	if !st.IsDir() {
		return fmt.Errorf("%w: %s is not a folder", ErrUnsafeFolder, dir)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Getuid() {
		return fmt.Errorf("%w: %s belongs to user %d, not to this user (%d); remove it or choose another --socket/--spool", ErrUnsafeFolder, dir, sys.Uid, os.Getuid())
	}
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: %s is writable by others (mode %v); chmod go-w it or choose another --socket/--spool", ErrUnsafeFolder, dir, st.Mode().Perm())
	}
	return nil
}
