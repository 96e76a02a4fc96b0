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
	"strings"
)

// ErrLocalExists: the download's destination exists and holds other content.
var ErrLocalExists = errors.New("store: local file exists")

// DownloadOptions tune one Download.
type DownloadOptions struct {
	// Overwrite replaces a destination file that holds other content.
	Overwrite bool
	// SHA256 is the checksum the object must have ("" takes the store's, if any).
	SHA256 string
	// Progress, when set, is called as bytes arrive with the count so far and the
	// object's size.
	Progress func(done, total int64)
}

// DownloadResult says what Download did.
type DownloadResult struct {
	Path     string
	Size     int64
	SHA256   string
	Verified bool // the content matched a known checksum
	Skipped  bool // the destination already held exactly this content
}

// CheckDestination refuses a destination that exists and is not a regular file,
// or (without overwrite) holds other content than sum; it reports whether the
// destination already holds exactly sum.
func CheckDestination(path, sum string, overwrite bool) (same bool, err error) {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store: %w", err)
	}
	if !st.Mode().IsRegular() {
		return false, fmt.Errorf("%w: %s is not a regular file", ErrLocalExists, path)
	}
	if sum != "" {
		if h, _, err := HashFile(path); err == nil && strings.EqualFold(h, sum) {
			return true, nil
		}
	}
	if overwrite {
		return false, nil
	}
	return false, fmt.Errorf("%w: %s holds other content (pass --overwrite to replace it)", ErrLocalExists, path)
}

// HashFile is the hex SHA-256 and the size of the local file at p.
func HashFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	sum, n, err := hashReader(context.Background(), f)
	if err != nil {
		return "", 0, err
	}
	return sum, n, nil
}

// Download copies key to the local file path: into a temporary file beside it,
// checked against the object's checksum, then renamed into place. A destination
// holding other content is kept unless opts.Overwrite; one holding the same content
// is left as it is. Nothing is left behind when the download fails or is cancelled.
func Download(ctx context.Context, s Store, key, path string, opts DownloadOptions) (DownloadResult, error) {
	want := opts.SHA256
	if want == "" {
		if info, err := s.Stat(ctx, key); err == nil {
			want = info.SHA256
		} else {
			return DownloadResult{}, err
		}
	}
	same, err := CheckDestination(path, want, opts.Overwrite)
	if err != nil {
		return DownloadResult{}, err
	}
	if same {
		st, _ := os.Stat(path)
		return DownloadResult{Path: path, Size: st.Size(), SHA256: want, Verified: true, Skipped: true}, nil
	}
	rc, info, err := s.Get(ctx, key)
	if err != nil {
		return DownloadResult{}, err
	}
	defer rc.Close()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return DownloadResult{}, fmt.Errorf("store: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".memsnap-get-*")
	if err != nil {
		return DownloadResult{}, fmt.Errorf("store: %w", err)
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	pw := &progressWriter{total: info.Size, fn: opts.Progress}
	n, err := io.Copy(io.MultiWriter(tmp, h, pw), ctxReader{ctx, rc})
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return DownloadResult{}, fmt.Errorf("store: downloading %s: %w", key, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if want != "" && !strings.EqualFold(sum, want) {
		return DownloadResult{}, fmt.Errorf("%w: %s: downloaded %s, want %s", ErrChecksum, key, sum, want)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return DownloadResult{}, fmt.Errorf("store: %w", err)
	}
	if !opts.Overwrite {
		// a file that appeared meanwhile is not replaced
		if err := os.Link(tmp.Name(), path); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return DownloadResult{}, fmt.Errorf("%w: %s appeared while downloading", ErrLocalExists, path)
			}
			return DownloadResult{}, fmt.Errorf("store: %w", err)
		}
	} else if err := os.Rename(tmp.Name(), path); err != nil {
		return DownloadResult{}, fmt.Errorf("store: %w", err)
	}
	return DownloadResult{Path: path, Size: n, SHA256: sum, Verified: want != ""}, nil
}

type progressWriter struct {
	done, total int64
	fn          func(done, total int64)
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.done += int64(len(b))
	if p.fn != nil {
		p.fn(p.done, p.total)
	}
	return len(b), nil
}
