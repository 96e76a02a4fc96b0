//go:build !unix

package store

import (
	"fmt"
	"os"
	"sync"
)

// fileTag is a folder store's version of a file: its size and modification time.
func fileTag(fi os.FileInfo) string {
	return fmt.Sprintf("%x-%x", fi.Size(), fi.ModTime().UnixNano())
}

var folderLock sync.Mutex

// lockFolder serializes conditional replaces within this process (no file
// locks here).
func lockFolder(string) (func(), error) {
	folderLock.Lock()
	return folderLock.Unlock, nil
}
