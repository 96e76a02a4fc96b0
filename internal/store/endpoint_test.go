package store

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/testutil"
)

func TestParseEndpoint(t *testing.T) {
	const secret = "se/cr+et:Key"
	cases := []struct {
		in           string
		host         string
		secure       bool
		user, passwd string
		bad          bool
	}{
		{in: "127.0.0.1:9000", host: "127.0.0.1:9000"},
		{in: "http://minio:9000/", host: "minio:9000"},
		{in: "https://s3.example.com", host: "s3.example.com", secure: true},
		{in: "http://AKIA:" + secret + "@127.0.0.1:9000", host: "127.0.0.1:9000", user: "AKIA", passwd: secret},
		{in: "AKIA:" + secret + "@127.0.0.1:9000", host: "127.0.0.1:9000", user: "AKIA", passwd: secret},
		{in: "https://AKIA:p%40ss@[::1]:9000", host: "[::1]:9000", secure: true, user: "AKIA", passwd: "p@ss"},
		{in: "http://AKIA:" + secret + "@host:port", bad: true},
		{in: "ftp://AKIA:" + secret + "@host:21", bad: true},
		{in: "http://AKIA:" + secret + "@host:9000/path", bad: true},
		{in: "http://AKIA:" + secret + "@", bad: true},
	}
	for _, c := range cases {
		ep, err := parseEndpoint(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("parseEndpoint(%q) accepted it: %+v", redactEndpoint(c.in), ep)
			} else if strings.Contains(err.Error(), "cr+et") {
				t.Errorf("the error for %q shows the secret: %v", redactEndpoint(c.in), err)
			}
			continue
		}
		if err != nil {
			t.Errorf("parseEndpoint(%q): %v", redactEndpoint(c.in), err)
			continue
		}
		var user, passwd string
		if ep.user != nil {
			user = ep.user.Username()
			passwd, _ = ep.user.Password()
		}
		if ep.host != c.host || ep.secure != c.secure || user != c.user || passwd != c.passwd {
			t.Errorf("parseEndpoint(%q) = %s secure=%v user=%q, want %s secure=%v user=%q (and its secret)",
				redactEndpoint(c.in), ep.host, ep.secure, user, c.host, c.secure, c.user)
		}
		if strings.Contains(redactEndpoint(c.in), "cr+et") || strings.Contains(redactEndpoint(c.in), "p%40ss") {
			t.Errorf("redactEndpoint(…) = %s shows the secret", redactEndpoint(c.in))
		}
	}
}

// TestEndpointCredentials: credentials written into the endpoint URL serve as the
// store's credentials and never appear in an error or a String.
func TestEndpointCredentials(t *testing.T) {
	m := testutil.RequireMinIO(t)
	ctx := testutil.Context(t, time.Minute)
	isolateAWS(t) // no credentials but the URL's, and none asked of instance metadata
	bucket := testutil.BucketName(t)
	host := strings.TrimPrefix(strings.TrimPrefix(m.Endpoint, "http://"), "https://")
	withCreds := func(access, secret, host string) string { return "http://" + access + ":" + secret + "@" + host }
	noLeak := func(t *testing.T, secret string, texts ...string) {
		t.Helper()
		for _, s := range texts {
			if strings.Contains(s, secret) {
				t.Errorf("the secret shows in %q", s)
			}
		}
	}

	t.Run("taken-as-credentials", func(t *testing.T) {
		cfg := Config{URL: "s3://" + bucket, Endpoint: withCreds(m.AccessKey, m.SecretKey, host), CreateBucket: true}
		s, err := Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Put(ctx, "k", strings.NewReader("x"), PutOptions{}); err != nil {
			t.Fatal(err)
		}
		noLeak(t, m.SecretKey, s.String(), cfg.String())
	})
	t.Run("refused", func(t *testing.T) {
		const secret = "wrong-secret-4711"
		cfg := Config{URL: "s3://" + bucket, Endpoint: withCreds(m.AccessKey, secret, host)}
		_, err := Open(ctx, cfg)
		if !errors.Is(err, ErrAccess) {
			t.Fatalf("want ErrAccess, got %v", err)
		}
		noLeak(t, secret, err.Error(), cfg.String())
	})
	t.Run("unreachable", func(t *testing.T) {
		addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t)) // nothing listens there
		const secret = "unreachable-secret-4711"
		cfg := Config{URL: "s3://" + bucket, Endpoint: withCreds("user", secret, addr)}
		_, err := Open(ctx, cfg)
		if !errors.Is(err, ErrUnreachable) {
			t.Fatalf("want ErrUnreachable, got %v", err)
		}
		noLeak(t, secret, err.Error(), cfg.String())
	})
	t.Run("malformed", func(t *testing.T) {
		const secret = "mal/formed-secret"
		for _, ep := range []string{withCreds("user", secret, "host:port"), "ftp://user:" + secret + "@" + host, withCreds("user", secret, host+"/path")} {
			_, err := Open(ctx, Config{URL: "s3://" + bucket, Endpoint: ep})
			if err == nil {
				t.Fatalf("%s was accepted", redactEndpoint(ep))
			}
			noLeak(t, secret, err.Error())
		}
	})
	t.Run("conflicting", func(t *testing.T) {
		const secret = "conflicting-secret-4711"
		_, err := Open(ctx, Config{URL: "s3://" + bucket, Endpoint: withCreds(m.AccessKey, secret, host),
			Credentials: Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}})
		if err == nil {
			t.Fatal("credentials in the URL that differ from those given were accepted")
		}
		noLeak(t, secret, err.Error())
		noLeak(t, m.SecretKey, err.Error())
	})
	t.Run("in-the-store-url", func(t *testing.T) {
		const secret = "store/url-secret"
		for _, u := range []string{"s3://user:" + secret + "@" + bucket + "/p", "http://user:" + secret + "@" + host + "/" + bucket} {
			cfg := Config{URL: u, Endpoint: m.Endpoint}
			_, err := Open(ctx, cfg)
			if err == nil {
				t.Fatalf("%s was accepted", redactEndpoint(u))
			}
			noLeak(t, secret, err.Error(), cfg.String())
		}
	})
}
