package analysis

import (
	"fmt"
	"math"
)

// HumanBytes formats bytes with binary units (KiB, MiB, ...).
func HumanBytes(n int64) string { return human(n) }

// human formats bytes with binary units.
func human(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	f := float64(n)
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		f /= unit
		if math.Abs(f) < unit {
			return fmt.Sprintf("%.1f %s", f, u)
		}
	}
	return fmt.Sprintf("%.1f PiB", f/unit)
}
