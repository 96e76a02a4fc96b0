package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// DefaultCheckTimeout is how long Check waits for the store to answer when
// Config.CheckTimeout is zero.
const DefaultCheckTimeout = 5 * time.Second

// Check opens the store cfg names and makes sure it can be used, for a caller to
// call once at start-up so that a wrong store is reported at once rather than at
// the first upload. It checks cfg.URL and the endpoint with no I/O, then, for S3,
// asks the server whether the bucket exists (a request signed with the
// credentials, so refused credentials show) and creates it with cfg.CreateBucket,
// all within cfg.CheckTimeout; for a folder it looks at the folder (creating it
// with cfg.CreateBucket) and creates and removes a temporary file in it. Local
// file I/O is not bounded by the timeout.
//
// It returns the open store, or nil and an error that wraps one of:
//
//   - ErrBadURL: an unsupported scheme, s3:// with no bucket, a bucket name S3
//     refuses, credentials in the store URL, a missing or malformed endpoint. No
//     request was made. Permanent.
//   - ErrBadConfig: a CA bundle that cannot be read, credentials with a part
//     missing. No request was made. Permanent.
//   - ErrNoCredentials: none given, and the credential chain found none (or
//     its first configured source failed). Permanent, unless that source is a
//     server (STS, a container's endpoint): then it is ErrUnreachable too.
//   - ErrAccess: the server refused the credentials (InvalidAccessKeyId,
//     SignatureDoesNotMatch, AccessDenied, InvalidToken, ExpiredToken, any other
//     403), or the folder cannot be read, created or written. Permanent.
//   - ErrNoBucket: the bucket (or folder) does not exist and cfg.CreateBucket is
//     not set. Not permanent (someone may create it); a caller that expects it
//     to exist may stop.
//   - ErrUnreachable: the endpoint could not be reached (refused connection,
//     unknown host, failed TLS) or did not answer within the timeout. Transient:
//     a caller may warn and go on, retrying later.
//   - context.Canceled or context.DeadlineExceeded: ctx itself ended.
//
// Anything else (a server error, a path that is a file, a full disk) is returned
// as it came and is transient. Permanent tells the permanent ones apart.
func Check(ctx context.Context, cfg Config) (Store, error) {
	loc, err := parseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	if loc.s3 == nil {
		d, err := checkDir(loc.folder, cfg.CreateBucket)
		if err != nil {
			return nil, err // not a nil *Dir in a non-nil Store
		}
		return d, nil
	}
	s, err := newS3(cfg)
	if err != nil {
		return nil, err
	}
	timeout := cfg.CheckTimeout
	if timeout <= 0 {
		timeout = DefaultCheckTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err = s.ensureBucket(cctx, cfg.CreateBucket, cfg.Region)
	if err == nil {
		return s, nil
	}
	if ctx.Err() == nil && cctx.Err() != nil && !errors.Is(err, ErrAccess) && !errors.Is(err, ErrNoBucket) && !errors.Is(err, ErrNoCredentials) {
		// our own time limit, not the caller's: the server did not answer in time
		return nil, fmt.Errorf("%w: %s did not answer within %v", ErrUnreachable, s.endpoint, timeout)
	}
	return nil, err
}

// checkDir opens the folder store at path and checks that a file can be created
// and removed in it.
func checkDir(path string, create bool) (*Dir, error) {
	d, err := OpenDir(path, create)
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(d.root, tmpPrefix+"check-*")
	if err != nil {
		return nil, dirErr("folder "+d.root+" is not writable", err)
	}
	err = f.Close()
	if rerr := os.Remove(f.Name()); err == nil {
		err = rerr
	}
	if err != nil {
		return nil, dirErr("writing in folder "+d.root, err)
	}
	return d, nil
}
