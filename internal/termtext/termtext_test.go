package termtext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestEscape: what could drive a terminal is written as escapes, the rest is
// kept, and a cut never splits a character.
func TestEscape(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"node1.example", "node1.example"},
		{"évian-ü", "évian-ü"},
		{"\x1b[2J\x1b]0;pwned\x07", `\x1b[2J\x1b]0;pwned\x07`},
		{"a\tb\nc\rd", `a\tb\nc\rd`},
		{"x\u202etxt.exe", `x\u202etxt.exe`},
		{"bad\xffbyte\u0085", `bad\xffbyte\x85`},
		{"\x7f", `\x7f`},
	} {
		if got := Escape(c.in, 0); got != c.want {
			t.Errorf("Escape(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	got := Escape(strings.Repeat("é", 100), 21)
	if len(got) > 21 || !strings.HasSuffix(got, "…") || !utf8.ValidString(got) {
		t.Fatalf("cut: %q (%d bytes)", got, len(got))
	}
}
