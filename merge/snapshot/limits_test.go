package snapshot

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// spentOn decodes data with no budget and returns what the decode charged.
func spentOn(t *testing.T, data []byte) int64 {
	t.Helper()
	d := newDecoder(context.Background(), data, 1<<62)
	if _, err := d.run(); err != nil {
		t.Fatal(err)
	}
	return d.budget - d.left
}

func gzipBest(t *testing.T, b []byte) []byte {
	var out bytes.Buffer
	w, err := gzip.NewWriterLevel(&out, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(b)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func zstdBest(t *testing.T, b []byte) []byte {
	w, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedBestCompression))
	if err != nil {
		t.Fatal(err)
	}
	return w.EncodeAll(b, nil)
}

// TestRealSnapshotsWithinLimits checks that real snapshots stay well inside the
// caps: they compress by a third of MaxRatio at most, and decoding one spends at
// most half its budget, counted by the pickle's size or by its compressed size.
func TestRealSnapshotsWithinLimits(t *testing.T) {
	for _, f := range allSnapshots(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		spent := spentOn(t, data)
		gz, zs := gzipBest(t, data), zstdBest(t, data)
		t.Logf("%s/%s: %d bytes; builds %.1f bytes per byte; gzip -9 %.1fx, zstd %.1fx",
			filepath.Base(filepath.Dir(f)), filepath.Base(f), len(data), float64(spent)/float64(len(data)),
			float64(len(data))/float64(len(gz)), float64(len(data))/float64(len(zs)))
		if 2*spent > Budget(len(data)) {
			t.Errorf("%s: decoding spends %d of a budget of %d", f, spent, Budget(len(data)))
		}
		for _, c := range [][]byte{gz, zs} {
			if 3*len(c)*MaxRatio < len(data) {
				t.Errorf("%s: compresses %d times, within three times of MaxRatio %d", f, len(data)/len(c), MaxRatio)
			}
			if 2*spent > BudgetBase+BudgetPerCompressedByte*int64(len(c)) {
				t.Errorf("%s: decoding spends %d bytes, more than half of what %d compressed bytes allow", f, spent, len(c))
			}
			s, err := DecodeAny(c)
			if err != nil || len(s.DeviceTraces) == 0 {
				t.Errorf("%s compressed: %v", f, err)
			}
		}
	}
}

// allocatedBy runs f and returns how many bytes it allocated.
func allocatedBy(f func()) uint64 {
	before := memAllocated()
	f()
	return memAllocated() - before
}

// gzipBomb returns about 1 MiB of gzip that expands to 1 GiB of zeros: copies of
// one member, each 128 MiB.
func gzipBomb(t *testing.T) []byte {
	var m bytes.Buffer
	w, err := gzip.NewWriterLevel(&m, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(w, io.LimitReader(repeatByte(0), 128<<20)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	return bytes.Repeat(m.Bytes(), 8)
}

func TestGzipBombRefused(t *testing.T) {
	bomb := gzipBomb(t)
	limit := limitFor(len(bomb))
	t.Logf("%d bytes of gzip expanding to 1 GiB; the limit is %d bytes", len(bomb), limit)
	// an honest bomb declares its size (ISIZE) and is refused unread
	var err error
	used := allocatedBy(func() { _, err = DecodeAny(bomb) })
	if !errors.Is(err, errTooBig) {
		t.Fatalf("want a refusal, got %v", err)
	}
	if used > 1<<20 {
		t.Errorf("refusing a bomb that declares its size allocated %d bytes", used)
	}
	// one that lies about its size is decompressed up to the limit, no further
	binary.LittleEndian.PutUint32(bomb[len(bomb)-4:], 1000)
	used = allocatedBy(func() { _, err = DecodeAny(bomb) })
	if !errors.Is(err, errTooBig) {
		t.Fatalf("want a refusal, got %v", err)
	}
	if used > uint64(limit)+4<<20 {
		t.Errorf("refusing a bomb allocated %d bytes, limit %d", used, limit)
	}
	t.Logf("refused after allocating %d bytes (%d per byte of input)", used, used/uint64(len(bomb)))
}

func TestZstdBombRefused(t *testing.T) {
	// 256 MiB of zeros in one streamed frame (no declared size), copied to 1 MiB
	var frame bytes.Buffer
	zw, err := zstd.NewWriter(&frame, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(zw, io.LimitReader(repeatByte(0), 256<<20)); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	bomb := bytes.Repeat(frame.Bytes(), (1<<20)/frame.Len()+1)
	limit := limitFor(len(bomb))
	used := allocatedBy(func() { _, err = DecodeAny(bomb) })
	if !errors.Is(err, errTooBig) {
		t.Fatalf("want a refusal, got %v", err)
	}
	if used > uint64(limit)+16<<20 { // the limit, plus the decoder's window
		t.Errorf("refusing %d bytes of zstd allocated %d bytes, limit %d", len(bomb), used, limit)
	}
	t.Logf("%d bytes of zstd expanding to %d GiB: refused after allocating %d bytes", len(bomb), len(bomb)/frame.Len()/4, used)
	// a frame that declares its size is refused unread
	w, _ := zstd.NewWriter(nil)
	declared := w.EncodeAll(make([]byte, 8<<20), nil)
	used = allocatedBy(func() { _, err = DecodeAny(declared) })
	if !errors.Is(err, errTooBig) || used > 1<<20 {
		t.Fatalf("a frame declaring 8 MiB in %d bytes: %v after allocating %d bytes", len(declared), err, used)
	}
}

// hostile builds pickles that make the decoder build as much as they can per byte:
// n bytes of body repeated inside the smallest frame that puts them where they
// cost most.
func hostile(n int) map[string][]byte {
	traces := append([]byte{opPROTO, 4, opEMPTY_DICT, opMARK}, shortStr("device_traces")...)
	traces = append(traces, opEMPTY_LIST, opMARK, opEMPTY_LIST) // device_traces, trace 0
	build := func(prefix []byte, unit []byte, close byte) []byte {
		b := bytes.NewBuffer(append([]byte(nil), prefix...))
		for b.Len() < n {
			b.WriteByte(opMARK)
			for i := 0; i < 1000; i++ {
				b.Write(unit)
			}
			b.WriteByte(close)
		}
		return b.Bytes()
	}
	entryFrames := append(append([]byte(nil), traces...), opMARK, opEMPTY_DICT, opMARK)
	entryFrames = append(entryFrames, shortStr("frames")...)
	entryFrames = append(entryFrames, opEMPTY_LIST)
	list := []byte{opPROTO, 4, opEMPTY_LIST}
	return map[string][]byte{
		"trace entries":    build(traces, []byte{opEMPTY_DICT}, opAPPENDS),
		"frames":           build(entryFrames, []byte{opEMPTY_DICT}, opAPPENDS),
		"generic lists":    build(list, []byte{opEMPTY_LIST}, opAPPENDS),
		"memoised values":  build(list, []byte{opNONE, opMEMOIZE}, opAPPENDS),
		"one-item tuples":  build(list, []byte{opNONE, opTUPLE1}, opAPPENDS),
		"empty strings":    build(list, []byte{opSHORT_BINUNICODE, 0}, opAPPENDS),
		"memo references":  build(append(list, opNONE, opMEMOIZE, opEMPTY_LIST), []byte{opBINGET, 0}, opAPPENDS),
		"dict items":       build([]byte{opPROTO, 4, opEMPTY_DICT}, []byte{opNONE, opNONE}, opSETITEMS),
		"values on stack":  append([]byte{opPROTO, 4}, bytes.Repeat([]byte{opNONE}, n)...),
		"marks":            append([]byte{opPROTO, 4}, bytes.Repeat([]byte{opMARK}, n)...),
		"entries in a row": append(append([]byte(nil), traces...), append([]byte{opMARK}, bytes.Repeat([]byte{opEMPTY_DICT}, n)...)...),
	}
}

// stackBound is what the decoder's stack and marks may allocate apart from the
// budget: arrays doubling up to maxStack values and maxMarks marks.
const stackBound = 2*maxStack*sizeVal + 2*maxMarks*8

// TestHostilePicklesBounded decodes 1 MiB pickles built to allocate as much as they
// can per byte: each is refused, allocating no more than its budget plus the
// stack's bound; the costliest are refused by the budget itself, early.
func TestHostilePicklesBounded(t *testing.T) {
	const n = 1 << 20
	for name, data := range hostile(n) {
		var err error
		used := allocatedBy(func() { _, err = Decode(data) })
		t.Logf("%-16s %d bytes: %d bytes allocated (%.1f per byte): %v", name, len(data), used, float64(used)/float64(len(data)), err)
		var de *DecodeError
		if !errors.As(err, &de) {
			t.Errorf("%s: want a DecodeError, got %v", name, err)
			continue
		}
		if limit := uint64(Budget(len(data))+stackBound) + 1<<20; used > limit {
			t.Errorf("%s: allocated %d bytes for %d of input, more than %d", name, used, len(data), limit)
		}
		switch name {
		case "trace entries", "frames":
			if !errors.Is(err, ErrBudget) || de.Offset >= len(data)/4 {
				t.Errorf("%s: want the budget to refuse it within the first quarter, got %v", name, err)
			}
		}
	}
}

// TestCompressedHostilePickleBounded compresses a hostile pickle with enough noise
// to stay under MaxRatio: its decode is bounded by the compressed size, far below
// what the pickle's own size would allow.
func TestCompressedHostilePickleBounded(t *testing.T) {
	var b bytes.Buffer
	b.Write([]byte{opPROTO, 4, opEMPTY_DICT, opMARK})
	b.Write(shortStr("device_traces"))
	b.Write([]byte{opEMPTY_LIST, opMARK, opEMPTY_LIST})
	noise := uint32(1)
	for b.Len() < 16<<20 {
		b.WriteByte(opMARK)
		for i := 0; i < 200; i++ {
			b.WriteByte(opEMPTY_DICT)
		}
		noise = noise*1664525 + 1013904223
		b.WriteByte(opBININT)
		b.Write(binary.LittleEndian.AppendUint32(nil, noise))
		b.WriteByte(opAPPENDS)
	}
	data := b.Bytes()
	gz := gzipBest(t, data)
	if len(gz)*MaxRatio < len(data) {
		t.Fatalf("the pickle compresses %d times, past MaxRatio", len(data)/len(gz))
	}
	var err error
	used := allocatedBy(func() { _, err = DecodeAny(gz) })
	var de *DecodeError
	if !errors.As(err, &de) || !errors.Is(err, ErrBudget) {
		t.Fatalf("want the budget to refuse it, got %v", err)
	}
	budget := BudgetBase + BudgetPerCompressedByte*int64(len(gz))
	if limit := uint64(int64(len(data))+budget+stackBound) + 1<<20; used > limit {
		t.Errorf("%d bytes of gzip: allocated %d, more than %d", len(gz), used, limit)
	}
	t.Logf("%d bytes of gzip, %d of pickle: refused at byte %d after allocating %d bytes", len(gz), len(data), de.Offset, used)
}

// countdown is a context that is done after its Err has been asked left times.
type countdown struct {
	context.Context
	left atomic.Int32
	done chan struct{}
}

func newCountdown(n int32) *countdown {
	c := &countdown{Context: context.Background(), done: make(chan struct{})}
	c.left.Store(n)
	return c
}

func (c *countdown) Done() <-chan struct{} { return c.done }

func (c *countdown) Err() error {
	if c.left.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

func TestDecodeStopsWhenCancelled(t *testing.T) {
	data := benchPickle(t, 50000)
	if _, err := DecodeContext(newCountdown(1<<30), data); err != nil {
		t.Fatalf("decoding with a live context: %v", err)
	}
	// the context is done at its fourth look: the decode stops a few thousand
	// opcodes in, far from the end
	_, err := DecodeContext(newCountdown(3), data)
	var de *DecodeError
	if !errors.As(err, &de) || !errors.Is(err, context.Canceled) {
		t.Fatalf("want a DecodeError wrapping context.Canceled, got %v", err)
	}
	if de.Offset <= 0 || de.Offset > len(data)/4 {
		t.Fatalf("stopped at byte %d of %d", de.Offset, len(data))
	}
	// a context done before the start stops it at once, reading and decoding
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := DecodeAnyContext(ctx, data); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled before the start: %v", err)
	}
	p := filepath.Join(t.TempDir(), "big.pickle")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, read := range []func() error{
		func() error { _, err := ReadFileContext(ctx, p); return err },
		func() error { _, err := ReadFileBytes(ctx, p); return err },
		func() error { _, err := DecodeAnyContext(ctx, gzipBest(t, data)); return err },
	} {
		if err := read(); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled before the start: %v", err)
		}
	}
}

// benchPickle encodes a snapshot of n trace entries with frames.
func benchPickle(t *testing.T, n int) []byte {
	t.Helper()
	fr := []*Frame{{Name: "f", Filename: "a.py", Line: 1, Has: FrameName | FrameFilename | FrameLine}}
	es := make([]*TraceEntry, n)
	for i := range es {
		es[i] = &TraceEntry{Action: ActionAlloc, Addr: int64(i) << 9, Size: 512, TimeUS: int64(i), Frames: fr,
			Has: EntryAction | EntryAddr | EntrySize | EntryTimeUS | EntryFrames}
	}
	data, err := EncodeBytes(&Snapshot{DeviceTraces: [][]*TraceEntry{es}, Has: SnapSegments | SnapDeviceTraces})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestReadRefusesNonRegularFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.pickle")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	paths := map[string]string{fifo: "named pipe", dir: "folder"}
	if _, err := os.Stat("/dev/zero"); err == nil {
		paths["/dev/zero"] = "character device"
	}
	for p, what := range paths {
		for _, read := range []func() error{
			func() error { _, err := ReadFile(p); return err },
			func() error { _, err := ReadFileBytes(context.Background(), p); return err },
		} {
			err := read()
			if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), what) || !strings.Contains(err.Error(), p) {
				t.Errorf("%s: want a refusal naming a %s, got %v", p, what, err)
			}
		}
	}
	// a FIFO met at the open, past the first look, is refused without blocking
	// for a writer
	if _, _, err := openRegular(fifo); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("opening a FIFO: %v", err)
	}
}

func TestReadFileBounded(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.pickle")
	data := benchPickle(t, 100)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	defer func(m int64) { MaxFileSize = m }(MaxFileSize)
	MaxFileSize = int64(len(data)) - 1
	if _, err := ReadFile(p); !errors.Is(err, ErrFileTooLarge) {
		t.Fatalf("a file over MaxFileSize: %v", err)
	}
	MaxFileSize = int64(len(data))
	if _, err := ReadFile(p); err != nil {
		t.Fatalf("a file of MaxFileSize bytes: %v", err)
	}
}

// TestMappedFileCutShort cuts a file short while it is mapped: decoding it then
// faults, and the fault is an error, not a crash.
func TestMappedFileCutShort(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.pickle")
	if err := os.WriteFile(p, benchPickle(t, 5000), 0o644); err != nil {
		t.Fatal(err)
	}
	f, size, err := openFile(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data, unmap, ok := mapFile(f, size)
	if !ok {
		// CI runs on Linux, where a temporary file maps: there a failed mapping is
		// a failure, never a quiet skip of the test
		if os.Getenv("CI") == "true" {
			t.Fatal("the file could not be mapped under CI=true")
		}
		t.Skip("no file mappings here")
	}
	defer unmap()
	if err := os.Truncate(p, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := decodeMapped(context.Background(), data); !errors.Is(err, ErrFileChanged) {
		t.Fatalf("want ErrFileChanged, got %v", err)
	}
}
