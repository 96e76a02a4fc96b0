package snapshot

import (
	"testing"

	"github.com/klauspost/compress/zstd"
)

func zstdCompress(t *testing.T, b []byte) []byte {
	w, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	return w.EncodeAll(b, nil)
}
