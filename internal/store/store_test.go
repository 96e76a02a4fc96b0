package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/naming"
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
		{"minio", func(t *testing.T) Store { return openMinIO(t) }},
		// Objects over 8 MiB take the path of those over 5 GiB: a multipart upload
		// whose completion is conditional.
		{"minio-multipart", func(t *testing.T) Store {
			s := openMinIO(t)
			s.singlePutMax = 8 << 20
			return s
		}},
	}
}

func openMinIO(t *testing.T) *S3 {
	m := testutil.RequireMinIO(t)
	s, err := OpenS3(testutil.Context(t, time.Minute), Config{
		URL: "s3://" + testutil.BucketName(t) + "/some/prefix", Endpoint: m.Endpoint,
		Credentials:  Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey},
		CreateBucket: true, PartSize: 5 << 20, SpoolDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
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
			t.Run("if-match", func(t *testing.T) {
				first, err := s.Put(ctx, "cm/a", strings.NewReader("one"), PutOptions{})
				if err != nil || first.ETag == "" {
					t.Fatalf("put: %+v %v", first, err)
				}
				rc, got, err := s.Get(ctx, "cm/a")
				if err != nil {
					t.Fatal(err)
				}
				rc.Close()
				if st, err := s.Stat(ctx, "cm/a"); err != nil || st.ETag != first.ETag || got.ETag != first.ETag {
					t.Fatalf("versions: put %q, get %q, stat %+v %v", first.ETag, got.ETag, st, err)
				}
				second, err := s.Put(ctx, "cm/a", strings.NewReader("two"), PutOptions{IfMatch: first.ETag})
				if err != nil || second.ETag == "" || second.ETag == first.ETag {
					t.Fatalf("replace of the version read: %+v %v", second, err)
				}
				if _, err := s.Put(ctx, "cm/a", strings.NewReader("three"), PutOptions{IfMatch: first.ETag}); !errors.Is(err, ErrChanged) || !Permanent(err) {
					t.Fatalf("replace of an old version: want ErrChanged, got %v", err)
				}
				if b, _ := ReadAll(ctx, s, "cm/a"); string(b) != "two" {
					t.Fatalf("a refused replace changed the object: %q", b)
				}
				if _, err := s.Put(ctx, "cm/missing", strings.NewReader("x"), PutOptions{IfMatch: first.ETag}); !errors.Is(err, ErrChanged) {
					t.Fatalf("replace of a missing object: want ErrChanged, got %v", err)
				}
				if _, err := s.Stat(ctx, "cm/missing"); !errors.Is(err, ErrNotFound) {
					t.Fatalf("a refused replace left an object: %v", err)
				}
				// of writers racing to replace one version, one wins
				var wg sync.WaitGroup
				var mu sync.Mutex
				won := 0
				for i := 0; i < 8; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						_, err := s.Put(ctx, "cm/a", strings.NewReader(fmt.Sprintf("writer %d", i)), PutOptions{IfMatch: second.ETag})
						switch {
						case err == nil:
							mu.Lock()
							won++
							mu.Unlock()
						case !errors.Is(err, ErrChanged):
							t.Errorf("writer %d: %v", i, err)
						}
					}()
				}
				wg.Wait()
				if won != 1 {
					t.Fatalf("%d of 8 writers replaced one version", won)
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
				long := strings.Repeat("k", naming.MaxKeyLen+1)
				segment := "run/" + strings.Repeat("s", 300) + "/rank0" // too long for a file name
				for _, k := range []string{"../escape", "a/../../b", "", "x\x00y", long, segment} {
					_, err := s.Put(ctx, k, strings.NewReader("x"), PutOptions{})
					if !errors.Is(err, naming.ErrBadKey) || !Permanent(err) {
						t.Errorf("put %.30q: want a permanent error wrapping naming.ErrBadKey, got %v", k, err)
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
		addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t)) // nothing listens there
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
	absent := t.TempDir() + "/absent"
	_, err := OpenDir(absent, false)
	if !errors.Is(err, ErrNoBucket) {
		t.Fatalf("want ErrNoBucket, got %v", err)
	}
	// a folder store is no bucket: the text names the folder and what to do
	want := "the store folder " + absent + " does not exist (create it, or pass "
	if msg := err.Error(); !strings.Contains(msg, want) || strings.Contains(msg, "bucket") {
		t.Fatalf("error %q: want it to say %q, and no bucket", msg, want)
	}
	if _, err := Open(context.Background(), Config{URL: absent}); err == nil || !errors.Is(err, ErrNoBucket) || strings.Contains(err.Error(), "bucket") {
		t.Fatalf("Open of a missing folder: %v", err)
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

// TestPutOneWinner races writers of different content to one key without Overwrite:
// exactly one may succeed, the others get ErrExists, and the stored object is the
// winner's, byte for byte.
func TestPutOneWinner(t *testing.T) {
	const writers = 4
	cases := []struct {
		name     string
		size     int
		seekable bool // a bytes.Reader (hashed up front) or a plain stream
		known    bool // PutOptions.Size given
	}{
		{"1MB", 1 << 20, true, true},
		{"40MB", 40 << 20, true, true},
		{"40MB-stream", 40 << 20, false, true},
		{"unknown-size", 40 << 20, false, false},
	}
	for _, o := range openers(t) {
		t.Run(o.name, func(t *testing.T) {
			ctx := testutil.Context(t, 5*time.Minute)
			s := o.open(t)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					bodies := make([][]byte, writers)
					for i := range bodies {
						bodies[i] = make([]byte, c.size)
						rand.Read(bodies[i])
					}
					key := "race/" + c.name
					start := make(chan struct{})
					errs := make([]error, writers)
					infos := make([]ObjectInfo, writers)
					var wg sync.WaitGroup
					for i := range writers {
						wg.Add(1)
						go func() {
							defer wg.Done()
							var r io.Reader = bytes.NewReader(bodies[i])
							if !c.seekable {
								r = io.MultiReader(r) // hides Seek and ReadAt
							}
							opts := PutOptions{}
							if c.known {
								opts.Size = int64(c.size)
							}
							<-start
							infos[i], errs[i] = s.Put(ctx, key, r, opts)
						}()
					}
					close(start)
					wg.Wait()
					winner := -1
					for i, err := range errs {
						switch {
						case err == nil && winner >= 0:
							t.Errorf("writers %d and %d both succeeded", winner, i)
						case err == nil:
							winner = i
						case !errors.Is(err, ErrExists):
							t.Errorf("writer %d: want ErrExists, got %v", i, err)
						}
					}
					if winner < 0 {
						t.Fatalf("no writer succeeded: %v", errs)
					}
					want := sum(bodies[winner])
					if infos[winner].SHA256 != want || infos[winner].Size != int64(c.size) {
						t.Errorf("winner's info %+v, want sha256 %s and %d bytes", infos[winner], want, c.size)
					}
					got, err := ReadAll(ctx, s, key)
					if err != nil {
						t.Fatal(err)
					}
					if sum(got) != want {
						t.Fatalf("stored object (%d bytes, sha256 %s) is not the winner's (writer %d, %s)", len(got), sum(got), winner, want)
					}
					if st, err := s.Stat(ctx, key); err != nil || st.SHA256 != want {
						t.Fatalf("stat = %+v, %v; want sha256 %s", st, err, want)
					}
				})
			}
		})
	}
}
