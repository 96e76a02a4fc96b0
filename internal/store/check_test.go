package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/testutil"
)

// TestCheckS3 asks a real MinIO each of the questions Check tells apart.
func TestCheckS3(t *testing.T) {
	m := testutil.RequireMinIO(t)
	ctx := testutil.Context(t, time.Minute)
	good := Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}
	bucket := testutil.BucketName(t)
	if _, err := Open(ctx, Config{URL: "s3://" + bucket, Endpoint: m.Endpoint, Credentials: good, CreateBucket: true}); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, cfg Config, sentinel error, permanent bool) error {
		t.Helper()
		st, err := Check(ctx, cfg)
		if !errors.Is(err, sentinel) {
			t.Fatalf("Check = %v, want an error wrapping %v", err, sentinel)
		}
		if st != nil {
			t.Fatalf("Check returned a store (%v) with its error", st)
		}
		if got := Permanent(err); got != permanent {
			t.Fatalf("Permanent(%v) = %v, want %v", err, got, permanent)
		}
		return err
	}

	t.Run("ok", func(t *testing.T) {
		st, err := Check(ctx, Config{URL: "s3://" + bucket + "/p", Endpoint: m.Endpoint, Credentials: good})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Put(ctx, "k", strings.NewReader("x"), PutOptions{}); err != nil {
			t.Fatalf("the checked store does not take a put: %v", err)
		}
	})
	t.Run("wrong-secret", func(t *testing.T) {
		const secret = "not-the-secret-4711"
		err := check(t, Config{URL: "s3://" + bucket, Endpoint: m.Endpoint, Credentials: Credentials{AccessKey: m.AccessKey, SecretKey: secret}}, ErrAccess, true)
		if strings.Contains(err.Error(), secret) {
			t.Fatalf("the secret shows in %q", err)
		}
	})
	t.Run("unknown-key", func(t *testing.T) {
		check(t, Config{URL: "s3://" + bucket, Endpoint: m.Endpoint, Credentials: Credentials{AccessKey: "nobody", SecretKey: "whatever1"}}, ErrAccess, true)
	})
	t.Run("missing-bucket", func(t *testing.T) {
		check(t, Config{URL: "s3://" + bucket + "-absent/p", Endpoint: m.Endpoint, Credentials: good}, ErrNoBucket, false)
	})
	t.Run("missing-bucket-created", func(t *testing.T) {
		cfg := Config{URL: "s3://" + bucket + "-made/p", Endpoint: m.Endpoint, Credentials: good, CreateBucket: true}
		if _, err := Check(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		cfg.CreateBucket = false
		if _, err := Check(ctx, cfg); err != nil {
			t.Fatalf("the bucket Check created is not there: %v", err)
		}
	})
	t.Run("stopped-endpoint", func(t *testing.T) {
		addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t)) // nothing listens there
		check(t, Config{URL: "s3://" + bucket, Endpoint: "http://" + addr, Credentials: good}, ErrUnreachable, false)
	})
	t.Run("silent-endpoint", func(t *testing.T) {
		// accepts connections and never answers: only the time limit ends the check
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		defer func() { ln.Close(); <-done }()
		go func() {
			defer close(done)
			var conns []net.Conn
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				conns = append(conns, c)
			}
		}()
		err = check(t, Config{URL: "s3://" + bucket, Endpoint: "http://" + ln.Addr().String(), Credentials: good, CheckTimeout: 300 * time.Millisecond}, ErrUnreachable, false)
		if !strings.Contains(err.Error(), "did not answer within 300ms") {
			t.Fatalf("want the error to name the time limit, got %q", err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := Check(cctx, Config{URL: "s3://" + bucket, Endpoint: m.Endpoint, Credentials: good})
		if !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnreachable) || Permanent(err) {
			t.Fatalf("a cancelled check: want a transient context.Canceled, got %v", err)
		}
	})
	t.Run("bad-bucket-name", func(t *testing.T) {
		check(t, Config{URL: "s3://" + strings.ToUpper(bucket), Endpoint: m.Endpoint, Credentials: good}, ErrBadURL, true)
	})
}

// TestCheckDir checks folder stores: one that can be written, one that is missing,
// one that cannot be written, and a path that is a file.
func TestCheckDir(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	t.Run("writable", func(t *testing.T) {
		root := t.TempDir()
		st, err := Check(ctx, Config{URL: root})
		if err != nil {
			t.Fatal(err)
		}
		if left, _ := os.ReadDir(root); len(left) != 0 {
			t.Fatalf("Check left %v behind", left)
		}
		if _, err := st.Put(ctx, "k", strings.NewReader("x"), PutOptions{}); err != nil {
			t.Fatalf("the checked store does not take a put: %v", err)
		}
	})
	t.Run("file-url", func(t *testing.T) {
		if _, err := Check(ctx, Config{URL: "file://" + t.TempDir()}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("missing", func(t *testing.T) {
		st, err := Check(ctx, Config{URL: filepath.Join(t.TempDir(), "absent")})
		if !errors.Is(err, ErrNoBucket) || Permanent(err) || st != nil {
			t.Fatalf("Check = %v, %v: want a transient ErrNoBucket", st, err)
		}
	})
	t.Run("missing-created", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), "a", "b")
		if _, err := Check(ctx, Config{URL: root, CreateBucket: true}); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
			t.Fatalf("Check did not create the folder: %v", err)
		}
	})
	t.Run("a-file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if st, err := Check(ctx, Config{URL: f}); err == nil || st != nil {
			t.Fatalf("Check(a file) = %v, %v: want an error", st, err)
		}
	})
	t.Run("unwritable", func(t *testing.T) {
		// root writes through any mode bits, so there is nothing to refuse it
		if os.Geteuid() == 0 {
			t.Skip("running as root, which can write to a folder of mode 0500")
		}
		root := filepath.Join(t.TempDir(), "ro")
		if err := os.Mkdir(root, 0o500); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(root, 0o700) })
		st, err := Check(ctx, Config{URL: root})
		if !errors.Is(err, ErrAccess) || !Permanent(err) || st != nil {
			t.Fatalf("Check = %v, %v: want a permanent ErrAccess", st, err)
		}
		// nor can a folder be created inside it
		_, err = Check(ctx, Config{URL: filepath.Join(root, "sub"), CreateBucket: true})
		if !errors.Is(err, ErrAccess) || !Permanent(err) {
			t.Fatalf("creating a folder in a 0500 one: want a permanent ErrAccess, got %v", err)
		}
	})
}
