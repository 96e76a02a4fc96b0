package store

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/memsnap/memsnap/internal/testutil"
)

// TestAWSSettings runs the AWS tools' settings against a real MinIO serving TLS
// with a certificate authority of the test's own: the endpoint from
// AWS_ENDPOINT_URL, the authority from AWS_CA_BUNDLE, and credentials from a
// shared credentials file's profile and from a container credentials endpoint
// handing out MinIO's temporary STS credentials.
func TestAWSSettings(t *testing.T) {
	files := testutil.NewTLSFiles(t)
	m := testutil.StartMinIOTLS(t, files)
	ctx := testutil.Context(t, 2*time.Minute)
	testutil.Eventually(t, time.Minute, "MinIO's STS to answer", func() bool {
		_, err := assumeRole(ctx, m, files)
		return err == nil
	})
	// setting is the environment of a user of that MinIO who names nothing but
	// the store's URL.
	setting := func(t *testing.T) {
		isolateAWS(t)
		t.Setenv("AWS_ENDPOINT_URL", m.Endpoint)
		t.Setenv("AWS_CA_BUNDLE", files.CAFile)
	}

	t.Run("ca-bundle", func(t *testing.T) {
		setting(t)
		t.Setenv("AWS_ACCESS_KEY_ID", m.AccessKey)
		t.Setenv("AWS_SECRET_ACCESS_KEY", m.SecretKey)
		roundTrip(ctx, t, Config{URL: "s3://" + testutil.BucketName(t) + "/runs", CreateBucket: true})

		other := testutil.NewTLSFiles(t) // an authority that did not sign MinIO's certificate
		for name, bundle := range map[string]string{"other-authority": other.CAFile, "system-roots": ""} {
			t.Setenv("AWS_CA_BUNDLE", bundle)
			_, err := Open(ctx, Config{URL: "s3://" + testutil.BucketName(t), CreateBucket: true})
			if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "certificate") {
				t.Errorf("%s: want the certificate refused, got %v", name, err)
			}
		}
	})

	t.Run("profiles", func(t *testing.T) {
		setting(t)
		p := filepath.Join(t.TempDir(), "credentials")
		text := "[wrong]\naws_access_key_id = " + m.AccessKey + "\naws_secret_access_key = not-the-secret\n\n" +
			"[right]\naws_access_key_id = " + m.AccessKey + "\naws_secret_access_key = " + m.SecretKey + "\n"
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("AWS_SHARED_CREDENTIALS_FILE", p)
		t.Setenv("AWS_PROFILE", "right")
		bucket := testutil.BucketName(t)
		roundTrip(ctx, t, Config{URL: "s3://" + bucket, CreateBucket: true})
		t.Setenv("AWS_PROFILE", "wrong")
		if _, err := Open(ctx, Config{URL: "s3://" + bucket}); !errors.Is(err, ErrAccess) {
			t.Errorf("AWS_PROFILE=wrong: want ErrAccess, got %v", err)
		}
		if _, err := Open(ctx, Config{URL: "s3://" + bucket, Profile: "right"}); err != nil {
			t.Errorf("Config.Profile over AWS_PROFILE: %v", err)
		}
	})

	t.Run("container-sts", func(t *testing.T) {
		setting(t)
		var handed atomic.Int64
		srv := httptest.NewServer(containerCredentials(t, m, files, &handed, true))
		defer srv.Close()
		t.Setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", srv.URL+"/creds")
		roundTrip(ctx, t, Config{URL: "s3://" + testutil.BucketName(t), CreateBucket: true})
		if handed.Load() == 0 {
			t.Fatal("the container credentials endpoint was never asked")
		}

		// the same credentials without their session token are refused: the
		// store sent the token
		bare := httptest.NewServer(containerCredentials(t, m, files, &handed, false))
		defer bare.Close()
		t.Setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", bare.URL+"/creds")
		if _, err := Open(ctx, Config{URL: "s3://" + testutil.BucketName(t), CreateBucket: true}); !errors.Is(err, ErrAccess) {
			t.Errorf("temporary credentials without their token: want ErrAccess, got %v", err)
		}
	})
}

// roundTrip opens cfg's store and writes, reads and lists an object in it.
func roundTrip(ctx context.Context, t *testing.T, cfg Config) {
	t.Helper()
	s, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Put(ctx, "w1/rank0.pickle", strings.NewReader("snapshot"), PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadAll(ctx, s, "w1/rank0.pickle"); err != nil || string(b) != "snapshot" {
		t.Fatalf("read back %q, %v", b, err)
	}
	if objs, err := s.List(ctx, "w1/"); err != nil || len(objs) != 1 {
		t.Fatalf("listed %v, %v", objs, err)
	}
}

// containerCredentials serves what an ECS or EKS credentials endpoint does:
// temporary credentials, here from MinIO's STS (AssumeRole with the root
// user's keys), without their session token unless withToken. It counts the
// credentials it hands out in handed.
func containerCredentials(t *testing.T, m *testutil.MinIOServer, files testutil.TLSFiles, handed *atomic.Int64, withToken bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := assumeRole(r.Context(), m, files)
		if err != nil || v.SessionToken == "" || v.AccessKeyID == m.AccessKey {
			t.Errorf("MinIO's AssumeRole gave key %q with token %v: %v", v.AccessKeyID, v.SessionToken != "", err)
			http.Error(w, "no STS credentials", http.StatusInternalServerError)
			return
		}
		if !withToken {
			v.SessionToken = ""
		}
		handed.Add(1)
		json.NewEncoder(w).Encode(map[string]string{"AccessKeyId": v.AccessKeyID, "SecretAccessKey": v.SecretAccessKey,
			"Token": v.SessionToken, "Expiration": v.Expiration.UTC().Format(time.RFC3339)})
	})
}

// assumeRole asks MinIO's STS for temporary credentials with the root user's keys.
func assumeRole(ctx context.Context, m *testutil.MinIOServer, files testutil.TLSFiles) (credentials.Value, error) {
	tr, err := transport(true, files.CAFile)
	if err != nil {
		return credentials.Value{}, err
	}
	defer tr.CloseIdleConnections()
	sts := &credentials.STSAssumeRole{Client: &http.Client{Transport: tr}, STSEndpoint: m.Endpoint,
		Options: credentials.STSAssumeRoleOptions{AccessKey: m.AccessKey, SecretKey: m.SecretKey, DurationSeconds: 900}}
	return sts.RetrieveWithCredContext(&credentials.CredContext{Context: ctx})
}
