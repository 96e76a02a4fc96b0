package coordinator

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/memsnap/memsnap/internal/bounded"
)

// LabelFor is the gossip label of a run: members of another run drop its packets.
func LabelFor(run string) string { return "memsnap/" + run }

// KeyEnv is the environment variable a gossip key may come from.
const KeyEnv = "MEMSNAP_KEY"

// ParseKey decodes a gossip key: base64 (standard or URL alphabet) of 16, 24 or 32
// bytes, as `memsnap keygen` prints.
func ParseKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			if len(b) != 16 && len(b) != 24 && len(b) != 32 {
				return nil, fmt.Errorf("coordinator: the gossip key is %d bytes; it must be 16, 24 or 32", len(b))
			}
			return b, nil
		}
	}
	return nil, errors.New("coordinator: the gossip key is not base64 (make one with `memsnap keygen`)")
}

// LoadKey finds the gossip key: the flag's value, else the key file's (which must
// not be readable by others), else $MEMSNAP_KEY; nil when none is given.
func LoadKey(flag, file string, getenv func(string) string) ([]byte, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	switch {
	case flag != "":
		return ParseKey(flag)
	case file != "":
		b, err := bounded.ReadSecretFile(file, "coordinator: key file", 4096)
		if err != nil {
			return nil, err
		}
		return ParseKey(string(b))
	case getenv(KeyEnv) != "":
		return ParseKey(getenv(KeyEnv))
	}
	return nil, nil
}
