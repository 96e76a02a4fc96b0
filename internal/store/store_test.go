package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/testutil"
)

type opener struct {
	name string
	open func(t *testing.T) Store
}

func openers(t *testing.T) []opener {
	return []opener{
		{"dir", func(t *testing.T) Store {
			d, err := OpenDir(t.TempDir(), false)
			if err != nil {
				t.Fatal(err)
			}
			return d
		}},
		{"minio", func(t *testing.T) Store {
			m := testutil.RequireMinIO(t)
			s, err := Open(testutil.Context(t, time.Minute), Config{
				URL: "s3://" + testutil.BucketName(t) + "/some/prefix", Endpoint: m.Endpoint,
				Credentials:  Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey},
				CreateBucket: true, PartSize: 5 << 20,
			})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}},
	}
}

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

// TestStores runs one table against both implementations.
func TestStores(t *testing.T) {
	big := make([]byte, 12<<20+123) // more than two 5 MiB parts: a multipart upload on S3
	rand.Read(big)
	for _, o := range openers(t) {
		t.Run(o.name, func(t *testing.T) {
			ctx := testutil.Context(t, 2*time.Minute)
			s := o.open(t)

			t.Run("put-get-stat", func(t *testing.T) {
				body := []byte("hello, rank 3")
				info, err := s.Put(ctx, "run/rank3.5.memory_snapshot.pickle", bytes.NewReader(body), PutOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if info.Size != int64(len(body)) || info.SHA256 != sum(body) {
					t.Fatalf("put info %+v", info)
				}
				got, err := ReadAll(ctx, s, "/run/rank3.5.memory_snapshot.pickle")
				if err != nil || !bytes.Equal(got, body) {
					t.Fatalf("get = %q, %v", got, err)
				}
				st, err := s.Stat(ctx, "run/rank3.5.memory_snapshot.pickle")
				if err != nil || st.SHA256 != sum(body) || st.Size != int64(len(body)) {
					t.Fatalf("stat = %+v, %v", st, err)
				}
			})
			t.Run("overwrite-refused", func(t *testing.T) {
				if _, err := s.Put(ctx, "ow/a", strings.NewReader("one"), PutOptions{}); err != nil {
					t.Fatal(err)
				}
				_, err := s.Put(ctx, "ow/a", strings.NewReader("two"), PutOptions{})
				if !errors.Is(err, ErrExists) {
					t.Fatalf("second put: want ErrExists, got %v", err)
				}
				if got, _ := ReadAll(ctx, s, "ow/a"); string(got) != "one" {
					t.Fatalf("refused put changed the object: %q", got)
				}
				if _, err := s.Put(ctx, "ow/a", strings.NewReader("three"), PutOptions{Overwrite: true}); err != nil {
					t.Fatal(err)
				}
				if got, _ := ReadAll(ctx, s, "ow/a"); string(got) != "three" {
					t.Fatalf("overwrite did not replace: %q", got)
				}
			})
			t.Run("multipart-streaming", func(t *testing.T) {
				// a plain reader (not seekable, size unknown) streams in parts
				info, err := s.Put(ctx, "big/obj", io.MultiReader(bytes.NewReader(big)), PutOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if info.SHA256 != sum(big) || info.Size != int64(len(big)) {
					t.Fatalf("info %+v", info)
				}
				got, err := ReadAll(ctx, s, "big/obj")
				if err != nil || !bytes.Equal(got, big) {
					t.Fatalf("big object did not come back whole (%d bytes, %v)", len(got), err)
				}
				_, err = s.Put(ctx, "big/obj", io.MultiReader(bytes.NewReader(big)), PutOptions{})
				if !errors.Is(err, ErrExists) {
					t.Fatalf("multipart overwrite: want ErrExists, got %v", err)
				}
			})
			t.Run("checksum-mismatch", func(t *testing.T) {
				_, err := s.Put(ctx, "cs/x", strings.NewReader("data"), PutOptions{SHA256: sum([]byte("other"))})
				if !errors.Is(err, ErrChecksum) {
					t.Fatalf("want ErrChecksum, got %v", err)
				}
				if _, err := s.Stat(ctx, "cs/x"); !errors.Is(err, ErrNotFound) {
					t.Fatalf("a mismatched put must leave nothing, stat says %v", err)
				}
			})
			t.Run("list", func(t *testing.T) {
				for _, k := range []string{"ls/a/rank0", "ls/a/rank1", "ls/b/rank0", "lsx"} {
					if _, err := s.Put(ctx, k, strings.NewReader(k), PutOptions{Overwrite: true}); err != nil {
						t.Fatal(err)
					}
				}
				got, err := s.List(ctx, "ls/a/")
				if err != nil {
					t.Fatal(err)
				}
				var keys []string
				for _, o := range got {
					keys = append(keys, o.Key)
				}
				if strings.Join(keys, ",") != "ls/a/rank0,ls/a/rank1" {
					t.Fatalf("list ls/a/ = %v", keys)
				}
				got, _ = s.List(ctx, "ls")
				if len(got) != 4 {
					t.Fatalf("list ls = %v", got)
				}
			})
			t.Run("not-found", func(t *testing.T) {
				if _, _, err := s.Get(ctx, "nope"); !errors.Is(err, ErrNotFound) {
					t.Fatalf("get: want ErrNotFound, got %v", err)
				}
				if _, err := s.Stat(ctx, "nope"); !errors.Is(err, ErrNotFound) {
					t.Fatalf("stat: want ErrNotFound, got %v", err)
				}
			})
			t.Run("bad-keys", func(t *testing.T) {
				for _, k := range []string{"../escape", "a/../../b", "", "x\x00y"} {
					if _, err := s.Put(ctx, k, strings.NewReader("x"), PutOptions{}); err == nil {
						t.Errorf("put %q was accepted", k)
					}
				}
			})
			t.Run("delete", func(t *testing.T) {
				s.Put(ctx, "del/x", strings.NewReader("x"), PutOptions{})
				if err := s.Delete(ctx, "del/x"); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Stat(ctx, "del/x"); !errors.Is(err, ErrNotFound) {
					t.Fatalf("after delete: %v", err)
				}
				if err := s.Delete(ctx, "del/x"); err != nil {
					t.Fatalf("deleting a missing key: %v", err)
				}
			})
		})
	}
}

func TestS3Errors(t *testing.T) {
	m := testutil.RequireMinIO(t)
	ctx := testutil.Context(t, time.Minute)
	good := Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}
	bucket := testutil.BucketName(t)
	if _, err := Open(ctx, Config{URL: "s3://" + bucket, Endpoint: m.Endpoint, Credentials: good, CreateBucket: true}); err != nil {
		t.Fatal(err)
	}
	t.Run("missing-bucket", func(t *testing.T) {
		_, err := Open(ctx, Config{URL: "s3://no-such-bucket-here/x", Endpoint: m.Endpoint, Credentials: good})
		if !errors.Is(err, ErrNoBucket) {
			t.Fatalf("want ErrNoBucket, got %v", err)
		}
	})
	t.Run("bad-credentials", func(t *testing.T) {
		bad := Credentials{AccessKey: m.AccessKey, SecretKey: "not-the-secret-at-all"}
		_, err := Open(ctx, Config{URL: "s3://" + bucket, Endpoint: m.Endpoint, Credentials: bad})
		if !errors.Is(err, ErrAccess) {
			t.Fatalf("want ErrAccess, got %v", err)
		}
		if strings.Contains(err.Error(), "not-the-secret-at-all") {
			t.Fatalf("the secret leaked into the error: %v", err)
		}
		_, err = Open(ctx, Config{URL: "s3://" + bucket, Endpoint: m.Endpoint, Credentials: Credentials{AccessKey: "nobody", SecretKey: "whatever1"}})
		if !errors.Is(err, ErrAccess) {
			t.Fatalf("unknown key: want ErrAccess, got %v", err)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		l, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := l.Addr().String()
		l.Close() // nothing listens there now
		_, err := Open(ctx, Config{URL: "s3://" + bucket, Endpoint: "http://" + addr, Credentials: good})
		if !errors.Is(err, ErrUnreachable) {
			t.Fatalf("want ErrUnreachable, got %v", err)
		}
	})
	t.Run("credentials-from-env", func(t *testing.T) {
		t.Setenv("AWS_ACCESS_KEY_ID", m.AccessKey)
		t.Setenv("AWS_SECRET_ACCESS_KEY", m.SecretKey)
		t.Setenv("S3_ENDPOINT_URL", m.Endpoint)
		if _, err := Open(ctx, Config{URL: "s3://" + bucket}); err != nil {
			t.Fatal(err)
		}
	})
}

func TestDirMissingRoot(t *testing.T) {
	_, err := OpenDir(t.TempDir()+"/absent", false)
	if !errors.Is(err, ErrNoBucket) {
		t.Fatalf("want ErrNoBucket, got %v", err)
	}
	if _, err := OpenDir(t.TempDir()+"/absent", true); err != nil {
		t.Fatal(err)
	}
}

func TestCredentialsNeverPrint(t *testing.T) {
	c := Credentials{AccessKey: "AKIAEXAMPLE", SecretKey: "supersecret"}
	if s := c.String(); strings.Contains(s, "supersecret") || strings.Contains(s, "AKIAEXAMPLE") {
		t.Fatalf("Credentials.String leaks: %s", s)
	}
	_ = context.Background()
}
