package naming

import (
	"strings"
	"testing"
)

// TestCheckBucket: S3's bucket naming rules, and the few more minio-go enforces
// before sending a request.
func TestCheckBucket(t *testing.T) {
	cases := []struct {
		name string
		ok   bool
		why  string // a part of the error's text
	}{
		{"my-bucket", true, ""},
		{"abc", true, ""},
		{strings.Repeat("a", 63), true, ""},
		{"a.b-c.1", true, ""},
		{"1.2.3", true, ""},     // three parts: not an IPv4 address
		{"1.2.3.4.5", true, ""}, // five parts either
		{"xn-b", true, ""},      // "xn--" only is reserved
		{"s3alias-b", true, ""}, // the suffix only
		{"", false, "no bucket name"},
		{"ab", false, "3 to 63"},
		{strings.Repeat("a", 64), false, "3 to 63"},
		{"My_Bucket", false, "only lowercase letters"},
		{"my_bucket", false, "only lowercase letters"},
		{"-bad-", false, "start and end"},
		{"bad-", false, "start and end"},
		{".bad", false, "start and end"},
		{"a..b", false, `".."`},
		{"a.-b", false, `".-"`},
		{"a-.b", false, `"-."`},
		{"192.168.5.4", false, "IP address"},
		{"999.1.1.1", false, "IP address"},
		{"xn--bucket", false, `"xn--"`},
		{"sthree-bucket", false, `"sthree-"`},
		{"amzn-s3-demo-bucket", false, `"amzn-s3-demo-"`},
		{"bucket-s3alias", false, `"-s3alias"`},
		{"bucket--ol-s3", false, `"--ol-s3"`},
		{"bucket.mrap", false, `".mrap"`},
		{"bucket--x-s3", false, `"--x-s3"`},
		{"bucket--table-s3", false, `"--table-s3"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckBucket(c.name)
			if (err == nil) != c.ok {
				t.Fatalf("CheckBucket(%q) = %v, want ok=%v", c.name, err, c.ok)
			}
			if err != nil && !strings.Contains(err.Error(), c.why) {
				t.Fatalf("CheckBucket(%q) = %q, want it to say %q", c.name, err, c.why)
			}
		})
	}
}

// TestParseS3Refuses: the URL parser refuses what CheckBucket refuses.
func TestParseS3Refuses(t *testing.T) {
	for _, in := range []string{"s3://", "s3:///x", "s3://1.2.3.4/x", "s3://xn--a/x", "s3://a-s3alias/x", "s3://a..b/x"} {
		if u, err := ParseS3(in); err == nil {
			t.Errorf("ParseS3(%q) = %+v, want an error", in, u)
		}
	}
}

func TestCheckRunName(t *testing.T) {
	for _, ok := range []string{"memsnap", "run-1", "mpi-1234", "a.b_c", "12345", "é"} {
		if err := CheckRunName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "../x", "a b", "a\tb", "a\nb", "a\\b", "\x7f", "\xff", strings.Repeat("x", MaxRunNameLen+1)} {
		if err := CheckRunName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
