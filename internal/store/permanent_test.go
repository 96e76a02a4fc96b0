package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/naming"
)

// TestPermanent classifies errors the stores really return.
func TestPermanent(t *testing.T) {
	m := testutil.RequireMinIO(t)
	ctx := testutil.Context(t, 2*time.Minute)
	good := Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}
	dir, err := OpenDir(t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	s3 := openMinIO(t)
	stores := []Store{dir, s3}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	expired, cancel2 := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel2()
	stream := func(b string) io.Reader { return io.MultiReader(strings.NewReader(b)) } // cannot seek

	type row struct {
		name      string
		err       func(t *testing.T, s Store) error // s is each store in turn; nil for rows not about a store
		sentinel  error                             // the error must wrap it
		permanent bool
	}
	rows := []row{
		{"exists", func(t *testing.T, s Store) error {
			if _, err := s.Put(ctx, "exists", strings.NewReader("a"), PutOptions{}); err != nil {
				t.Fatal(err)
			}
			_, err := s.Put(ctx, "exists", strings.NewReader("b"), PutOptions{})
			return err
		}, ErrExists, true},
		{"checksum", func(t *testing.T, s Store) error {
			_, err := s.Put(ctx, "checksum", strings.NewReader("a"), PutOptions{SHA256: sum([]byte("b"))})
			return err
		}, ErrChecksum, true},
		{"checksum-stream", func(t *testing.T, s Store) error {
			_, err := s.Put(ctx, "checksum-stream", stream("a"), PutOptions{Size: 1, SHA256: sum([]byte("b"))})
			return err
		}, ErrChecksum, true},
		{"key-too-long", func(t *testing.T, s Store) error {
			_, err := s.Put(ctx, strings.Repeat("k", naming.MaxKeyLen+1), strings.NewReader("a"), PutOptions{})
			return err
		}, naming.ErrBadKey, true},
		{"segment-too-long", func(t *testing.T, s Store) error {
			_, err := s.Put(ctx, "a/"+strings.Repeat("s", 256), strings.NewReader("a"), PutOptions{})
			return err
		}, naming.ErrBadKey, true},
		{"cancelled", func(t *testing.T, s Store) error {
			_, err := s.Put(cancelled, "cancelled", stream("a"), PutOptions{})
			return err
		}, context.Canceled, false},
		{"deadline", func(t *testing.T, s Store) error {
			_, err := s.Put(expired, "deadline", stream("a"), PutOptions{})
			return err
		}, context.DeadlineExceeded, false},
		{"not-found", func(t *testing.T, s Store) error {
			_, _, err := s.Get(ctx, "absent")
			return err
		}, ErrNotFound, false},
	}
	for _, r := range rows {
		for _, s := range stores {
			name := r.name + "/dir"
			if s == Store(s3) {
				name = r.name + "/minio"
			}
			t.Run(name, func(t *testing.T) {
				err := r.err(t, s)
				if !errors.Is(err, r.sentinel) {
					t.Fatalf("want an error wrapping %v, got %v", r.sentinel, err)
				}
				if got := Permanent(err); got != r.permanent {
					t.Fatalf("Permanent(%v) = %v, want %v", err, got, r.permanent)
				}
			})
		}
	}

	others := []row{
		{"too-large/minio", func(t *testing.T, _ Store) error {
			_, err := s3.Put(ctx, "huge", stream("a"), PutOptions{Size: 1 << 50, SHA256: sum([]byte("a"))})
			return err
		}, ErrTooLarge, true},
		{"name-too-long-for-the-file-system/dir", func(t *testing.T, _ Store) error {
			// a file system with shorter names than maxSegment refuses it itself
			return fsErr("placing", "k", &fs.PathError{Op: "link", Path: "k", Err: syscall.ENAMETOOLONG})
		}, naming.ErrBadKey, true},
		{"unreachable/minio", func(t *testing.T, _ Store) error {
			addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t)) // nothing listens there
			_, err = Open(ctx, Config{URL: "s3://" + testutil.BucketName(t), Endpoint: addr, Credentials: good})
			return err
		}, ErrUnreachable, false},
		{"no-bucket/minio", func(t *testing.T, _ Store) error {
			_, err := Open(ctx, Config{URL: "s3://no-such-bucket-here", Endpoint: m.Endpoint, Credentials: good})
			return err
		}, ErrNoBucket, false},
		{"no-bucket/dir", func(t *testing.T, _ Store) error {
			_, err := OpenDir(t.TempDir()+"/absent", false)
			return err
		}, ErrNoBucket, false},
		{"access/minio", func(t *testing.T, _ Store) error {
			_, err := Open(ctx, Config{URL: "s3://" + s3.bucket, Endpoint: m.Endpoint, Credentials: Credentials{AccessKey: m.AccessKey, SecretKey: "wrong-secret"}})
			return err
		}, ErrAccess, true},
		{"access-on-put/minio", func(t *testing.T, _ Store) error {
			// a store opened with good credentials that the server refuses later (a
			// rotated key): the upload itself gets ErrAccess
			bad, err := newS3(Config{URL: "s3://" + s3.bucket + "/p", Endpoint: m.Endpoint, Credentials: Credentials{AccessKey: m.AccessKey, SecretKey: "rotated-secret"}})
			if err != nil {
				t.Fatal(err)
			}
			_, err = bad.Put(ctx, "refused", strings.NewReader("a"), PutOptions{})
			return err
		}, ErrAccess, true},
		{"clock-skew/403", func(t *testing.T, _ Store) error {
			// a 403 that a correct clock cures is not refused credentials
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodHead {
					return // the bucket exists
				}
				w.Header().Set("Content-Type", "application/xml")
				w.WriteHeader(http.StatusForbidden)
				fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>RequestTimeTooSkewed</Code><Message>The difference between the request time and the server's time is too large.</Message></Error>`)
			}))
			defer srv.Close()
			st, err := Open(ctx, Config{URL: "s3://" + s3.bucket, Endpoint: srv.URL, Credentials: good, Region: "us-east-1"})
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = st.Get(ctx, "k")
			if err == nil || errors.Is(err, ErrAccess) {
				t.Fatalf("want an error that is not ErrAccess, got %v", err)
			}
			return err
		}, nil, false},
		{"bad-url/scheme", func(t *testing.T, _ Store) error {
			_, err := Open(ctx, Config{URL: "ftp://host/x", Endpoint: m.Endpoint, Credentials: good})
			return err
		}, ErrBadURL, true},
		{"bad-url/bucket", func(t *testing.T, _ Store) error {
			_, err := Open(ctx, Config{URL: "s3://My_Bucket/x", Endpoint: m.Endpoint, Credentials: good})
			return err
		}, ErrBadURL, true},
		{"bad-url/endpoint", func(t *testing.T, _ Store) error {
			_, err := Open(ctx, Config{URL: "s3://" + s3.bucket, Endpoint: "ftp://127.0.0.1:9", Credentials: good})
			return err
		}, ErrBadURL, true},
		{"server-error/5xx", func(t *testing.T, _ Store) error {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/xml")
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`)
			}))
			defer srv.Close()
			_, err := Open(ctx, Config{URL: "s3://" + s3.bucket, Endpoint: srv.URL, Credentials: good})
			var resp minio.ErrorResponse
			if !errors.As(err, &resp) || resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("want a 503 from the server, got %v", err)
			}
			return err
		}, nil, false},
		{"unknown", func(t *testing.T, _ Store) error { return errors.New("disk on fire") }, nil, false},
		{"nil", func(t *testing.T, _ Store) error { return nil }, nil, false},
		{"transient-wins", func(t *testing.T, _ Store) error {
			return fmt.Errorf("%w while %w", ErrExists, ErrUnreachable)
		}, ErrExists, false},
		{"transient-wins-over-access", func(t *testing.T, _ Store) error {
			return fmt.Errorf("%w while %w", ErrAccess, context.DeadlineExceeded)
		}, ErrAccess, false},
	}
	for _, r := range others {
		t.Run(r.name, func(t *testing.T) {
			err := r.err(t, nil)
			if r.sentinel != nil && !errors.Is(err, r.sentinel) {
				t.Fatalf("want an error wrapping %v, got %v", r.sentinel, err)
			}
			if got := Permanent(err); got != r.permanent {
				t.Fatalf("Permanent(%v) = %v, want %v", err, got, r.permanent)
			}
		})
	}
}

// TestS3Spool: a body of unknown size is staged in SpoolDir and removed afterwards,
// whether the Put succeeds, fails its checksum or is cancelled while spooling.
func TestS3Spool(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	s := openMinIO(t)
	empty := func(t *testing.T) {
		t.Helper()
		left, err := os.ReadDir(s.spoolDir)
		if err != nil || len(left) != 0 {
			t.Fatalf("spool folder holds %v (%v)", left, err)
		}
	}
	body := bytes.Repeat([]byte("spooled "), 1<<20)
	t.Run("stored", func(t *testing.T) {
		info, err := s.Put(ctx, "spool/ok", io.MultiReader(bytes.NewReader(body)), PutOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if info.SHA256 != sum(body) || info.Size != int64(len(body)) {
			t.Fatalf("info %+v", info)
		}
		if st, err := s.Stat(ctx, "spool/ok"); err != nil || st.SHA256 != sum(body) {
			t.Fatalf("stat = %+v, %v: the SHA-256 was not recorded", st, err)
		}
		empty(t)
	})
	t.Run("checksum", func(t *testing.T) {
		_, err := s.Put(ctx, "spool/bad", io.MultiReader(bytes.NewReader(body)), PutOptions{SHA256: sum([]byte("other"))})
		if !errors.Is(err, ErrChecksum) {
			t.Fatalf("want ErrChecksum, got %v", err)
		}
		if _, err := s.Stat(ctx, "spool/bad"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a mismatched put left an object: %v", err)
		}
		empty(t)
	})
	t.Run("cancelled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		_, err := s.Put(cctx, "spool/cancelled", &endless{afterFirst: cancel}, PutOptions{})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("want context.Canceled, got %v", err)
		}
		if _, err := s.Stat(ctx, "spool/cancelled"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a cancelled put left an object: %v", err)
		}
		empty(t)
	})
}

// endless is a body that never ends; it calls afterFirst once it has been read.
type endless struct {
	afterFirst func()
	read       bool
}

func (e *endless) Read(p []byte) (int, error) {
	if !e.read {
		e.read = true
		defer e.afterFirst()
	}
	clear(p)
	return len(p), nil
}
