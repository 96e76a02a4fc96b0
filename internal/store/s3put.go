package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
)

// body is what one S3 Put sends.
type body struct {
	r    io.Reader // the content, read once from its start
	size int64     // its length in bytes
	sum  string    // its hex SHA-256 (lowercase), known before sending
}

// Put stores r under key, recording its SHA-256 as user metadata.
//
// Without Overwrite, an object up to 5 GiB goes as one PUT carrying
// If-None-Match: *, and a larger one as a multipart upload whose completion carries
// it, so of concurrent writers to one key exactly one succeeds and the others get
// ErrExists. (minio-go's PutObject drops that header from the completion of the
// multipart uploads it makes by itself, which is why it is not used for those.)
//
// A body that can seek is hashed before it is sent; one that cannot is copied to a
// temporary file first unless both opts.Size and opts.SHA256 are given. The body
// is sent as it is read, so a failed request is not retried here: the error is
// transient (see Permanent) and the caller retries the Put.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, opts PutOptions) (ObjectInfo, error) {
	k, full, err := s.key(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	if opts.Size > s.maxObjectSize() {
		return ObjectInfo{}, fmt.Errorf("%w: %s: %d bytes, more than the %d one object may hold", ErrTooLarge, k, opts.Size, s.maxObjectSize())
	}
	if opts.IfMatch != "" {
		opts.Overwrite = true
	}
	if !opts.Overwrite {
		// Refusing early spares sending the body; the conditional request below is
		// what holds against concurrent writers.
		if err := s.absent(ctx, k, full); err != nil {
			return ObjectInfo{}, err
		}
	}
	b, done, err := s.prepare(ctx, k, r, opts)
	if err != nil {
		return ObjectInfo{}, err
	}
	defer done()
	if b.size > s.maxObjectSize() {
		return ObjectInfo{}, fmt.Errorf("%w: %s: %d bytes, more than the %d one object may hold", ErrTooLarge, k, b.size, s.maxObjectSize())
	}
	po := minio.PutObjectOptions{ContentType: opts.ContentType, UserMetadata: map[string]string{shaMeta: b.sum}}
	if po.ContentType == "" {
		po.ContentType = "application/octet-stream"
	}
	h := sha256.New()
	src := io.TeeReader(b.r, h) // not a Seeker: minio-go sends it once, as it reads it
	var info minio.UploadInfo
	switch {
	case opts.IfMatch != "":
		if b.size > s.singlePutMax {
			return ObjectInfo{}, fmt.Errorf("%w: %s: a conditional replace of %d bytes (one PUT holds at most %d)", ErrTooLarge, k, b.size, s.singlePutMax)
		}
		po.DisableMultipart = true
		po.SetMatchETag(opts.IfMatch)
		info, err = s.client.PutObject(ctx, s.bucket, full, src, b.size, po)
		if r := minio.ToErrorResponse(err); err != nil && (r.Code == "PreconditionFailed" || r.Code == "NoSuchKey" || r.StatusCode == 404) {
			return ObjectInfo{}, fmt.Errorf("%w: %s in %s", ErrChanged, k, s)
		}
	case opts.Overwrite:
		po.PartSize = s.partSize
		info, err = s.client.PutObject(ctx, s.bucket, full, src, b.size, po)
	case b.size <= s.singlePutMax:
		po.DisableMultipart = true
		po.SetMatchETagExcept("*")
		info, err = s.client.PutObject(ctx, s.bucket, full, src, b.size, po)
	default:
		info, err = s.putMultipartNew(ctx, full, src, b.size, po)
	}
	if err != nil {
		return ObjectInfo{}, s.wrap(err, "putting "+k)
	}
	if sent := hex.EncodeToString(h.Sum(nil)); sent != b.sum {
		_ = s.client.RemoveObject(context.WithoutCancel(ctx), s.bucket, full, minio.RemoveObjectOptions{})
		return ObjectInfo{}, fmt.Errorf("%w: %s: sent %s, want %s", ErrChecksum, k, sent, b.sum)
	}
	return ObjectInfo{Key: k, Size: b.size, SHA256: b.sum, ModTime: info.LastModified, ETag: info.ETag}, nil
}

// absent returns ErrExists when the object exists, nil when it does not.
func (s *S3) absent(ctx context.Context, k, full string) error {
	_, err := s.client.StatObject(ctx, s.bucket, full, minio.StatObjectOptions{})
	if err == nil {
		return fmt.Errorf("%w: %s in %s", ErrExists, k, s)
	}
	if err := s.wrap(err, "checking "+k); !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// prepare makes r a body of known size and SHA-256: a body that can seek is hashed
// and rewound, one whose size and checksum the caller gave is taken as it is, and
// any other is copied to a temporary file, hashing it. done releases what prepare
// made.
func (s *S3) prepare(ctx context.Context, k string, r io.Reader, opts PutOptions) (b body, done func(), err error) {
	want := strings.ToLower(opts.SHA256)
	if rs, ok := r.(io.ReadSeeker); ok {
		if start, err := rs.Seek(0, io.SeekCurrent); err == nil { // a pipe is a File that cannot seek
			sum, n, err := hashReader(ctx, rs)
			if err != nil {
				return body{}, nil, fmt.Errorf("store: hashing %s: %w", k, err)
			}
			if _, err := rs.Seek(start, io.SeekStart); err != nil {
				return body{}, nil, fmt.Errorf("store: rewinding %s: %w", k, err)
			}
			b := body{r: rs, size: n, sum: sum}
			return b, func() {}, checkSum(k, b.sum, want)
		}
	}
	if opts.Size > 0 && want != "" {
		return body{r: r, size: opts.Size, sum: want}, func() {}, nil
	}
	return spool(ctx, s.spoolDir, k, r, want)
}

// spool copies r to a new file in dir (os.TempDir() when empty), hashing it as it
// goes, and returns that file as the body; done closes and removes it.
func spool(ctx context.Context, dir, k string, r io.Reader, want string) (body, func(), error) {
	f, err := os.CreateTemp(dir, tmpPrefix+"spool-*")
	if err != nil {
		return body{}, nil, fmt.Errorf("store: spooling %s: %w", k, err)
	}
	done := func() {
		f.Close()
		os.Remove(f.Name())
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), ctxReader{ctx, r})
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		done()
		return body{}, nil, fmt.Errorf("store: spooling %s: %w", k, err)
	}
	b := body{r: f, size: n, sum: hex.EncodeToString(h.Sum(nil))}
	if err := checkSum(k, b.sum, want); err != nil {
		done()
		return body{}, nil, err
	}
	return b, done, nil
}

// checkSum returns ErrChecksum when want is given and differs from got.
func checkSum(k, got, want string) error {
	if want != "" && !strings.EqualFold(got, want) {
		return fmt.Errorf("%w: %s: got %s, want %s", ErrChecksum, k, got, want)
	}
	return nil
}

// putMultipartNew sends a body too large for one PUT as a multipart upload whose
// completion carries If-None-Match: *, so that it fails with PreconditionFailed
// when the object appeared meanwhile. The parts are read in order from r; any
// failure aborts the upload.
func (s *S3) putMultipartNew(ctx context.Context, full string, r io.Reader, size int64, po minio.PutObjectOptions) (minio.UploadInfo, error) {
	partSize, err := s.partSizeFor(size)
	if err != nil {
		return minio.UploadInfo{}, err
	}
	core := minio.Core{Client: s.client}
	id, err := core.NewMultipartUpload(ctx, s.bucket, full, po)
	if err != nil {
		return minio.UploadInfo{}, err
	}
	abort := func() {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = core.AbortMultipartUpload(actx, s.bucket, full, id)
	}
	var parts []minio.CompletePart
	for n, off := 1, int64(0); off < size; n, off = n+1, off+partSize {
		length := min(partSize, size-off)
		p, err := core.PutObjectPart(ctx, s.bucket, full, id, n, io.LimitReader(r, length), length, minio.PutObjectPartOptions{})
		if err != nil {
			abort()
			return minio.UploadInfo{}, err
		}
		parts = append(parts, minio.CompletePart{PartNumber: n, ETag: p.ETag})
	}
	var co minio.PutObjectOptions
	co.SetMatchETagExcept("*")
	info, err := core.CompleteMultipartUpload(ctx, s.bucket, full, id, parts, co)
	if err != nil {
		abort()
		return minio.UploadInfo{}, err
	}
	return info, nil
}

// partSizeFor returns the part size for a multipart upload of size bytes: the
// configured one, or larger when the parts would otherwise be too many.
func (s *S3) partSizeFor(size int64) (int64, error) {
	lim := s.client.UploadLimits()
	ps := int64(s.partSize)
	if need := (size + lim.MaxPartsCount - 1) / lim.MaxPartsCount; need > ps {
		ps = (need + 1<<20 - 1) &^ (1<<20 - 1) // whole MiB
	}
	if ps > lim.MaxPartSize {
		return 0, fmt.Errorf("%w: %d bytes need parts larger than %d bytes", ErrTooLarge, size, lim.MaxPartSize)
	}
	return ps, nil
}

// maxObjectSize is the largest object a multipart upload can carry.
func (s *S3) maxObjectSize() int64 {
	lim := s.client.UploadLimits()
	return lim.MaxPartSize * lim.MaxPartsCount
}
