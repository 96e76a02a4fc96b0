package main

import (
	"strings"
	"testing"
	"time"
)

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

func TestParseTriggers(t *testing.T) {
	tr, err := parseTriggers("5%", "256MiB/20", time.Minute)
	if err != nil || tr.HeadroomRatio != 0.05 || tr.HeadroomBytes != 0 || tr.GrowthBytes != 256<<20 || tr.GrowthBatches != 20 || tr.Cooldown != time.Minute {
		t.Fatalf("%+v %v", tr, err)
	}
	tr, err = parseTriggers("2GiB", "64MiB", time.Minute)
	if err != nil || tr.HeadroomBytes != 2<<30 || tr.GrowthBatches != 10 {
		t.Fatalf("%+v %v", tr, err)
	}
	if tr, err := parseTriggers("", "", time.Minute); err != nil || tr.Enabled() {
		t.Fatalf("no triggers: %+v %v", tr, err)
	}
	if _, err := parseTriggers("5%", "", 0); err == nil {
		t.Error("a cooldown of 0: no error")
	}
	for _, c := range [][2]string{{"0%", ""}, {"100%", ""}, {"-3%", ""}, {"x%", ""}, {"0", ""}, {"lots", ""}, {"", "0"}, {"", "1GiB/0"}, {"", "1GiB/x"}, {"", "/10"}, {"5", ""}, {"1.5", ""}} {
		if tr, err := parseTriggers(c[0], c[1], time.Minute); err == nil {
			t.Errorf("parseTriggers(%q, %q) = %+v, want an error", c[0], c[1], tr)
		}
	}
	if _, err := parseTriggers("5", "", time.Minute); err == nil || !strings.Contains(err.Error(), "a share needs its % (5%)") {
		t.Errorf("a bare number of headroom (5 bytes, or 5%%?): %v", err)
	}
}
