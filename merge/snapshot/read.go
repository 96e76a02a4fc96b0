package snapshot

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime/debug"
	"syscall"

	"github.com/klauspost/compress/zstd"
)

// MaxFileSize bounds how many bytes ReadFile and ReadFileBytes read from one file.
var MaxFileSize int64 = 4 << 30

// MaxDecompressed bounds how many bytes a compressed snapshot may expand to.
var MaxDecompressed int64 = 4 << 30

// MaxRatio bounds how many times its own size a compressed snapshot may expand to
// (plus 1 MiB, for small files). The real snapshots under testdata expand 2.2 to
// 14 times under gzip -9 and zstd -19, and a 100,000-event trace synthesised by
// repeating a recorded one (scripts/bench-cli.sh) 14.5 and 21.5 times: the bound
// leaves three times that, and keeps a small hostile file from becoming a large
// pickle (deflate alone allows 1032 times).
const MaxRatio = 64

var errTooBig = errors.New("snapshot: decompressed size exceeds the limit")

// ErrNotRegular is wrapped when a path names something other than a regular file
// (a FIFO, a device, a socket, a folder): such files are refused before reading,
// since reading one may never end.
var ErrNotRegular = errors.New("snapshot: not a regular file")

// ErrFileTooLarge is wrapped when a file holds more than MaxFileSize bytes.
var ErrFileTooLarge = errors.New("snapshot: file too large")

// Unwrap returns the pickle bytes inside data, decompressing gzip and zstd
// transparently (recognised by their magic numbers, whatever the file is called).
func Unwrap(data []byte) ([]byte, error) {
	raw, _, err := unwrap(context.Background(), data)
	return raw, err
}

// unwrap is Unwrap that stops when ctx is done; it also says whether data was
// compressed.
func unwrap(ctx context.Context, data []byte) ([]byte, bool, error) {
	var (
		what string
		r    io.Reader
		hint int64 // the size the data declares, if any
	)
	limit := limitFor(len(data))
	switch {
	case isGzip(data):
		// ISIZE, the last four bytes, is the last member's size modulo 2^32: the
		// whole output is at least that, so a larger one is refused unread
		if len(data) >= 18 {
			if hint = int64(binary.LittleEndian.Uint32(data[len(data)-4:])); hint > limit {
				return nil, true, tooBig(limit)
			}
		}
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, true, fmt.Errorf("snapshot: gzip: %w", err)
		}
		what, r = "gzip", zr
	case isZstd(data):
		// a frame that declares its size is refused unread when that is too large
		var h zstd.Header
		if h.Decode(data) == nil && h.HasFCS {
			if h.FrameContentSize > uint64(limit) {
				return nil, true, tooBig(limit)
			}
			hint = int64(h.FrameContentSize)
		}
		// the window may exceed a small file's limit: streaming encoders declare 8 MiB
		window := uint64(min(max(limit, 8<<20), 1<<27))
		zr, err := zstd.NewReader(bytes.NewReader(data), zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxMemory(window), zstd.WithDecoderMaxWindow(window))
		if err != nil {
			return nil, true, fmt.Errorf("snapshot: zstd: %w", err)
		}
		defer zr.Close()
		what, r = "zstd", zr
	default:
		return data, false, nil
	}
	raw, err := readLimited(ctx, r, what, limit, hint)
	return raw, true, err
}

func isGzip(data []byte) bool { return len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b }

func isZstd(data []byte) bool {
	return len(data) >= 4 && data[0] == 0x28 && data[1] == 0xb5 && data[2] == 0x2f && data[3] == 0xfd
}

func limitFor(n int) int64 {
	return min(MaxDecompressed, int64(n)*MaxRatio+1<<20)
}

func tooBig(limit int64) error {
	return fmt.Errorf("%w: more than %d bytes (%d times the compressed size plus 1 MiB, at most %d)", errTooBig, limit, MaxRatio, MaxDecompressed)
}

// readLimited reads r whole, refusing more than limit bytes and stopping when ctx
// is done. hint is the size r declares (0 when none): a file that tells the truth
// is read into one array of that size; past it, or without one, the rest comes in
// 1 MiB chunks joined at the end, so a refusal allocates at most limit plus one
// chunk.
func readLimited(ctx context.Context, r io.Reader, what string, limit, hint int64) ([]byte, error) {
	var chunks [][]byte
	var n int64
	size := min(hint, limit) + 1 // one more, to see the end
	if hint <= 0 {
		size = 1 << 20
	}
	for {
		c := make([]byte, min(size, limit-n+1))
		k, err := fill(ctx, r, c)
		n += int64(k)
		if n > limit {
			return nil, tooBig(limit)
		}
		chunks = append(chunks, c[:k])
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("snapshot: %s: %w", what, err)
		}
		size = 1 << 20
	}
	if len(chunks) == 1 {
		return chunks[0], nil
	}
	out := make([]byte, 0, n)
	for _, c := range chunks {
		out = append(out, c...)
	}
	return out, nil
}

// fill reads r into b until b is full (nil) or r ends (io.EOF), looking at ctx
// between reads of readChunk bytes.
func fill(ctx context.Context, r io.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		k, err := io.ReadFull(r, b[n:min(len(b), n+readChunk)])
		n += k
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return n, io.EOF
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// DecodeAny decodes a snapshot that may be gzip- or zstd-compressed.
func DecodeAny(data []byte) (*Snapshot, error) {
	return DecodeAnyContext(context.Background(), data)
}

// DecodeAnyContext is DecodeAny that stops when ctx is done. A compressed
// snapshot's decode is bounded by the compressed size too: it may build at most
// BudgetBase plus BudgetPerCompressedByte per compressed byte.
func DecodeAnyContext(ctx context.Context, data []byte) (*Snapshot, error) {
	raw, compressed, err := unwrap(ctx, data)
	if err != nil {
		return nil, err
	}
	budget := Budget(len(raw))
	if compressed {
		budget = min(budget, BudgetBase+BudgetPerCompressedByte*int64(len(data)))
	}
	return decodeBudget(ctx, raw, budget)
}

// ReadFile reads and decodes a snapshot file (plain, .gz or .zst).
func ReadFile(path string) (*Snapshot, error) {
	return ReadFileContext(context.Background(), path)
}

// ReadFileContext is ReadFile that stops when ctx is done. Only regular files of
// at most MaxFileSize bytes are read, as by ReadFileBytes. An uncompressed file is
// decoded straight from a read-only mapping of it where the system has one (no
// copy, and the page cache's pages are not faulted in one by one): a file cut
// short under the mapping then fails the decode instead of crashing the process.
func ReadFileContext(ctx context.Context, path string) (*Snapshot, error) {
	f, size, err := openFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if mapped, unmap, ok := mapFile(f, size); ok {
		s, compressed, err := decodeMapped(ctx, mapped)
		unmap()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if !compressed {
			return s, nil
		}
	}
	data, err := readAll(ctx, f, path, size)
	if err != nil {
		return nil, err
	}
	s, err := DecodeAnyContext(ctx, data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// ErrFileChanged is wrapped when a mapped file is cut short while it is decoded.
var ErrFileChanged = errors.New("snapshot: the file changed while it was read")

// decodeMapped decodes a pickle mapped from a file, or says that the file is
// compressed (and decodes nothing): reading a page the file no longer holds
// faults, and the fault, made a panic, becomes an error.
func decodeMapped(ctx context.Context, data []byte) (s *Snapshot, compressed bool, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			fault, ok := r.(interface{ Addr() uintptr })
			if !ok {
				panic(r)
			}
			s, compressed, err = nil, false, fmt.Errorf("%w (a fault at %#x)", ErrFileChanged, fault.Addr())
		}
	}()
	if isGzip(data) || isZstd(data) {
		return nil, true, nil
	}
	s, err = decodeBudget(ctx, data, Budget(len(data)))
	return s, false, err
}

// readChunk is how much ReadFileBytes reads between two looks at the context.
const readChunk = 4 << 20

// ReadFileBytes reads a whole regular file of at most MaxFileSize bytes, stopping
// when ctx is done. Anything else (a FIFO, a device such as /dev/zero, a socket, a
// folder) is refused before reading, with an error wrapping ErrNotRegular: the path
// is looked at first, and opened without blocking, so a FIFO swapped in between
// the look and the open cannot hang the read either.
func ReadFileBytes(ctx context.Context, path string) ([]byte, error) {
	f, size, err := openFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAll(ctx, f, path, size)
}

// openFile opens a regular file of at most MaxFileSize bytes for reading and
// returns it with its size.
func openFile(path string) (*os.File, int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, 0, fmt.Errorf("snapshot: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, 0, notRegular(path, fi.Mode())
	}
	f, size, err := openRegular(path)
	if err != nil {
		return nil, 0, err
	}
	if size > MaxFileSize {
		f.Close()
		return nil, 0, fmt.Errorf("%s: %w: %d bytes, more than %d", path, ErrFileTooLarge, size, MaxFileSize)
	}
	return f, size, nil
}

// readAll reads f, of size bytes when it was opened, to its end, refusing more
// than MaxFileSize bytes.
func readAll(ctx context.Context, f *os.File, path string, size int64) ([]byte, error) {
	buf := make([]byte, 0, size+1) // one more, to see the end without growing
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := f.Read(buf[len(buf):min(cap(buf), len(buf)+readChunk)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > MaxFileSize {
			return nil, fmt.Errorf("%s: %w: more than %d bytes", path, ErrFileTooLarge, MaxFileSize)
		}
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
	}
}

// openRegular opens path for reading without blocking (opening a FIFO with no
// writer would otherwise wait for one) and refuses it unless it is a regular file.
// It returns the file and its size.
func openRegular(path string) (*os.File, int64, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("snapshot: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("snapshot: %w", err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, notRegular(path, fi.Mode())
	}
	return f, fi.Size(), nil
}

func notRegular(path string, m fs.FileMode) error {
	what := "not a plain file"
	switch {
	case m&fs.ModeNamedPipe != 0:
		what = "a named pipe (FIFO)"
	case m&fs.ModeCharDevice != 0:
		what = "a character device"
	case m&fs.ModeDevice != 0:
		what = "a device"
	case m&fs.ModeSocket != 0:
		what = "a socket"
	case m.IsDir():
		what = "a folder"
	case m&fs.ModeIrregular != 0:
		what = "an irregular file"
	}
	return fmt.Errorf("%s: %w: it is %s", path, ErrNotRegular, what)
}
