// Package termtext makes text from elsewhere (a member's host name, a reason
// from the store or the API) safe to print on a terminal: it cannot move the
// cursor, clear the screen, break a table's row or reorder what follows it.
// It does no I/O.
package termtext

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Unsafe reports whether r must not reach a terminal as it is: a control
// character (C0, DEL, C1: a terminal's escapes begin with them), a format
// character (the bidirectional overrides among them) or an invalid byte.
func Unsafe(r rune) bool {
	return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == utf8.RuneError || unicode.Is(unicode.Cf, r)
}

// Escape returns s with every unsafe character written as its Go escape
// (`\x1b`, `\n`, `\u202e`; an invalid byte as `\xff`), cut to at most n bytes
// with "…" (n <= 0: not cut). Text with nothing unsafe is returned as it is.
func Escape(s string, n int) string {
	if strings.IndexFunc(s, Unsafe) >= 0 || !utf8.ValidString(s) {
		var b strings.Builder
		for i := 0; i < len(s); {
			r, size := utf8.DecodeRuneInString(s[i:])
			switch {
			case r == utf8.RuneError && size <= 1:
				fmt.Fprintf(&b, `\x%02x`, s[i])
			case r == '\t':
				b.WriteString(`\t`)
			case r == '\n':
				b.WriteString(`\n`)
			case r == '\r':
				b.WriteString(`\r`)
			case Unsafe(r) && r < 0x100:
				fmt.Fprintf(&b, `\x%02x`, r)
			case Unsafe(r):
				fmt.Fprintf(&b, `\u%04x`, r)
			default:
				b.WriteRune(r)
			}
			i += size
		}
		s = b.String()
	}
	return Cut(s, n)
}

// Cut cuts s to at most n bytes, ending with "…" where it cut, never inside a
// character (n <= 0: not cut).
func Cut(s string, n int) string {
	if n <= 0 || len(s) <= n {
		return s
	}
	i := max(n-len("…"), 0)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}
