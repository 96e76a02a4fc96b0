package store

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestCheckURL: what a store URL may be, checked with no I/O.
func TestCheckURL(t *testing.T) {
	cases := []struct {
		url string
		ok  bool
		why string // a part of the error's text
	}{
		{"s3://my-bucket", true, ""},
		{"s3://my-bucket/", true, ""},
		{"s3://my-bucket/runs/a", true, ""},
		{"s3://a.b-c/x", true, ""},
		{"/var/memsnap", true, ""},
		{"relative/folder", true, ""},
		{"file:///var/memsnap", true, ""},
		{"file://relative", true, ""},
		{"/tmp/a://b", true, ""}, // "://" further in: still a folder
		{"./ftp://x", true, ""},
		{"", false, "no store given"},
		{"s3://", false, "no bucket name"},
		{"s3:///x", false, "no bucket name"},
		{"s3://My_Bucket/x", false, `holds 'M'`},
		{"s3://ab/x", false, "3 to 63 characters"},
		{"s3://-bad-/x", false, "start and end with a letter or digit"},
		{"s3://a..b/x", false, `holds ".."`},
		{"s3://192.168.5.4/x", false, "formatted like an IP address"},
		{"s3://xn--bucket/x", false, `starts with "xn--"`},
		{"s3://bucket-s3alias/x", false, `ends with "-s3alias"`},
		{"s3://bucket/../x", false, "escapes its prefix"},
		{"s3://user:secret@bucket/x", false, "credentials do not belong"},
		{"ftp://host/x", false, `unsupported store URL scheme "ftp"`},
		{"http://host:9000/bucket", false, `unsupported store URL scheme "http"`},
		{"https://user:secret@host/bucket", false, `unsupported store URL scheme "https"`},
		{"gs://bucket/x", false, `unsupported store URL scheme "gs"`},
		{"S3://bucket/x", false, `unsupported store URL scheme "S3"`},
		{"file://ftp://x", false, `unsupported store URL scheme "ftp"`},
		{"file://", false, "no folder path"},
		{"s3:/bucket/x", false, "an S3 URL starts with s3://"},
		{"s3:bucket", false, "an S3 URL starts with s3://"},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.url, "/", "|"), func(t *testing.T) {
			err := CheckURL(c.url)
			if (err == nil) != c.ok {
				t.Fatalf("CheckURL(%q) = %v, want ok=%v", c.url, err, c.ok)
			}
			if err == nil {
				return
			}
			if !errors.Is(err, ErrBadURL) || !Permanent(err) {
				t.Fatalf("CheckURL(%q) = %v: want a permanent error wrapping ErrBadURL", c.url, err)
			}
			if !strings.Contains(err.Error(), c.why) {
				t.Fatalf("CheckURL(%q) = %q, want it to say %q", c.url, err, c.why)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("CheckURL(%q) = %q shows the secret", c.url, err)
			}
		})
	}
}

// TestBadURLNoRequest: Open and Check refuse a bad URL or endpoint before sending
// anything, and the error is permanent.
func TestBadURLNoRequest(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Setenv("S3_ENDPOINT_URL", "")
	t.Setenv("AWS_ENDPOINT_URL_S3", "")
	t.Setenv("AWS_ENDPOINT_URL", "")
	t.Setenv("MINIO_ENDPOINT", "")
	cases := []struct {
		name string
		cfg  Config
	}{
		{"ftp", Config{URL: "ftp://" + srv.Listener.Addr().String() + "/x", Endpoint: srv.URL}},
		{"no-bucket", Config{URL: "s3://", Endpoint: srv.URL}},
		{"upper-case-bucket", Config{URL: "s3://My_Bucket/x", Endpoint: srv.URL}},
		{"ip-bucket", Config{URL: "s3://127.0.0.1/x", Endpoint: srv.URL}},
		{"no-endpoint", Config{URL: "s3://bucket/x"}},
		{"endpoint-scheme", Config{URL: "s3://bucket/x", Endpoint: "ftp://" + srv.Listener.Addr().String()}},
		{"endpoint-path", Config{URL: "s3://bucket/x", Endpoint: srv.URL + "/bucket"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for what, open := range map[string]func(context.Context, Config) (Store, error){"Open": Open, "Check": Check} {
				st, err := open(ctx, c.cfg)
				if st != nil || !errors.Is(err, ErrBadURL) || !Permanent(err) {
					t.Fatalf("%s = %v, %v: want a permanent error wrapping ErrBadURL", what, st, err)
				}
			}
			if n := hits.Load(); n != 0 {
				t.Fatalf("the server got %d requests", n)
			}
		})
	}
}
