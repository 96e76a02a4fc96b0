package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/memsnap/memsnap/internal/testutil"
)

func TestRefusedOpcodes(t *testing.T) {
	for op, name := range refused {
		t.Run(name, func(t *testing.T) {
			// a valid start, then the refused opcode where a value could go
			data := []byte{opPROTO, 4, opEMPTY_DICT, opMEMOIZE, op, 'x', 'y', '\n', 'z', '\n', opSTOP}
			_, err := Decode(data)
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("want a DecodeError, got %v", err)
			}
			if de.Offset != 4 || de.Op != name || !strings.Contains(err.Error(), "refused") {
				t.Fatalf("got %v (offset %d, op %q)", err, de.Offset, de.Op)
			}
		})
	}
	// GLOBAL names the reason: it could run code
	_, err := Decode([]byte("\x80\x02cos\nsystem\n(S'echo hi'\ntR."))
	if err == nil || !strings.Contains(err.Error(), "GLOBAL") || !strings.Contains(err.Error(), "run code") {
		t.Fatalf("GLOBAL: %v", err)
	}
}

func TestUnknownOpcodes(t *testing.T) {
	for op := 0; op < 256; op++ {
		b := byte(op)
		if _, ok := accepted[b]; ok {
			continue
		}
		data := []byte{opPROTO, 4, opEMPTY_DICT, b, opSTOP}
		if _, err := Decode(data); err == nil {
			t.Errorf("opcode 0x%02x accepted", b)
		}
	}
}

func memAllocated() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.TotalAlloc
}

// decodeBounded checks that decoding data fails without allocating more than limit bytes.
func decodeBounded(t *testing.T, name string, data []byte, limit uint64) {
	t.Helper()
	before := memAllocated()
	_, err := Decode(data)
	used := memAllocated() - before
	if err == nil {
		t.Errorf("%s: accepted", name)
	}
	if used > limit {
		t.Errorf("%s: allocated %d bytes (limit %d) for %d bytes of input: %v", name, used, limit, len(data), err)
	}
}

func TestHugeDeclaredLengths(t *testing.T) {
	u32 := func(n uint32) []byte { return binary.LittleEndian.AppendUint32(nil, n) }
	u64 := func(n uint64) []byte { return binary.LittleEndian.AppendUint64(nil, n) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	start := []byte{opPROTO, 4, opEMPTY_DICT, opMARK}
	cases := map[string][]byte{
		"BINUNICODE 4GiB":           cat(start, []byte{opBINUNICODE}, u32(0xffffffff), []byte("abc")),
		"BINUNICODE8 2^63":          cat(start, []byte{opBINUNICODE8}, u64(1<<63), []byte("abc")),
		"BINUNICODE8 2^64":          cat(start, []byte{opBINUNICODE8}, u64(^uint64(0)), []byte("abc")),
		"FRAME 2^62":                cat([]byte{opPROTO, 4, opFRAME}, u64(1<<62), []byte{opEMPTY_DICT}),
		"LONG1 255 bytes":           cat(start, []byte{opLONG1, 255}, bytes.Repeat([]byte{1}, 10)),
		"LONG1 too big":             cat(start, []byte{opLONG1, 9}, bytes.Repeat([]byte{0x7f}, 9), []byte{opSTOP}),
		"LONG_BINGET 2^32":          cat(start, []byte{opLONG_BINGET}, u32(0xffffffff)),
		"LONG_BINPUT sparse":        cat(start, []byte{opNONE, opLONG_BINPUT}, u32(0xfffffff0), []byte{opLONG_BINGET}, u32(0xfffffff0), []byte{opSETITEMS, opSTOP}),
		"SHORT_BINUNICODE past end": cat(start, []byte{opSHORT_BINUNICODE, 200}, []byte("ab")),
	}
	for name, data := range cases {
		decodeBounded(t, name, data, 1<<20)
	}
	// a memo index near 2^32 is legal; it must cost one entry, not a 2^32-entry memo
	sparse := cat([]byte{opPROTO, 4, opEMPTY_DICT, opMARK, opSHORT_BINUNICODE, 13}, []byte("device_traces"),
		[]byte{opEMPTY_LIST, opLONG_BINPUT}, u32(0xfffffff0), []byte{opSHORT_BINUNICODE, 1, 'y', opLONG_BINGET}, u32(0xfffffff0),
		[]byte{opSETITEMS, opSTOP})
	before := memAllocated()
	s, err := Decode(sparse)
	if err != nil || len(s.Extra) != 1 {
		t.Fatalf("sparse memo: %v", err)
	}
	if used := memAllocated() - before; used > 1<<20 {
		t.Fatalf("sparse memo allocated %d bytes", used)
	}
}

func TestDeepNesting(t *testing.T) {
	// a million nested lists: EMPTY_LIST repeated, never closed
	n := 1 << 21
	data := append([]byte{opPROTO, 4}, bytes.Repeat([]byte{opEMPTY_LIST}, n)...)
	data = append(data, opSTOP)
	_, err := Decode(data)
	if err == nil || !strings.Contains(err.Error(), "stack deeper") {
		t.Fatalf("deep stack: %v", err)
	}
	// a million MARKs
	data = append([]byte{opPROTO, 4, opEMPTY_DICT}, bytes.Repeat([]byte{opMARK}, n)...)
	if _, err := Decode(data); err == nil || !strings.Contains(err.Error(), "open marks") {
		t.Fatalf("many marks: %v", err)
	}
	// lists nested 100k deep, closed with APPEND: decodes within the stack bound,
	// and re-encoding refuses the depth instead of recursing without end
	depth := 100000
	var b bytes.Buffer
	b.Write([]byte{opPROTO, 4, opEMPTY_DICT, opMARK, opSHORT_BINUNICODE, 13})
	b.WriteString("device_traces")
	b.Write([]byte{opEMPTY_LIST, opSHORT_BINUNICODE, 1, 'x'})
	b.Write(bytes.Repeat([]byte{opEMPTY_LIST}, depth))
	b.Write(bytes.Repeat([]byte{opAPPEND}, depth-1))
	b.Write([]byte{opSETITEMS, opSTOP})
	s, err := Decode(b.Bytes())
	if err != nil {
		t.Fatalf("nested lists: %v", err)
	}
	if _, err := EncodeBytes(s); err == nil || !strings.Contains(err.Error(), "nest deeper") {
		t.Fatalf("encoding 100k-deep lists: want a depth error, got %v", err)
	}
	// and a plain dict is not a snapshot
	if _, err := Decode([]byte{opPROTO, 4, opEMPTY_DICT, opSTOP}); !errors.Is(err, ErrNotSnapshot) {
		t.Fatalf("empty dict: want ErrNotSnapshot, got %v", err)
	}
}

func TestTruncationEveryOffset(t *testing.T) {
	data, err := os.ReadFile(testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(data); i++ {
		_, err := Decode(data[:i])
		if err == nil {
			t.Fatalf("truncated at %d of %d: accepted", i, len(data))
		}
		var de *DecodeError
		if !errors.As(err, &de) && !errors.Is(err, ErrNotSnapshot) {
			t.Fatalf("truncated at %d: %v is not a DecodeError", i, err)
		}
	}
}

func TestNotASnapshot(t *testing.T) {
	for name, data := range map[string][]byte{
		"list":       {opPROTO, 4, opEMPTY_LIST, opSTOP},
		"int":        {opPROTO, 4, opBININT1, 5, opSTOP},
		"protocol 1": {'}', '.'},
		"protocol 9": {opPROTO, 9, opEMPTY_DICT, opSTOP},
		"empty":      {},
		"two values": {opPROTO, 4, opEMPTY_DICT, opEMPTY_DICT, opSTOP},
	} {
		if _, err := Decode(data); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzDecode(f *testing.F) {
	// small seeds: the fuzzer minimises what it finds, which is slow on large inputs
	seeds, _ := filepath.Glob(filepath.Join(testutil.RepoRoot(f), "testdata", "seeds", "*.pickle"))
	if len(seeds) < 4 {
		f.Fatal("testdata/seeds is missing")
	}
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{opPROTO, 4, opEMPTY_DICT, opSTOP})
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := DecodeAny(data)
		if err != nil {
			return
		}
		// anything accepted must re-encode and decode to the same figures
		out, err := EncodeBytes(s)
		if err != nil {
			return // e.g. nesting beyond the encoder's depth bound
		}
		s2, err := Decode(out)
		if err != nil {
			t.Fatalf("our own encoding does not decode: %v", err)
		}
		a, b := s.ComputeFigures(), s2.ComputeFigures()
		if a.Segments != b.Segments || a.ReservedBytes != b.ReservedBytes || len(a.Devices) != len(b.Devices) {
			t.Fatalf("figures changed through a round trip")
		}
	})
}

// shortStr writes SHORT_BINUNICODE s.
func shortStr(s string) []byte { return append([]byte{opSHORT_BINUNICODE, byte(len(s))}, s...) }

func TestSharedListsStayLinear(t *testing.T) {
	// "billion laughs": ten levels of lists, each holding the previous one ten times
	// through the memo; decoding shares them, encoding must not expand them
	var b bytes.Buffer
	b.Write([]byte{opPROTO, 4, opEMPTY_DICT, opMARK})
	b.Write(shortStr("device_traces"))
	b.Write([]byte{opEMPTY_LIST})
	b.Write(shortStr("x"))
	b.Write([]byte{opEMPTY_LIST, opMEMOIZE, opSHORT_BINUNICODE, 1, 'y'})
	for lvl := 1; lvl <= 10; lvl++ {
		b.Write([]byte{opEMPTY_LIST, opMARK})
		for i := 0; i < 10; i++ {
			b.Write([]byte{opBINGET, byte(lvl - 1)})
		}
		b.Write([]byte{opAPPENDS, opMEMOIZE})
		b.Write(shortStr("y"))
	}
	b.Write([]byte{opEMPTY_LIST})
	// keys and values alternate: device_traces, x: L0, y: L1 ... y: L10, then the last "y": []
	b.Write([]byte{opSETITEMS, opSTOP})
	s, err := Decode(b.Bytes())
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	out, err := EncodeBytes(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) > 10*b.Len() {
		t.Fatalf("encoding %d bytes of shared lists wrote %d bytes", b.Len(), len(out))
	}

	// a list that contains itself encodes (memoised), not recursing forever
	self := []byte{opPROTO, 4, opEMPTY_DICT, opMARK}
	self = append(self, shortStr("device_traces")...)
	self = append(self, opEMPTY_LIST)
	self = append(self, shortStr("loop")...)
	self = append(self, opEMPTY_LIST, opMEMOIZE, opBINGET, 0, opAPPEND, opSETITEMS, opSTOP)
	s, err = Decode(self)
	if err != nil {
		t.Fatalf("self-list: %v", err)
	}
	if _, err := EncodeBytes(s); err != nil {
		t.Fatalf("self-list encode: %v", err)
	}

	// one trace shared by 100,000 devices: refused, not expanded
	var c bytes.Buffer
	c.Write([]byte{opPROTO, 4, opEMPTY_DICT, opMARK})
	c.Write(shortStr("device_traces"))
	c.Write([]byte{opEMPTY_LIST, opMARK, opEMPTY_LIST, opMEMOIZE, opMARK})
	for i := 0; i < 1000; i++ {
		c.Write([]byte{opEMPTY_DICT, opMARK})
		c.Write(shortStr("action"))
		c.Write(shortStr("alloc"))
		c.Write([]byte{opSETITEMS})
	}
	c.Write([]byte{opAPPENDS})
	for i := 0; i < 100000; i++ {
		c.Write([]byte{opBINGET, 0})
		if i%1000 == 998 {
			c.Write([]byte{opAPPENDS, opMARK})
		}
	}
	c.Write([]byte{opAPPENDS, opSETITEMS, opSTOP})
	before := memAllocated()
	_, err = Decode(c.Bytes())
	if err == nil || !strings.Contains(err.Error(), "shared") {
		t.Fatalf("shared traces: want a refusal, got %v", err)
	}
	if used := memAllocated() - before; used > 64<<20 {
		t.Fatalf("shared traces allocated %d bytes for %d of input", used, c.Len())
	}
}

func TestDecompressionBomb(t *testing.T) {
	// 128 MiB of one byte compresses to a few KiB (streamed: the test never holds
	// the 128 MiB); the decoder refuses it by ratio and never builds the whole output
	const size = 128 << 20
	var zb bytes.Buffer
	zw, err := zstd.NewWriter(&zb, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(zw, io.LimitReader(repeatByte(opPROTO), size)); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	if zb.Len()*MaxRatio+1<<20 >= size {
		t.Fatalf("the test input compresses to only %d bytes", zb.Len())
	}
	before := memAllocated()
	_, err = DecodeAny(zb.Bytes())
	if err == nil || !strings.Contains(err.Error(), "decompressed size exceeds") {
		t.Fatalf("want a refusal, got %v", err)
	}
	if used := memAllocated() - before; used >= size {
		t.Fatalf("allocated %d bytes for %d of input: the bomb was expanded", used, zb.Len())
	}
}

type repeatByte byte

func (r repeatByte) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}

func TestTypedObjectsInExtrasStayLinear(t *testing.T) {
	// an entry that holds itself in an unknown field (a pickle can: its dict is in
	// the memo before its items are set) encodes as a reference, not forever
	e := &TraceEntry{Action: "alloc", Has: EntryAction}
	e.Extra = []Item{{Key: "me", Value: e}}
	s := &Snapshot{Has: SnapDeviceTraces, DeviceTraces: [][]*TraceEntry{{e}}}
	if _, err := EncodeBytes(s); err != nil {
		t.Fatalf("self-holding entry: %v", err)
	}

	// twenty levels of blocks, each holding the next one ten times: written once each
	leaf := &Block{Has: BlockSize, Size: 512}
	cur := leaf
	for i := 0; i < 20; i++ {
		up := &Block{Has: BlockSize, Size: 512}
		for j := 0; j < 10; j++ {
			up.Extra = append(up.Extra, Item{Key: int64(j), Value: cur})
		}
		cur = up
	}
	seg := &Segment{Has: SegBlocks, Blocks: []*Block{cur}}
	s = &Snapshot{Has: SnapSegments, Segments: []*Segment{seg}}
	out, err := EncodeBytes(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) > 64<<10 {
		t.Fatalf("twenty levels of shared blocks wrote %d bytes", len(out))
	}
	if _, err := Decode(out); err != nil {
		t.Fatalf("our own encoding does not decode: %v", err)
	}
}
