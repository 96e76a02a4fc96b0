package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/memsnap/memsnap/naming"
)

const tmpPrefix = ".memsnap-tmp-"

// maxSegment is the longest file name, in bytes, that common file systems hold
// (NAME_MAX on Linux, and the limit of ext4, XFS, APFS and NTFS).
const maxSegment = 255

// Dir is a store in a local folder: each key is a file under the root.
type Dir struct {
	root string
}

var _ Store = (*Dir)(nil)

// OpenDir opens a folder store; create makes the folder when it is missing. A
// folder this process may not reach or create is ErrAccess.
func OpenDir(root string, create bool) (*Dir, error) {
	if root == "" {
		return nil, errors.New("store: empty folder path")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("store: folder %s: %w", root, err)
	}
	st, err := os.Stat(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist) && create:
		if err := os.MkdirAll(abs, 0o755); err != nil {
			return nil, dirErr("creating folder "+abs, err)
		}
	case errors.Is(err, fs.ErrNotExist):
		return nil, &missingFolderError{path: abs}
	case err != nil:
		return nil, dirErr("folder "+abs, err)
	case !st.IsDir():
		return nil, fmt.Errorf("%w: %s is a file, not a folder", ErrBadURL, abs)
	}
	return &Dir{root: abs}, nil
}

// missingFolderError is ErrNoBucket for a folder store: it names the folder,
// and what to do, without a bucket's wording.
type missingFolderError struct{ path string }

func (e *missingFolderError) Error() string {
	return "store: the store folder " + e.path + " does not exist (create it, or pass the folder the agents' --store named)"
}

func (e *missingFolderError) Is(target error) bool { return target == ErrNoBucket }

// dirErr wraps an error about the store's folder: one of permission (or a
// read-only file system) wraps ErrAccess; a path through a file, or one that can
// never be made a folder (under /proc or /sys), wraps ErrBadURL: no wait cures
// either.
func dirErr(what string, err error) error {
	switch {
	case errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS):
		return fmt.Errorf("%w: %s: %w", ErrAccess, what, err)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%w: %s: a part of the path is a file, not a folder: %w", ErrBadURL, what, err)
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.EOPNOTSUPP):
		return fmt.Errorf("%w: %s: no folder can be made there: %w", ErrBadURL, what, err)
	}
	return fmt.Errorf("store: %s: %w", what, err)
}

func (d *Dir) String() string { return d.root }

// Root returns the folder's absolute path.
func (d *Dir) Root() string { return d.root }

// path checks key and returns it cleaned, with its file's path. A key with a
// segment longer than a file name may be is refused here, as a bad key, rather
// than by the file system later.
func (d *Dir) path(key string) (string, string, error) {
	k, err := naming.CleanKey(key)
	if err != nil {
		return "", "", err
	}
	for _, seg := range strings.Split(k, "/") {
		if len(seg) > maxSegment {
			return "", "", fmt.Errorf("%w: %.40q…: a segment of %d bytes is longer than the %d a file name may have", naming.ErrBadKey, k, len(seg), maxSegment)
		}
	}
	return k, filepath.Join(d.root, filepath.FromSlash(k)), nil
}

// fsErr wraps a file-system error about key k. A name the file system cannot hold
// (ENAMETOOLONG, as on a file system with shorter names) is a bad key.
func fsErr(what, k string, err error) error {
	if errors.Is(err, syscall.ENAMETOOLONG) {
		return fmt.Errorf("%w: %s %.40q…: the name is too long for the file system: %w", naming.ErrBadKey, what, k, err)
	}
	if what == "" {
		return fmt.Errorf("store: %s: %w", k, err)
	}
	return fmt.Errorf("store: %s %s: %w", what, k, err)
}

// Put writes to a temporary file beside the target, then links it into place (which
// fails atomically when the target exists) or renames it over the target.
func (d *Dir) Put(ctx context.Context, key string, r io.Reader, opts PutOptions) (ObjectInfo, error) {
	k, p, err := d.path(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	if !opts.Overwrite && opts.IfMatch == "" {
		if _, err := os.Lstat(p); err == nil {
			return ObjectInfo{}, fmt.Errorf("%w: %s in %s", ErrExists, k, d.root)
		}
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return ObjectInfo{}, fsErr("", k, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), OwnedPattern(tmpPrefix))
	if err != nil {
		return ObjectInfo{}, fsErr("", k, err)
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), ctxReader{ctx, r})
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return ObjectInfo{}, fsErr("writing", k, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if opts.SHA256 != "" && !strings.EqualFold(opts.SHA256, sum) {
		return ObjectInfo{}, fmt.Errorf("%w: %s: got %s, want %s", ErrChecksum, k, sum, opts.SHA256)
	}
	st, err := d.place(k, tmp.Name(), p, opts, false)
	if err != nil {
		return ObjectInfo{}, err
	}
	return ObjectInfo{Key: k, Size: n, SHA256: sum, ModTime: st.ModTime(), ETag: fileTag(st)}, nil
}

// place puts the finished file src at p: renamed over it (Overwrite), renamed
// over it while it is still the version opts.IfMatch names, or linked where
// nothing is (removing src when moved is set). It returns the placed file's info.
func (d *Dir) place(k, src, p string, opts PutOptions, moved bool) (os.FileInfo, error) {
	var err error
	switch {
	case opts.IfMatch != "":
		unlock, lerr := lockFolder(filepath.Dir(p))
		if lerr != nil {
			return nil, fsErr("locking for", k, lerr)
		}
		defer unlock()
		cur, serr := os.Stat(p)
		if serr != nil || fileTag(cur) != opts.IfMatch {
			return nil, fmt.Errorf("%w: %s in %s", ErrChanged, k, d.root)
		}
		err = os.Rename(src, p)
	case opts.Overwrite:
		err = os.Rename(src, p)
	default:
		if err = os.Link(src, p); errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("%w: %s in %s", ErrExists, k, d.root)
		}
		if err == nil && moved {
			os.Remove(src)
		}
	}
	if err != nil {
		return nil, fsErr("placing", k, err)
	}
	st, err := os.Stat(p)
	if err != nil {
		return nil, fsErr("", k, err)
	}
	return st, nil
}

// PutFile moves a finished local file into place under key (a link, or a rename
// with Overwrite) instead of copying it; the file must be on the store's file
// system (see TempDir) and is gone from path afterwards. It checks the SHA-256 only
// when the caller gives one; Stat computes it when asked.
func (d *Dir) PutFile(ctx context.Context, key, path string, opts PutOptions) (ObjectInfo, error) {
	k, p, err := d.path(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	if opts.SHA256 != "" {
		f, err := os.Open(path)
		if err != nil {
			return ObjectInfo{}, fmt.Errorf("store: %s: %w", k, err)
		}
		sum, _, err := hashReader(ctx, f)
		f.Close()
		if err != nil {
			return ObjectInfo{}, fmt.Errorf("store: hashing %s: %w", k, err)
		}
		if !strings.EqualFold(sum, opts.SHA256) {
			return ObjectInfo{}, fmt.Errorf("%w: %s: got %s, want %s", ErrChecksum, k, sum, opts.SHA256)
		}
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return ObjectInfo{}, fsErr("", k, err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		return ObjectInfo{}, fmt.Errorf("store: %s: %w", k, err)
	}
	st, err := d.place(k, path, p, opts, true)
	if err != nil {
		return ObjectInfo{}, err
	}
	return ObjectInfo{Key: k, Size: st.Size(), SHA256: opts.SHA256, ModTime: st.ModTime(), ETag: fileTag(st)}, nil
}

// TempDir returns a folder on the store's file system for files that PutFile will
// move into place. Those that killed processes left behind go first (SweepStale).
func (d *Dir) TempDir() (string, error) {
	SweepStale(d.root, tmpPrefix+"dir-")
	return os.MkdirTemp(d.root, OwnedPattern(tmpPrefix+"dir-"))
}

func (d *Dir) Get(ctx context.Context, key string) (io.ReadCloser, ObjectInfo, error) {
	k, p, err := d.path(key)
	if err != nil {
		return nil, ObjectInfo{}, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ObjectInfo{}, fmt.Errorf("%w: %s in %s", ErrNotFound, k, d.root)
	}
	if err != nil {
		return nil, ObjectInfo{}, fsErr("", k, err)
	}
	st, err := f.Stat()
	if err != nil || st.IsDir() {
		f.Close()
		return nil, ObjectInfo{}, fmt.Errorf("%w: %s in %s", ErrNotFound, k, d.root)
	}
	return f, ObjectInfo{Key: k, Size: st.Size(), ModTime: st.ModTime(), ETag: fileTag(st)}, nil
}

// Stat hashes the file to report its checksum.
func (d *Dir) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	rc, info, err := d.Get(ctx, key)
	if err != nil {
		return ObjectInfo{}, err
	}
	defer rc.Close()
	if info.SHA256, _, err = hashReader(ctx, rc); err != nil {
		return ObjectInfo{}, fmt.Errorf("store: hashing %s: %w", info.Key, err)
	}
	return info, nil
}

func (d *Dir) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	prefix = strings.TrimLeft(prefix, "/")
	var out []ObjectInfo
	err := filepath.WalkDir(d.root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(d.root, p)
		key := filepath.ToSlash(rel)
		if e.IsDir() {
			if strings.HasPrefix(e.Name(), tmpPrefix) {
				return filepath.SkipDir
			}
			if key != "." && !strings.HasPrefix(key+"/", prefix) && !strings.HasPrefix(prefix, key+"/") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(e.Name(), tmpPrefix) || !strings.HasPrefix(key, prefix) || !e.Type().IsRegular() {
			return nil
		}
		st, err := e.Info()
		if err != nil {
			return err
		}
		out = append(out, ObjectInfo{Key: key, Size: st.Size(), ModTime: st.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: listing %s in %s: %w", prefix, d.root, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func (d *Dir) Delete(ctx context.Context, key string) error {
	k, p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fsErr("deleting", k, err)
	}
	return nil
}

// hashReader reads r to its end (or until ctx ends), and returns the SHA-256 of
// what it read, in hex, and how many bytes it read.
func hashReader(ctx context.Context, r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, ctxReader{ctx, r})
	if err != nil {
		return "", n, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// ctxReader stops a copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Close does nothing: a folder holds no connection.
func (d *Dir) Close() error { return nil }

// URL is the file's path.
func (d *Dir) URL(key string) string {
	return filepath.Join(d.root, filepath.FromSlash(strings.TrimLeft(key, "/")))
}
