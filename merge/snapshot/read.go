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

// MaxRatio bounds how many times its own size a compressed snapshot may expand to:
// above deflate's limit (about 1032) and far above what pickles compress by, so a
// small hostile input cannot make the decoder allocate without bound.
const MaxRatio = 1100

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
		return readLimited(zr, "gzip", limitFor(len(data)))
	case len(data) >= 4 && data[0] == 0x28 && data[1] == 0xb5 && data[2] == 0x2f && data[3] == 0xfd:
		limit := limitFor(len(data))
		zr, err := zstd.NewReader(bytes.NewReader(data), zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxMemory(uint64(limit)), zstd.WithDecoderMaxWindow(min(uint64(limit), 1<<27)))
		if err != nil {
			return nil, fmt.Errorf("snapshot: zstd: %w", err)
		}
		defer zr.Close()
		return readLimited(zr, "zstd", limit)
	}
	return data, nil
}

func limitFor(n int) int64 {
	return min(MaxDecompressed, int64(n)*MaxRatio+1<<20)
}

// readLimited reads r whole in 1 MiB chunks, refusing more than limit bytes; a
// refusal allocates at most limit plus one chunk.
func readLimited(r io.Reader, what string, limit int64) ([]byte, error) {
	var chunks [][]byte
	var n int64
	for {
		c := make([]byte, 1<<20)
		k, err := io.ReadFull(r, c)
		n += int64(k)
		if n > limit {
			return nil, fmt.Errorf("%w: more than %d bytes (%d times the compressed size, or %d)", errTooBig, limit, MaxRatio, MaxDecompressed)
		}
		chunks = append(chunks, c[:k])
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("snapshot: %s: %w", what, err)
		}
	}
	out := make([]byte, 0, n)
	for _, c := range chunks {
		out = append(out, c...)
	}
	return out, nil
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
