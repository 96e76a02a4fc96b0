package rankagent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/memsnap/memsnap/internal/store"
)

// The spool is a local folder (owner-only) that holds every snapshot until the
// store has it:
//
//	incoming/       the hook writes finished snapshots here
//	pending/<job>/  snapshot.pickle, meta.json and job.json, waiting for upload
//	failed/<job>/   jobs the store refused for good (an existing object, say)
//
// A job is created under a hidden name and renamed into pending/ once complete, so
// a crash never leaves half a job there; an agent that restarts uploads what
// pending/ holds. Nothing is deleted before the store has confirmed it.
type spool struct {
	root string
}

// job is job.json: what to upload and where.
type job struct {
	Key       string    `json:"key"`
	MetaKey   string    `json:"meta_key"`
	SHA256    string    `json:"sha256"`
	Size      int64     `json:"size"`
	Events    int       `json:"events"`
	Overwrite bool      `json:"overwrite"`
	Created   time.Time `json:"created"`
	Window    uint64    `json:"window"`
	Rank      int       `json:"rank"`
}

func openSpool(root string) (*spool, error) {
	for _, d := range []string{"", "incoming", "pending", "failed"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			return nil, fmt.Errorf("rankagent: spool %s: %w", root, err)
		}
	}
	if err := os.Chmod(root, 0o700); err != nil {
		return nil, fmt.Errorf("rankagent: spool %s: %w", root, err)
	}
	return &spool{root: root}, nil
}

func (s *spool) incoming() string { return filepath.Join(s.root, "incoming") }

// incomingFile resolves a name the hook sent, refusing anything but a regular file
// directly inside incoming/.
func (s *spool) incomingFile(name string) (string, error) {
	if err := checkSpoolName(name); err != nil {
		return "", err
	}
	p := filepath.Join(s.incoming(), name)
	st, err := os.Lstat(p)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", name)
	}
	return p, nil
}

func hashFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

func writeFileSync(p string, b []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// addJob moves a finished snapshot from incoming/ into a new pending job.
func (s *spool) addJob(name, src string, j job, meta []byte) (string, error) {
	id := fmt.Sprintf("r%d-w%d-%d", j.Rank, j.Window, time.Now().UnixNano())
	tmp := filepath.Join(s.root, "pending", ".tmp-"+id)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return "", err
	}
	if err := os.Rename(src, filepath.Join(tmp, "snapshot.pickle")); err != nil {
		return "", err
	}
	if err := writeFileSync(filepath.Join(tmp, "meta.json"), meta); err != nil {
		return "", err
	}
	jb, _ := json.MarshalIndent(j, "", "  ")
	if err := writeFileSync(filepath.Join(tmp, "job.json"), jb); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, filepath.Join(s.root, "pending", id)); err != nil {
		return "", err
	}
	return id, nil
}

// recover finishes jobs a crash left under their hidden names.
func (s *spool) recover(log *slog.Logger) {
	ents, _ := os.ReadDir(filepath.Join(s.root, "pending"))
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ".tmp-") {
			continue
		}
		dir := filepath.Join(s.root, "pending", e.Name())
		if _, err := os.Stat(filepath.Join(dir, "job.json")); err == nil {
			os.Rename(dir, filepath.Join(s.root, "pending", strings.TrimPrefix(e.Name(), ".tmp-")))
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "snapshot.pickle")); err == nil {
			log.Warn("an incomplete spool job holds a snapshot; it is kept, not uploaded", "dir", dir)
		}
	}
}

// pendingJobs lists the jobs waiting for upload, oldest first.
func (s *spool) pendingJobs() []string {
	ents, _ := os.ReadDir(filepath.Join(s.root, "pending"))
	var out []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// uploader uploads pending jobs, retrying with backoff while the store is away.
type uploader struct {
	sp       *spool
	open     func(context.Context) (store.Store, error)
	log      *slog.Logger
	minWait  time.Duration
	maxWait  time.Duration
	wake     chan struct{}
	onResult func(UploadResult)

	mu    sync.Mutex
	st    store.Store
	busy  bool
	stats UploadStats
}

// UploadResult reports one finished upload (or a job that failed for good).
type UploadResult struct {
	Key    string
	Size   int64
	SHA256 string
	Events int
	Window uint64
	Err    error
}

// UploadStats counts what the uploader did.
type UploadStats struct {
	Uploaded int
	Failed   int
	Retries  int
}

func (u *uploader) kick() {
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

func (u *uploader) store(ctx context.Context) (store.Store, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.st != nil {
		return u.st, nil
	}
	st, err := u.open(ctx)
	if err != nil {
		return nil, err
	}
	u.st = st
	return st, nil
}

func (u *uploader) run(ctx context.Context) {
	wait := u.minWait
	for {
		err := u.drain(ctx)
		var t <-chan time.Time
		if err != nil {
			u.log.Warn("upload failed; the snapshot stays in the spool and is retried", "err", err, "retry_in", wait)
			u.mu.Lock()
			u.stats.Retries++
			u.mu.Unlock()
			t = time.After(wait)
			wait = min(wait*2, u.maxWait)
		} else {
			wait = u.minWait
		}
		select {
		case <-ctx.Done():
			return
		case <-u.wake:
		case <-t:
		}
	}
}

// drain uploads every pending job; it stops at the first retryable failure.
func (u *uploader) drain(ctx context.Context) error {
	u.mu.Lock()
	u.busy = true
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		u.busy = false
		u.mu.Unlock()
	}()
	for _, id := range u.sp.pendingJobs() {
		if ctx.Err() != nil {
			return nil
		}
		if err := u.upload(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

func (u *uploader) upload(ctx context.Context, id string) error {
	dir := filepath.Join(u.sp.root, "pending", id)
	jb, err := os.ReadFile(filepath.Join(dir, "job.json"))
	if err != nil {
		return u.fail(id, fmt.Errorf("job.json: %w", err), UploadResult{})
	}
	var j job
	if err := json.Unmarshal(jb, &j); err != nil {
		return u.fail(id, fmt.Errorf("job.json: %w", err), UploadResult{})
	}
	res := UploadResult{Key: j.Key, Size: j.Size, SHA256: j.SHA256, Events: j.Events, Window: j.Window}
	st, err := u.store(ctx)
	if err != nil {
		return err
	}
	put := func(key, path, sum string, overwrite bool) error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		var size int64
		if fi, err := f.Stat(); err == nil {
			size = fi.Size()
		}
		_, err = st.Put(ctx, key, f, store.PutOptions{SHA256: sum, Overwrite: overwrite, Size: size})
		if errors.Is(err, store.ErrExists) {
			// an earlier attempt may have stored it before the agent stopped
			if info, serr := st.Stat(ctx, key); serr == nil && strings.EqualFold(info.SHA256, sum) && sum != "" {
				return nil
			}
		}
		return err
	}
	err = put(j.Key, filepath.Join(dir, "snapshot.pickle"), j.SHA256, j.Overwrite)
	if errors.Is(err, store.ErrExists) || errors.Is(err, store.ErrNoBucket) || errors.Is(err, store.ErrAccess) {
		if errors.Is(err, store.ErrExists) {
			return u.fail(id, err, res) // retrying cannot help
		}
		return err // the bucket or the credentials may be fixed: keep retrying
	}
	if err != nil {
		return err
	}
	metaSum, _, _ := hashFile(filepath.Join(dir, "meta.json"))
	if err := put(j.MetaKey, filepath.Join(dir, "meta.json"), metaSum, true); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		u.log.Warn("uploaded, but the spool job could not be removed", "dir", dir, "err", err)
	}
	u.mu.Lock()
	u.stats.Uploaded++
	u.mu.Unlock()
	u.log.Info("uploaded snapshot", "key", j.Key, "bytes", j.Size, "sha256", j.SHA256[:12], "events", j.Events, "store", st.String())
	if u.onResult != nil {
		u.onResult(res)
	}
	return nil
}

// fail moves a job that can never succeed to failed/ and reports it.
func (u *uploader) fail(id string, err error, res UploadResult) error {
	src := filepath.Join(u.sp.root, "pending", id)
	dst := filepath.Join(u.sp.root, "failed", id)
	if rerr := os.Rename(src, dst); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		u.log.Error("could not move a failed job aside", "dir", src, "err", rerr)
	}
	os.WriteFile(filepath.Join(dst, "error.txt"), []byte(err.Error()+"\n"), 0o600)
	u.mu.Lock()
	u.stats.Failed++
	u.mu.Unlock()
	u.log.Error("snapshot not uploaded; kept in the spool", "dir", dst, "err", err)
	res.Err = err
	if u.onResult != nil {
		u.onResult(res)
	}
	return nil
}

func (u *uploader) idle() bool {
	u.mu.Lock()
	busy := u.busy
	u.mu.Unlock()
	return !busy && len(u.sp.pendingJobs()) == 0
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}
