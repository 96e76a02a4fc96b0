// Package bounded reads what memsnap does not trust to be small (an object, a
// message, a server's answer, a secret's file) whole, up to a limit: more is an
// error that says so, never a silent cut.
package bounded

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrTooLarge is wrapped by the error of a read that found more than its limit.
var ErrTooLarge = errors.New("larger than its limit")

// tooLarge says what was larger than which limit.
type tooLarge struct {
	name  string
	limit int64
}

func (e tooLarge) Error() string        { return fmt.Sprintf("%s is larger than %d bytes", e.name, e.limit) }
func (e tooLarge) Is(target error) bool { return target == ErrTooLarge }

// Read reads r whole, refusing more than limit bytes: an error wrapping
// ErrTooLarge that says "NAME is larger than LIMIT bytes".
func Read(r io.Reader, name string, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	if int64(len(b)) > limit {
		return nil, tooLarge{name, limit}
	}
	return b, nil
}

// ReadSecretFile reads a secret (a key, a token) from the file at path, of at
// most limit bytes, refusing a file open to others or writable by its group: it
// is its owner's, and at most readable by its group (as Kubernetes' fsGroup makes
// a Secret's file, mode 0440). Its errors begin with what, the file's role ("--api-token-file").
func ReadSecretFile(path, what string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if st.Mode().Perm()&0o037 != 0 {
		return nil, fmt.Errorf("%s %s is open to others or writable by its group (mode %v); chmod 600 it (640 lets its group read it)", what, path, st.Mode().Perm())
	}
	b, err := Read(f, path, limit)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return b, nil
}
