package store

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/memsnap/memsnap/internal/bounded"
	"github.com/memsnap/memsnap/naming"
)

// shaMeta is the user metadata key under which Put records the content's SHA-256.
const shaMeta = "Memsnap-Sha256"

// maxSinglePut is the largest body S3 accepts in one PUT (5 GiB).
const maxSinglePut = 5 << 30

// S3 is a store in an S3 bucket under a key prefix, through minio-go.
type S3 struct {
	client       *minio.Client
	tr           *http.Transport
	endpoint     string // host:port, never with credentials
	bucket       string
	prefix       string // "" or ends with '/'
	partSize     uint64
	singlePutMax int64  // the largest body a Put without Overwrite sends as one PUT
	spoolDir     string // where bodies of unknown size or checksum are staged
}

var _ Store = (*S3)(nil)

// OpenS3 connects to the bucket cfg.URL names and checks that it exists (creating it
// with cfg.CreateBucket), so a wrong endpoint, bad credentials or a missing bucket
// are reported at start-up. Credentials written into the endpoint URL
// (http://user:secret@host:port) serve when none are given in cfg.Credentials. A
// malformed URL or endpoint is refused (ErrBadURL) before any request.
func OpenS3(ctx context.Context, cfg Config) (*S3, error) {
	s, err := newS3(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.ensureBucket(ctx, cfg.CreateBucket, cfg.Region); err != nil {
		return nil, err
	}
	return s, nil
}

// newS3 checks cfg and builds the client, with no I/O but reading a CA bundle.
// Its errors wrap ErrBadURL or ErrBadConfig.
func newS3(cfg Config) (*S3, error) {
	loc, err := parseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	if loc.s3 == nil {
		return nil, fmt.Errorf("%w: %s is not an s3:// URL", ErrBadURL, cfg.URL)
	}
	cfg.FromEnv()
	if cfg.Endpoint == "" {
		return nil, fmt.Errorf("%w: no S3 endpoint: pass --endpoint, set AWS_ENDPOINT_URL_S3 or S3_ENDPOINT_URL, or, for AWS, give the region (--region, AWS_REGION)", ErrBadURL)
	}
	ep, err := parseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	if cfg.Credentials, err = ep.credentials(cfg.Credentials, redactEndpoint(cfg.Endpoint)); err != nil {
		return nil, err
	}
	// a transport of its own, so Close can let its idle connections go
	tr, err := transport(ep.secure, cfg.CABundle)
	if err != nil {
		return nil, err
	}
	creds, err := cfg.credentials(tr)
	if err != nil {
		return nil, err
	}
	client, err := minio.New(ep.host, &minio.Options{Creds: creds, Secure: ep.secure, Region: cfg.Region, MaxRetries: 3, Transport: tr})
	if err != nil {
		return nil, fmt.Errorf("%w: S3 endpoint %s: %w", ErrBadURL, ep.host, err)
	}
	s := &S3{client: client, tr: tr, endpoint: ep.host, bucket: loc.s3.Bucket, partSize: cfg.PartSize,
		singlePutMax: maxSinglePut, spoolDir: cfg.SpoolDir}
	if loc.s3.Key != "" {
		s.prefix = strings.TrimSuffix(loc.s3.Key, "/") + "/"
	}
	s.partSize = max(cmp.Or(s.partSize, 16<<20), 5<<20)
	return s, nil
}

// credentials are the given ones when cfg has some (both halves), or else the
// chain of the AWS tools, asked at the first request.
func (cfg Config) credentials(tr http.RoundTripper) (*credentials.Credentials, error) {
	c := cfg.Credentials
	switch {
	case c.AccessKey != "" && c.SecretKey != "":
		return credentials.NewStaticV4(c.AccessKey, c.SecretKey, c.SessionToken), nil
	case c.AccessKey != "" || c.SecretKey != "" || c.SessionToken != "":
		return nil, fmt.Errorf("%w: credentials given with a part missing (give the access key and the secret, or neither for the credential chain)", ErrBadConfig)
	}
	return credentials.New(newChain(cfg.Profile, cfg.Region, tr)), nil
}

// maxCABundle bounds a CA bundle file.
const maxCABundle = 16 << 20

// transport is minio-go's, trusting only the certificates in the PEM file
// caBundle when one is named.
func transport(secure bool, caBundle string) (*http.Transport, error) {
	tr, err := minio.DefaultTransport(secure)
	if err != nil || caBundle == "" {
		return tr, err
	}
	f, err := os.Open(caBundle)
	if err != nil {
		return nil, fmt.Errorf("%w: CA bundle: %w", ErrBadConfig, err)
	}
	defer f.Close()
	b, err := bounded.Read(f, caBundle, maxCABundle)
	if err != nil {
		return nil, fmt.Errorf("%w: CA bundle: %w", ErrBadConfig, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%w: CA bundle %s holds no PEM certificate", ErrBadConfig, caBundle)
	}
	if tr.TLSClientConfig == nil {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tr.TLSClientConfig.RootCAs = pool
	return tr, nil
}

// ensureBucket asks whether the bucket exists (a request the credentials must
// sign) and creates it when it does not and create is set.
func (s *S3) ensureBucket(ctx context.Context, create bool, region string) error {
	ok, err := s.client.BucketExists(ctx, s.bucket)
	if err != nil {
		return s.wrap(err, "checking bucket")
	}
	if ok {
		return nil
	}
	if !create {
		return fmt.Errorf("%w: %s at %s", ErrNoBucket, s.bucket, s.endpoint)
	}
	if err := s.client.MakeBucket(ctx, s.bucket, minio.MakeBucketOptions{Region: region}); err != nil {
		if r := minio.ToErrorResponse(err); r.Code != "BucketAlreadyOwnedByYou" {
			return s.wrap(err, "creating bucket")
		}
	}
	return nil
}

func (s *S3) String() string {
	return "s3://" + s.bucket + "/" + s.prefix + " at " + s.endpoint
}

func (s *S3) key(key string) (string, string, error) {
	k, err := naming.CleanKey(key)
	if err != nil {
		return "", "", err
	}
	full := s.prefix + k
	if len(full) > naming.MaxKeyLen {
		return "", "", fmt.Errorf("%w: %s with its prefix is longer than %d bytes", naming.ErrBadKey, k, naming.MaxKeyLen)
	}
	return k, full, nil
}

// wrap turns a minio-go error into one that wraps this package's sentinels.
func (s *S3) wrap(err error, what string) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrNoCredentials) {
		return err // it says where it looked; the endpoint was not asked
	}
	var resp minio.ErrorResponse
	if errors.As(err, &resp) {
		switch resp.Code {
		case "NoSuchKey":
			return fmt.Errorf("%w: %s: %s in %s", ErrNotFound, what, resp.Key, s)
		case "NoSuchBucket":
			return fmt.Errorf("%w: %s: bucket %s at %s", ErrNoBucket, what, s.bucket, s.endpoint)
		case "RequestTimeTooSkewed": // a 403 that fixing the clock cures, not the credentials
			return fmt.Errorf("store: %s at %s: this machine's clock differs too much from the server's: %w", what, s.endpoint, err)
		case "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken":
			return fmt.Errorf("%w: %s at %s: %s (%s)", ErrAccess, what, s.endpoint, resp.Code, resp.Message)
		case "InvalidBucketName": // a server stricter than naming.CheckBucket
			return fmt.Errorf("%w: %s: %s refuses the bucket name: %s (%s)", ErrBadURL, what, s.endpoint, resp.Code, resp.Message)
		case "PreconditionFailed":
			return fmt.Errorf("%w: %s: %s in %s", ErrExists, what, resp.Key, s)
		case "XMinioInvalidObjectName", "InvalidObjectName", "KeyTooLongError":
			return fmt.Errorf("%w: %s: %s refuses the name: %s (%s)", naming.ErrBadKey, what, s, resp.Code, resp.Message)
		case "EntityTooLarge":
			return fmt.Errorf("%w: %s: %s (%s)", ErrTooLarge, what, s, resp.Message)
		}
		if resp.StatusCode == 404 {
			return fmt.Errorf("%w: %s in %s", ErrNotFound, what, s)
		}
		if resp.StatusCode == 403 {
			return fmt.Errorf("%w: %s at %s: %s", ErrAccess, what, s.endpoint, resp.Code)
		}
		return fmt.Errorf("store: %s at %s: %w", what, s.endpoint, err)
	}
	var ne net.Error
	var ue *url.Error
	if errors.As(err, &ne) || errors.As(err, &ue) || errors.Is(err, syscall.ECONNREFUSED) {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w: %s: %s: %v", ErrUnreachable, what, s.endpoint, err)
		}
	}
	return fmt.Errorf("store: %s at %s: %w", what, s.endpoint, err)
}

func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, ObjectInfo, error) {
	k, full, err := s.key(key)
	if err != nil {
		return nil, ObjectInfo{}, err
	}
	obj, err := s.client.GetObject(ctx, s.bucket, full, minio.GetObjectOptions{})
	if err != nil {
		return nil, ObjectInfo{}, s.wrap(err, "getting "+k)
	}
	st, err := obj.Stat() // the first request happens here
	if err != nil {
		obj.Close()
		return nil, ObjectInfo{}, s.wrap(err, "getting "+k)
	}
	return changedReader{obj, s, k}, s.info(k, st), nil
}

// changedReader tells a body whose object was replaced after Get described it
// (S3 answers its read, conditioned on that version, with PreconditionFailed)
// as ErrChanged.
type changedReader struct {
	*minio.Object
	s *S3
	k string
}

func (r changedReader) Read(p []byte) (int, error) {
	n, err := r.Object.Read(p)
	if err != nil && err != io.EOF && minio.ToErrorResponse(err).Code == "PreconditionFailed" {
		err = fmt.Errorf("%w: %s in %s was replaced while being read", ErrChanged, r.k, r.s)
	}
	return n, err
}

func (s *S3) info(k string, st minio.ObjectInfo) ObjectInfo {
	oi := ObjectInfo{Key: k, Size: st.Size, ModTime: st.LastModified, ETag: st.ETag}
	for mk, v := range st.UserMetadata {
		if strings.EqualFold(mk, shaMeta) || strings.EqualFold(mk, "X-Amz-Meta-"+shaMeta) {
			oi.SHA256 = v
		}
	}
	if oi.SHA256 == "" {
		oi.SHA256 = st.Metadata.Get("X-Amz-Meta-" + shaMeta)
	}
	return oi
}

func (s *S3) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	k, full, err := s.key(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	st, err := s.client.StatObject(ctx, s.bucket, full, minio.StatObjectOptions{})
	if err != nil {
		return ObjectInfo{}, s.wrap(err, "stat "+k)
	}
	return s.info(k, st), nil
}

func (s *S3) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	prefix = strings.TrimLeft(prefix, "/")
	var out []ObjectInfo
	for o := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, s.wrap(o.Err, "listing "+prefix)
		}
		out = append(out, ObjectInfo{Key: strings.TrimPrefix(o.Key, s.prefix), Size: o.Size, ModTime: o.LastModified})
	}
	return out, nil
}

func (s *S3) Delete(ctx context.Context, key string) error {
	k, full, err := s.key(key)
	if err != nil {
		return err
	}
	if err := s.client.RemoveObject(ctx, s.bucket, full, minio.RemoveObjectOptions{}); err != nil {
		return s.wrap(err, "deleting "+k)
	}
	return nil
}

// URL is s3://bucket/prefix/key.
// Close lets the store's idle connections go; the store must not be used after.
func (s *S3) Close() error {
	s.tr.CloseIdleConnections()
	return nil
}

func (s *S3) URL(key string) string {
	return "s3://" + s.bucket + "/" + s.prefix + strings.TrimLeft(key, "/")
}
