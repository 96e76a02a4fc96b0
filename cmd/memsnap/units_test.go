package main

import "testing"

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1048576": 1 << 20, "64MiB": 64 << 20, "1.5GiB": 3 << 29, "2GB": 2e9, " 3 kib ": 3 << 10, "7b": 7, "1M": 1 << 20} {
		got, err := parseBytes(in)
		if err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1MiB", "1e30", "NaN", "inf", "12 parsecs", "0x10"} {
		if got, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) = %d, want an error", in, got)
		}
	}
}

func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"64MiB", "1.5GiB", "-1", "1e18", "  2 gb"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseBytes(s)
		if err == nil && (n < 0 || n > 1<<60) {
			t.Fatalf("parseBytes(%q) = %d", s, n)
		}
	})
}
