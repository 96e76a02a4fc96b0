// Package store is memsnap's object-store layer: one interface, with a MinIO/S3
// implementation (minio-go) and a local-folder implementation (the embedded default,
// for use with no server).
//
// Every Put streams its body (on S3, one of unknown size or checksum through a
// temporary file), computes a SHA-256 of what it wrote, and refuses to replace an
// existing object unless asked, even against concurrent writers. Errors wrap the
// sentinels below so callers can tell a missing bucket from bad credentials from an
// unreachable endpoint, and Permanent tells which of them retrying cannot fix.
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/memsnap/memsnap/internal/bounded"
	"github.com/memsnap/memsnap/naming"
)

var (
	// ErrNotFound: the object does not exist.
	ErrNotFound = errors.New("store: object not found")
	// ErrExists: the object exists and the Put did not ask to overwrite it.
	ErrExists = errors.New("store: object already exists")
	// ErrNoBucket: the bucket (or the store's root folder) does not exist.
	ErrNoBucket = errors.New("store: bucket does not exist")
	// ErrAccess: the credentials were refused or do not allow the operation (on
	// S3: InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied, InvalidToken,
	// ExpiredToken or another 403 but RequestTimeTooSkewed), or (OpenDir, Check)
	// the folder may not be reached, created or written.
	ErrAccess = errors.New("store: access denied")
	// ErrUnreachable: the endpoint could not be reached.
	ErrUnreachable = errors.New("store: endpoint unreachable")
	// ErrChecksum: what was stored does not match the checksum the caller gave.
	ErrChecksum = errors.New("store: checksum mismatch")
	// ErrTooLarge: the object is larger than the store can hold in one object.
	ErrTooLarge = errors.New("store: object too large")
	// ErrChanged: a Put with IfMatch found the object changed since its version
	// was read, or gone.
	ErrChanged = errors.New("store: object changed since it was read")
	// ErrBadURL: the store URL or the S3 endpoint is malformed, found before any
	// request: an unsupported scheme (ftp://, gs://…), s3:// with no bucket or a
	// bucket name S3 refuses, credentials written into the store URL, a missing or
	// malformed endpoint. See CheckURL.
	ErrBadURL = errors.New("store: bad URL")
	// ErrBadConfig: the S3 settings are unusable, found before any request: a CA
	// bundle that cannot be read or holds no certificate, credentials given with
	// a part missing.
	ErrBadConfig = errors.New("store: bad configuration")
)

// Permanent reports whether err is one that retrying the same operation cannot
// fix, so that a queue of uploads can put the job aside at once rather than retry
// it: the object exists (ErrExists), the content does not match the checksum given
// (ErrChecksum), it changed since the version a conditional Put names was read
// (ErrChanged), the key is refused (naming.ErrBadKey, which a folder store also
// returns for a name its file system cannot hold), the object is too large
// (ErrTooLarge), the credentials were refused (ErrAccess: the same request signed
// with the same credentials is refused again) or none were found
// (ErrNoCredentials, unless a server of the chain failed), or the store URL, endpoint or settings are malformed
// (ErrBadURL, ErrBadConfig).
//
// Everything else is worth retrying, including errors this package does not know
// (retry.Transient answers the other way for those: internal/retry says why): an
// unreachable endpoint and a missing bucket (an operator can fix those while the
// job waits), a cancelled or expired context, server errors and time-outs. An
// error that wraps one of those is not permanent even when it also wraps a
// permanent one.
func Permanent(err error) bool {
	if err == nil {
		return false
	}
	for _, transient := range []error{context.Canceled, context.DeadlineExceeded, ErrUnreachable, ErrNoBucket} {
		if errors.Is(err, transient) {
			return false
		}
	}
	for _, permanent := range []error{ErrExists, ErrChanged, ErrChecksum, ErrTooLarge, naming.ErrBadKey, ErrAccess, ErrNoCredentials, ErrBadURL, ErrBadConfig} {
		if errors.Is(err, permanent) {
			return true
		}
	}
	return false
}

// ObjectInfo describes one stored object.
type ObjectInfo struct {
	Key     string    // the key relative to the store's prefix
	Size    int64     // bytes
	SHA256  string    // hex SHA-256 of the content, where known ("" otherwise)
	ModTime time.Time // when it was written
	// ETag is the object's version: S3's entity tag, a folder store's file identity
	// (inode, size, modification time). A Put whose IfMatch names it replaces the
	// object only while it is still that version. "" where not known (List).
	ETag string
}

// PutOptions tune one Put.
type PutOptions struct {
	// Overwrite replaces an existing object; without it an existing object is ErrExists.
	Overwrite bool
	// Size is the body's length when known, or 0 when not. A body that can seek (a
	// file) is measured instead. The S3 store sends a body that cannot seek as it
	// reads it only when both Size and SHA256 are given; any other such body is first
	// copied to a temporary file (Config.SpoolDir), hashing it, so that its SHA-256
	// is recorded and a Put without Overwrite can be one conditional request.
	Size int64
	// SHA256, when set, is the hex SHA-256 the caller expects the body to have; a
	// mismatch returns ErrChecksum and leaves no object behind.
	SHA256 string
	// ContentType is stored with the object on S3 ("application/octet-stream" when empty).
	ContentType string
	// IfMatch, when set, replaces the object only if it exists and is still the
	// version of that ETag (Get or Stat gave it); otherwise the Put fails with
	// ErrChanged and stores nothing. Of concurrent Puts naming one version, at
	// most one succeeds. It implies Overwrite; on S3 the body must fit one PUT.
	IfMatch string
}

// Store is an object store rooted at a prefix. Keys are relative to that prefix and
// are checked with naming.CleanKey.
type Store interface {
	// Put streams r into key.
	Put(ctx context.Context, key string, r io.Reader, opts PutOptions) (ObjectInfo, error)
	// Get opens key for reading; the caller closes it.
	Get(ctx context.Context, key string) (io.ReadCloser, ObjectInfo, error)
	// Stat describes key, checksum included where the store knows it.
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	// List returns the objects whose keys start with prefix, sorted by key.
	List(ctx context.Context, prefix string) ([]ObjectInfo, error)
	// Delete removes key; a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// String names the store for messages (never with credentials).
	String() string
	// URL is where key lives, as the CLI takes it: s3://bucket/prefix/key, or the
	// file's path in a folder store.
	URL(key string) string
	// Close releases what the store holds (idle connections); its owner calls it
	// once done with it.
	Close() error
}

// Credentials for an S3 store. They are never logged or printed.
type Credentials struct {
	AccessKey    string
	SecretKey    string
	SessionToken string
}

// String hides the secret.
func (c Credentials) String() string {
	if c.AccessKey == "" {
		return "credentials(none)"
	}
	return "credentials(" + c.AccessKey[:min(4, len(c.AccessKey))] + "…)"
}

// Config selects and configures a store.
type Config struct {
	// URL is where the store lives: s3://bucket[/prefix], or a folder path
	// (optionally file://path).
	URL string
	// Endpoint is the S3 endpoint, host:port or http(s)://host:port. Empty reads
	// S3_ENDPOINT_URL, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or MINIO_ENDPOINT,
	// and with none of them set is AWS S3 in Region (https://s3.REGION.amazonaws.com).
	// A user and secret written into it (http://user:secret@host:port) serve as the
	// credentials when Credentials names none; they never appear in messages.
	Endpoint string
	// Credentials, both the access key and the secret or neither. Neither asks
	// the AWS tools' chain at the first request: the environment
	// (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, then
	// MINIO_ROOT_USER / MINIO_ROOT_PASSWORD or MINIO_ACCESS_KEY / MINIO_SECRET_KEY),
	// the shared credentials and config files (Profile), web identity
	// (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN), container credentials
	// (AWS_CONTAINER_CREDENTIALS_FULL_URI or _RELATIVE_URI), then EC2's instance
	// metadata; finding none is ErrNoCredentials.
	Credentials Credentials
	// Profile names the profile of the shared credentials file (empty: AWS_PROFILE,
	// or "default").
	Profile string
	// Region of the bucket; empty reads AWS_REGION or AWS_DEFAULT_REGION, and with
	// neither lets the client discover it (us-east-1 for MinIO).
	Region string
	// CABundle is a PEM file of the certificate authorities to trust instead of
	// the system's, for an endpoint with a certificate of its own (empty:
	// AWS_CA_BUNDLE or SSL_CERT_FILE, or the system's).
	CABundle string
	// PartSize is the multipart upload part size in bytes (0: 16 MiB, at least 5 MiB).
	// Multipart uploads carry a Put with Overwrite above this size, and one without
	// only above 5 GiB (S3's limit for one PUT), which may raise it to fit 10000 parts.
	PartSize uint64
	// CreateBucket makes the bucket (or the root folder) when it is missing.
	CreateBucket bool
	// CheckTimeout bounds the requests Check makes (0: DefaultCheckTimeout).
	CheckTimeout time.Duration
	// SpoolDir is the folder where the S3 store stages a body of unknown size or
	// checksum before sending it (empty: os.TempDir()). It needs room for the
	// largest such body.
	SpoolDir string
}

// String describes cfg for messages, without credentials.
func (cfg Config) String() string {
	u := cfg.URL
	if strings.Contains(u, "://") { // a folder path keeps its '@'s
		u = redactEndpoint(u)
	}
	return fmt.Sprintf("store.Config{URL: %s, Endpoint: %s, %s, Region: %s}",
		u, redactEndpoint(cfg.Endpoint), cfg.Credentials, cfg.Region)
}

// Open returns the store cfg names. It checks cfg.URL (CheckURL) and, for S3, the
// endpoint before any I/O, refusing a malformed one with ErrBadURL; then it asks
// the S3 server whether the bucket exists, or looks at the folder (creating either
// with cfg.CreateBucket). Check does the same and more, within a time limit.
func Open(ctx context.Context, cfg Config) (Store, error) {
	loc, err := parseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	if loc.s3 != nil {
		s, err := OpenS3(ctx, cfg)
		if err != nil {
			return nil, err // not a nil *S3 in a non-nil Store
		}
		return s, nil
	}
	d, err := OpenDir(loc.folder, cfg.CreateBucket)
	if err != nil {
		return nil, err // nor a nil *Dir
	}
	return d, nil
}

// FromEnv fills from the environment what cfg leaves empty: the region, the
// endpoint (AWS S3 in the region when no variable names one; see Endpoint) and
// the CA bundle. Credentials it leaves to the chain the store asks.
func (cfg *Config) FromEnv() {
	if cfg.Region == "" {
		cfg.Region = firstEnv("AWS_REGION", "AWS_DEFAULT_REGION")
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = firstEnv(endpointEnv...)
	}
	if cfg.Endpoint == "" && cfg.Region != "" {
		cfg.Endpoint = awsEndpoint("s3", cfg.Region)
	}
	if cfg.CABundle == "" {
		cfg.CABundle = firstEnv("AWS_CA_BUNDLE", "SSL_CERT_FILE")
	}
}

// endpointEnv are the variables that name the S3 endpoint, in order of preference.
var endpointEnv = []string{"S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "MINIO_ENDPOINT"}

// firstEnv returns the first of the named variables that is set and not empty.
func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// PutFile stores the local file at path under key. Stores that can (a folder on the
// same file system) move the file into place instead of copying it; the file may be
// gone afterwards.
func PutFile(ctx context.Context, s Store, key, path string, opts PutOptions) (ObjectInfo, error) {
	if fp, ok := s.(interface {
		PutFile(context.Context, string, string, PutOptions) (ObjectInfo, error)
	}); ok {
		return fp.PutFile(ctx, key, path, opts)
	}
	f, err := os.Open(path)
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("store: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil {
		opts.Size = st.Size()
	}
	return s.Put(ctx, key, f, opts)
}

// ReadAll reads a whole object.
func ReadAll(ctx context.Context, s Store, key string) ([]byte, error) {
	rc, _, err := s.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("store: reading %s from %s: %w", key, s, err)
	}
	return b, nil
}

// ReadLimited reads r whole, refusing more than limit bytes (an error wrapping
// ErrTooLarge that names what was read): the one bounded read of untrusted
// records, manifests and messages.
func ReadLimited(r io.Reader, name string, limit int64) ([]byte, error) {
	b, err := bounded.Read(r, name, limit)
	switch {
	case errors.Is(err, bounded.ErrTooLarge):
		return nil, fmt.Errorf("%w: %w", ErrTooLarge, err)
	case err != nil:
		return nil, fmt.Errorf("store: %w", err)
	}
	return b, nil
}

// ReadObject reads key whole, refusing more than limit bytes, with the version
// of what it read.
func ReadObject(ctx context.Context, s Store, key string, limit int64) ([]byte, ObjectInfo, error) {
	rc, info, err := s.Get(ctx, key)
	if err != nil {
		return nil, ObjectInfo{}, err
	}
	defer rc.Close()
	b, err := ReadLimited(rc, key, limit)
	return b, info, err
}
