package store

import (
	"errors"
	"fmt"
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

// awsEnv are the variables the endpoint, the credential chain and the CA
// bundle read.
var awsEnv = []string{"S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_STS", "MINIO_ENDPOINT",
	"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SECRET_KEY",
	"AWS_SESSION_TOKEN", "MINIO_ACCESS_KEY", "MINIO_SECRET_KEY", "MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD",
	"AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
	"AWS_ROLE_SESSION_NAME", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
	"AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_EC2_METADATA_SERVICE_ENDPOINT",
	"AWS_CA_BUNDLE", "SSL_CERT_FILE"}

// isolateAWS clears every variable in awsEnv, points HOME at an empty folder
// (no ~/.aws) and turns instance metadata off, so that only what the test sets
// is found and no request leaves the machine.
func isolateAWS(t *testing.T) {
	for _, v := range awsEnv {
		t.Setenv(v, "")
	}
	t.Setenv("HOME", t.TempDir())
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

// TestRegionEndpoint: with no endpoint given, the AWS tools' variables name it,
// the S3-specific one first, and with none of them it is AWS S3 in the region
// over https. Only the resolved endpoint is looked at: no request is made.
func TestRegionEndpoint(t *testing.T) {
	cases := []struct {
		name   string
		env    map[string]string
		region string // Config.Region (--region)
		want   string // the client's endpoint URL; "" for ErrBadURL
	}{
		{"region", map[string]string{"AWS_REGION": "us-east-1"}, "", "https://s3.us-east-1.amazonaws.com"},
		{"default-region", map[string]string{"AWS_DEFAULT_REGION": "eu-west-3"}, "", "https://s3.eu-west-3.amazonaws.com"},
		{"flag-region", map[string]string{"AWS_REGION": "us-east-1"}, "ap-south-1", "https://s3.ap-south-1.amazonaws.com"},
		{"china", map[string]string{"AWS_REGION": "cn-north-1"}, "", "https://s3.cn-north-1.amazonaws.com.cn"},
		{"endpoint-url", map[string]string{"AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}, "", "http://127.0.0.1:9000"},
		{"s3-first", map[string]string{"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ENDPOINT_URL_S3": "https://127.0.0.1:9001"}, "", "https://127.0.0.1:9001"},
		{"project-first", map[string]string{"S3_ENDPOINT_URL": "http://127.0.0.1:9002", "AWS_ENDPOINT_URL_S3": "https://127.0.0.1:9001"}, "", "http://127.0.0.1:9002"},
		{"none", nil, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			isolateAWS(t)
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			s, err := newS3(Config{URL: "s3://some-bucket/runs", Region: c.region})
			if c.want == "" {
				if !errors.Is(err, ErrBadURL) || !strings.Contains(err.Error(), "AWS_REGION") {
					t.Fatalf("want ErrBadURL naming AWS_REGION, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := strings.TrimSuffix(s.client.EndpointURL().String(), "/"); got != c.want {
				t.Errorf("endpoint %s, want %s", got, c.want)
			}
		})
	}
}

// TestNoCredentials: with nothing configured the error names every source the
// chain looked in and is neither "access denied" nor a request to the
// endpoint; instance metadata is asked (here a fake on loopback) unless it is
// turned off.
func TestNoCredentials(t *testing.T) {
	var s3Hits, imdsHits atomic.Int64
	s3 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s3Hits.Add(1)
		w.WriteHeader(http.StatusForbidden)
	}))
	defer s3.Close()
	imds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		imdsHits.Add(1)
		http.NotFound(w, r)
	}))
	defer imds.Close()
	ctx := testutil.Context(t, time.Minute)

	for _, metadata := range []bool{true, false} {
		imdsHits.Store(0)
		isolateAWS(t)
		if metadata {
			t.Setenv("AWS_EC2_METADATA_DISABLED", "")
			t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.URL)
		}
		_, err := Check(ctx, Config{URL: "s3://some-bucket/runs", Endpoint: s3.URL})
		if !errors.Is(err, ErrNoCredentials) || !Permanent(err) {
			t.Fatalf("metadata %v: want a permanent ErrNoCredentials, got %v", metadata, err)
		}
		msg := err.Error()
		t.Log(msg)
		for _, want := range []string{"no S3 credentials found (looked in: ", "AWS_ACCESS_KEY_ID", "MINIO_ROOT_USER",
			"shared credentials file " + filepath.Join(os.Getenv("HOME"), ".aws", "credentials"), `profile "default"`,
			"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "instance metadata"} {
			if !strings.Contains(msg, want) {
				t.Errorf("metadata %v: the error does not say %q: %s", metadata, want, msg)
			}
		}
		if strings.Contains(msg, "access denied") {
			t.Errorf("the error says access denied: %s", msg)
		}
		if metadata != (imdsHits.Load() > 0) {
			t.Errorf("metadata %v: instance metadata asked %d times", metadata, imdsHits.Load())
		}
	}
	if s3Hits.Load() != 0 {
		t.Errorf("the endpoint got %d requests with no credentials to sign them", s3Hits.Load())
	}
}

// TestChainOrder: the environment comes before the shared file, a named profile
// must exist, and temporary credentials from instance metadata carry their
// session token.
func TestChainOrder(t *testing.T) {
	retrieve := func(t *testing.T) (credentials.Value, error) {
		t.Helper()
		return newChain("", "", http.DefaultTransport).RetrieveWithCredContext(nil)
	}
	file := func(t *testing.T) {
		t.Helper()
		p := filepath.Join(t.TempDir(), "credentials")
		if err := os.WriteFile(p, []byte("[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = filesecret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("AWS_SHARED_CREDENTIALS_FILE", p)
	}
	t.Run("env-before-file", func(t *testing.T) {
		isolateAWS(t)
		file(t)
		t.Setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
		if v, err := retrieve(t); err != nil || v.AccessKeyID != "ENVKEY" {
			t.Fatalf("got %q, %v; want the environment's", v.AccessKeyID, err)
		}
	})
	t.Run("file", func(t *testing.T) {
		isolateAWS(t)
		file(t)
		if v, err := retrieve(t); err != nil || v.AccessKeyID != "FILEKEY" {
			t.Fatalf("got %q, %v; want the file's", v.AccessKeyID, err)
		}
	})
	for _, withFile := range []bool{true, false} {
		t.Run(fmt.Sprintf("named-profile-missing-file-%v", withFile), func(t *testing.T) {
			isolateAWS(t)
			if withFile {
				file(t)
			}
			t.Setenv("AWS_PROFILE", "nosuch")
			t.Setenv("AWS_EC2_METADATA_DISABLED", "")
			t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:1") // must not be asked
			_, err := retrieve(t)
			if !errors.Is(err, ErrNoCredentials) || !strings.Contains(err.Error(), `profile "nosuch"`) || strings.Contains(err.Error(), "instance metadata") {
				t.Fatalf("want ErrNoCredentials ending at the profile, got %v", err)
			}
			t.Log(err)
		})
	}
	t.Run("container-endpoint-down", func(t *testing.T) {
		isolateAWS(t)
		down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}))
		defer down.Close()
		t.Setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", down.URL+"/creds")
		_, err := Check(testutil.Context(t, time.Minute), Config{URL: "s3://some-bucket", Endpoint: "http://127.0.0.1:1"})
		if !errors.Is(err, ErrNoCredentials) || !errors.Is(err, ErrUnreachable) || Permanent(err) ||
			!strings.Contains(err.Error(), "container credentials") || !strings.Contains(err.Error(), "503") {
			t.Fatalf("want a transient ErrNoCredentials naming the container endpoint's answer, got %v", err)
		}
	})
	t.Run("instance-metadata", func(t *testing.T) {
		isolateAWS(t)
		imds := httptest.NewServer(fakeIMDS(t))
		defer imds.Close()
		t.Setenv("AWS_EC2_METADATA_DISABLED", "")
		t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.URL)
		v, err := retrieve(t)
		if err != nil || v.AccessKeyID != "IMDSKEY" || v.SessionToken != "imds-token" {
			t.Fatalf("got %q (token %q), %v; want the instance role's", v.AccessKeyID, v.SessionToken, err)
		}
	})
}

// TestWebIdentity: a token file and a role (what EKS's IRSA sets) are exchanged
// at STS, here a fake on loopback named by AWS_ENDPOINT_URL_STS, for temporary
// credentials with their session token.
func TestWebIdentity(t *testing.T) {
	isolateAWS(t)
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("eyJ.web.identity"), 0o600); err != nil {
		t.Fatal(err)
	}
	sts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.FormValue("Action") != "AssumeRoleWithWebIdentity" || r.FormValue("WebIdentityToken") != "eyJ.web.identity" ||
			r.FormValue("RoleArn") != "arn:aws:iam::123456789012:role/memsnap" || r.FormValue("RoleSessionName") != "rank0" {
			t.Errorf("STS asked %v", r.Form)
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		w.Write([]byte(`<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleWithWebIdentityResult><Credentials>` +
			`<AccessKeyId>WEBKEY</AccessKeyId><SecretAccessKey>websecret</SecretAccessKey><SessionToken>web-token</SessionToken>` +
			`<Expiration>` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `</Expiration></Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>`))
	}))
	defer sts.Close()
	t.Setenv("AWS_WEB_IDENTITY_TOKEN_FILE", token)
	t.Setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/memsnap")
	t.Setenv("AWS_ROLE_SESSION_NAME", "rank0")
	t.Setenv("AWS_ENDPOINT_URL_STS", sts.URL)
	v, err := newChain("", "us-east-1", http.DefaultTransport).RetrieveWithCredContext(nil)
	if err != nil || v.AccessKeyID != "WEBKEY" || v.SessionToken != "web-token" {
		t.Fatalf("got %q (token %q), %v; want the role's", v.AccessKeyID, v.SessionToken, err)
	}
	t.Setenv("AWS_ENDPOINT_URL_STS", "") // and AWS_ENDPOINT_URL not set: the region's STS
	if name := (&chain{region: "eu-west-1"}).webIdentitySource().name; !strings.Contains(name, "at https://sts.eu-west-1.amazonaws.com") {
		t.Errorf("with no STS endpoint set, %s; want the region's", name)
	}
}

// fakeIMDS answers as EC2's instance metadata service does for a role "r".
func fakeIMDS(t *testing.T) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /latest/api/token", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("imdsv2")) })
	mux.HandleFunc("GET /latest/meta-data/iam/security-credentials/", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-aws-ec2-metadata-token") != "imdsv2" {
			t.Errorf("no IMDSv2 token on %s", r.URL.Path)
		}
		w.Write([]byte("r\n"))
	})
	mux.HandleFunc("GET /latest/meta-data/iam/security-credentials/r", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"Code":"Success","AccessKeyId":"IMDSKEY","SecretAccessKey":"imdssecret","Token":"imds-token","Expiration":"` +
			time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `"}`))
	})
	return mux
}

// TestBadSettings: a CA bundle that is no bundle, and credentials with a part
// missing, are refused before any request.
func TestBadSettings(t *testing.T) {
	isolateAWS(t)
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]Config{
		"ca-bundle-not-pem": {CABundle: notPEM},
		"ca-bundle-missing": {CABundle: notPEM + ".gone"},
		"access-key-only":   {Credentials: Credentials{AccessKey: "AKIA"}},
	} {
		cfg.URL, cfg.Endpoint = "s3://some-bucket", "https://127.0.0.1:1"
		if _, err := newS3(cfg); !errors.Is(err, ErrBadConfig) || !Permanent(err) {
			t.Errorf("%s: want a permanent ErrBadConfig, got %v", name, err)
		}
	}
	t.Setenv("AWS_CA_BUNDLE", notPEM)
	if _, err := newS3(Config{URL: "s3://some-bucket", Endpoint: "https://127.0.0.1:1"}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("AWS_CA_BUNDLE: want ErrBadConfig, got %v", err)
	}
}
