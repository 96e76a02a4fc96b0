package store

import (
	"fmt"
	"strings"

	"github.com/memsnap/memsnap/naming"
)

// location is a checked store URL: an S3 bucket and prefix, or a folder.
type location struct {
	s3     *naming.URL // the bucket and prefix of an s3:// URL; nil for a folder
	folder string      // the folder's path (file:// stripped) when s3 is nil
}

// CheckURL checks a store URL as Open reads it, with no I/O: an s3://bucket[/prefix]
// URL whose bucket name follows S3's rules (naming.CheckBucket) and carries no
// credentials, or a folder path (optionally file://path). A URL with any other
// scheme (ftp://, http://, gs://, S3://…) is refused rather than taken for a
// folder; a path with "://" further in (./a://b) is a folder. Its errors wrap
// ErrBadURL.
func CheckURL(u string) error {
	_, err := parseURL(u)
	return err
}

// parseURL is CheckURL, returning what the URL names.
func parseURL(raw string) (location, error) {
	shown := raw
	if strings.Contains(raw, "://") { // a folder path keeps its '@'s
		shown = redactEndpoint(raw)
	}
	if raw == "" {
		return location{}, fmt.Errorf("%w: no store given (an s3://bucket/prefix URL or a folder path)", ErrBadURL)
	}
	if naming.IsS3(raw) {
		return parseS3URL(raw, shown)
	}
	if len(raw) >= 3 && strings.EqualFold(raw[:3], "s3:") && !strings.HasPrefix(raw[3:], "//") {
		return location{}, fmt.Errorf("%w: %s: an S3 URL starts with s3:// (for a folder of that name, write ./%s)", ErrBadURL, shown, shown)
	}
	path := raw
	if p, ok := strings.CutPrefix(raw, "file://"); ok {
		if p == "" {
			return location{}, fmt.Errorf("%w: %s: no folder path after file://", ErrBadURL, shown)
		}
		path = p
	}
	if scheme, ok := urlScheme(path); ok {
		return location{}, fmt.Errorf("%w: %s: unsupported store URL scheme %q (use s3://bucket/prefix or a folder path)", ErrBadURL, shown, scheme)
	}
	return location{folder: path}, nil
}

// parseS3URL is parseURL for an s3:// URL; shown is the URL for messages.
func parseS3URL(raw, shown string) (location, error) {
	bucket, _, _ := strings.Cut(strings.TrimPrefix(raw, "s3://"), "/")
	if strings.ContainsAny(bucket, "@:") { // before any message can repeat it
		return location{}, fmt.Errorf("%w: %s: credentials do not belong in the store URL (give them as credentials or in the environment)", ErrBadURL, shown)
	}
	if bucket == "" {
		return location{}, fmt.Errorf("%w: %s: no bucket name (use s3://bucket/prefix)", ErrBadURL, shown)
	}
	if err := naming.CheckBucket(bucket); err != nil {
		return location{}, fmt.Errorf("%w: %s: %w", ErrBadURL, shown, err)
	}
	u, err := naming.ParseS3(raw)
	if err != nil { // the prefix: the bucket passed above
		return location{}, fmt.Errorf("%w: %s: %w", ErrBadURL, shown, err)
	}
	return location{s3: &u}, nil
}

// urlScheme returns s's scheme when s starts like a URL, scheme "://", the
// scheme being a letter then letters, digits, '+', '-' or '.' (RFC 3986).
func urlScheme(s string) (string, bool) {
	scheme, _, ok := strings.Cut(s, "://")
	if !ok || scheme == "" {
		return "", false
	}
	for i := 0; i < len(scheme); i++ {
		c := scheme[i]
		letter := (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		if !letter && (i == 0 || !(c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return "", false
		}
	}
	return scheme, true
}
