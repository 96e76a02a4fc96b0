// Package digest names content by its SHA-256, as the claims, manifests and
// analyses of a merge record it: in lowercase hex.
package digest

import (
	"crypto/sha256"
	"encoding/hex"
)

// IsSHA256 reports whether s is a SHA-256 in hex.
func IsSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// SHA256Hex is the SHA-256 of b in hex.
func SHA256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}
