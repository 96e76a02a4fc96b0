package snapshot

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/klauspost/compress/zstd"
)

// MaxDecompressed bounds how many bytes a compressed snapshot may expand to.
var MaxDecompressed int64 = 16 << 30

var errTooBig = errors.New("snapshot: decompressed size exceeds the limit")

// Unwrap returns the pickle bytes inside data, decompressing gzip and zstd
// transparently (recognised by their magic numbers, whatever the file is called).
func Unwrap(data []byte) ([]byte, error) {
	switch {
	case len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b:
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("snapshot: gzip: %w", err)
		}
		return readLimited(zr, "gzip")
	case len(data) >= 4 && data[0] == 0x28 && data[1] == 0xb5 && data[2] == 0x2f && data[3] == 0xfd:
		zr, err := zstd.NewReader(bytes.NewReader(data), zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(uint64(MaxDecompressed)))
		if err != nil {
			return nil, fmt.Errorf("snapshot: zstd: %w", err)
		}
		defer zr.Close()
		return readLimited(zr, "zstd")
	}
	return data, nil
}

func readLimited(r io.Reader, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxDecompressed+1))
	if err != nil {
		return nil, fmt.Errorf("snapshot: %s: %w", what, err)
	}
	if int64(len(b)) > MaxDecompressed {
		return nil, fmt.Errorf("%w (%d bytes)", errTooBig, MaxDecompressed)
	}
	return b, nil
}

// DecodeAny decodes a snapshot that may be gzip- or zstd-compressed.
func DecodeAny(data []byte) (*Snapshot, error) {
	raw, err := Unwrap(data)
	if err != nil {
		return nil, err
	}
	return Decode(raw)
}

// ReadFile reads and decodes a snapshot file (plain, .gz or .zst).
func ReadFile(path string) (*Snapshot, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	s, err := DecodeAny(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}
