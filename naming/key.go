package naming

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxKeyLen is the longest object key S3 accepts, in bytes.
const MaxKeyLen = 1024

// ErrBadKey is wrapped by every refusal of an object key.
var ErrBadKey = errors.New("naming: bad object name")

// CleanKey checks a rendered name as an object key (or a path under a folder store):
// leading '/' is stripped as Composer does; empty names, '..' segments, control
// characters, invalid UTF-8 and names longer than MaxKeyLen are refused.
func CleanKey(s string) (string, error) {
	k := strings.TrimLeft(s, "/")
	switch {
	case k == "":
		return "", fmt.Errorf("%w: %q is empty", ErrBadKey, s)
	case len(k) > MaxKeyLen:
		return "", fmt.Errorf("%w: %d bytes is longer than the %d that S3 allows", ErrBadKey, len(k), MaxKeyLen)
	case !utf8.ValidString(k):
		return "", fmt.Errorf("%w: %q is not valid UTF-8", ErrBadKey, k)
	}
	for i, r := range k {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return "", fmt.Errorf("%w: %q holds a control character at byte %d", ErrBadKey, k, i)
		}
	}
	for _, seg := range strings.Split(k, "/") {
		if seg == ".." {
			return "", fmt.Errorf("%w: %q escapes its prefix ('..' segment)", ErrBadKey, k)
		}
		if strings.Contains(seg, "\\") && strings.Contains(seg, "..") {
			return "", fmt.Errorf("%w: %q escapes its prefix ('..' with a backslash)", ErrBadKey, k)
		}
	}
	return k, nil
}

// Join joins a prefix and a name into one key with exactly one '/' between them,
// and checks the result with CleanKey.
func Join(prefix, name string) (string, error) {
	prefix = strings.Trim(prefix, "/")
	name = strings.TrimLeft(name, "/")
	if prefix == "" {
		return CleanKey(name)
	}
	if name == "" {
		return CleanKey(prefix)
	}
	return CleanKey(prefix + "/" + name)
}

// URL is a parsed s3://bucket/key location.
type URL struct {
	Bucket string
	Key    string // may be empty (the bucket's root), never starts with '/'
}

func (u URL) String() string {
	if u.Key == "" {
		return "s3://" + u.Bucket
	}
	return "s3://" + u.Bucket + "/" + u.Key
}

// IsS3 reports whether s is an s3:// URL.
func IsS3(s string) bool { return strings.HasPrefix(s, "s3://") }

// ParseS3 parses s3://bucket[/key]. The key's leading '/' is stripped; a key that
// escapes its prefix is refused; the bucket name must follow S3's rules.
func ParseS3(s string) (URL, error) {
	rest, ok := strings.CutPrefix(s, "s3://")
	if !ok {
		return URL{}, fmt.Errorf("naming: %q is not an s3:// URL", s)
	}
	bucket, key, _ := strings.Cut(rest, "/")
	if err := CheckBucket(bucket); err != nil {
		return URL{}, fmt.Errorf("naming: %q: %w", s, err)
	}
	u := URL{Bucket: bucket}
	if strings.Trim(key, "/") != "" {
		k, err := CleanKey(key)
		if err != nil {
			return URL{}, err
		}
		u.Key = k
	}
	return u, nil
}

// CheckBucket checks an S3 bucket name against S3's rules (and minio-go's, which
// refuses a few more before sending): 3 to 63 characters of lowercase letters,
// digits, '.' and '-', starting and ending with a letter or digit, with no "..", no
// '.' beside a '-', not formatted like an IPv4 address, and without the prefixes
// and suffixes AWS reserves ("xn--", "sthree-", "amzn-s3-demo-"; "-s3alias",
// "--ol-s3", ".mrap", "--x-s3", "--table-s3").
func CheckBucket(b string) error {
	if b == "" {
		return errors.New("no bucket name")
	}
	if len(b) < 3 || len(b) > 63 {
		return fmt.Errorf("bucket name %q must be 3 to 63 characters", b)
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		ok := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-'
		if !ok {
			return fmt.Errorf("bucket name %q holds %q (only lowercase letters, digits, '.' and '-')", b, c)
		}
	}
	if !isAlnum(b[0]) || !isAlnum(b[len(b)-1]) {
		return fmt.Errorf("bucket name %q must start and end with a letter or digit", b)
	}
	for _, bad := range []string{"..", ".-", "-."} {
		if strings.Contains(b, bad) {
			return fmt.Errorf("bucket name %q holds %q", b, bad)
		}
	}
	if isIPv4Like(b) {
		return fmt.Errorf("bucket name %q is formatted like an IP address", b)
	}
	for _, p := range reservedBucketPrefixes {
		if strings.HasPrefix(b, p) {
			return fmt.Errorf("bucket name %q starts with %q, which S3 reserves", b, p)
		}
	}
	for _, sfx := range reservedBucketSuffixes {
		if strings.HasSuffix(b, sfx) {
			return fmt.Errorf("bucket name %q ends with %q, which S3 reserves", b, sfx)
		}
	}
	return nil
}

// The bucket name prefixes and suffixes AWS reserves for its own use.
var (
	reservedBucketPrefixes = []string{"xn--", "sthree-", "amzn-s3-demo-"}
	reservedBucketSuffixes = []string{"-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"}
)

// isIPv4Like reports whether b is four dot-separated runs of digits (as minio-go
// tests it: "999.1.1.1" counts too).
func isIPv4Like(b string) bool {
	parts := strings.Split(b, ".")
	if len(parts) != 4 {
		return false
	}
	for _, p := range parts {
		if p == "" || strings.Trim(p, "0123456789") != "" {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') }

// MaxRunNameLen is the longest run name, in bytes.
const MaxRunNameLen = 128

// CheckRunName checks a run's name: it names the run's objects, its run's log and
// its gossip, so it is one path segment of printable characters, without
// whitespace, of at most MaxRunNameLen bytes.
func CheckRunName(s string) error {
	switch {
	case s == "":
		return errors.New("naming: the run name is empty")
	case len(s) > MaxRunNameLen:
		return fmt.Errorf("naming: the run name is %d bytes, over the %d allowed", len(s), MaxRunNameLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("naming: the run name %q is not valid UTF-8", s)
	case s == "." || s == "..":
		return fmt.Errorf("naming: the run name %q is not a name", s)
	}
	for _, r := range s {
		if r <= 0x20 || r == 0x7f || (r >= 0x80 && r <= 0xa0) || r == '/' || r == '\\' || unicode.IsSpace(r) {
			return fmt.Errorf("naming: the run name %q holds %q (a run name is one word: letters, digits, '-', '_', '.')", s, r)
		}
	}
	return nil
}
