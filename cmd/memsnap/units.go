package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// byteUnits are the sizes a byte count may be written in: binary (KiB, MiB,
// GiB, TiB) and decimal (KB, MB, GB, TB), any case.
var byteUnits = []struct {
	suffix string
	n      float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// parseBytes reads a byte count: 1048576, 64MiB, 1.5GiB, 2GB.
func parseBytes(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range byteUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.n
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || t == "" || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%q is not a size (write it as 1048576, 64MiB or 1.5GiB)", s)
	}
	b := v * mult
	if b < 0 || b > 1<<60 {
		return 0, fmt.Errorf("%q is out of range (0 to 1 EiB)", s)
	}
	return int64(b), nil
}

// bytesFlag is a flag holding a byte count written as parseBytes reads it.
type bytesFlag struct{ n int64 }

func (f *bytesFlag) String() string { return strconv.FormatInt(f.n, 10) }
func (f *bytesFlag) Set(s string) error {
	n, err := parseBytes(s)
	if err != nil {
		return err
	}
	f.n = n
	return nil
}
