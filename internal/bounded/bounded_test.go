package bounded

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	if b, err := Read(strings.NewReader("12345"), "five", 5); err != nil || string(b) != "12345" {
		t.Fatalf("as much as the limit: %q %v", b, err)
	}
	_, err := Read(strings.NewReader("123456"), "six", 5)
	if !errors.Is(err, ErrTooLarge) || err.Error() != "six is larger than 5 bytes" {
		t.Fatalf("more than the limit: %v", err)
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, mode := range []os.FileMode{0o600, 0o400, 0o640, 0o440} {
		if b, err := ReadSecretFile(write("ok", "secret", mode), "the key file", 16); err != nil || string(b) != "secret" {
			t.Errorf("mode %o: %q %v", mode, b, err)
		}
	}
	for _, mode := range []os.FileMode{0o660, 0o644, 0o604, 0o670} {
		if _, err := ReadSecretFile(write("open", "secret", mode), "the key file", 16); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Errorf("mode %o: %v", mode, err)
		}
	}
	if _, err := ReadSecretFile(write("big", strings.Repeat("x", 17), 0o600), "the key file", 16); !errors.Is(err, ErrTooLarge) ||
		!strings.HasPrefix(err.Error(), "the key file: ") {
		t.Errorf("a file over the limit: %v", err)
	}
	if _, err := ReadSecretFile(filepath.Join(dir, "none"), "the key file", 16); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("no file: %v", err)
	}
}
