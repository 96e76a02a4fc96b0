package snapshot

import (
	"errors"
	"unsafe"
)

// The decode budget bounds the memory a decode builds by the size of its input, so
// no pickle, however crafted, makes the decoder allocate without bound. The real
// snapshots under testdata build 3.4 to 5 bytes per pickle byte, up to 7.6 for the
// smallest (45 KB, where fixed costs weigh most); the budget allows BudgetPerByte,
// plus BudgetBase for any input (TestRealSnapshotsWithinLimits checks the headroom).
//
// What counts: every entry, frame, segment, block, dict, list, tuple and string the
// decode makes, every array a list or dict grows through, and the memo, each
// charged before it is allocated, so the budget bounds what a decode allocates in
// all, not only what it keeps; a large decode's prefaulter is charged what it may
// make ready and never hand over when it starts (prefaultHold, prefault.go). The
// decoder's own stack and marks are bounded apart, by maxStack and maxMarks.
const (
	// BudgetPerByte is how many bytes a decode may build per byte of pickle.
	BudgetPerByte = 16
	// BudgetBase is how many bytes any decode may build, however small its input.
	BudgetBase = 4 << 20
	// BudgetPerCompressedByte bounds a compressed snapshot's decode by the size of
	// the compressed file as well: real ones build at most 64 bytes per byte of
	// gzip -9 or zstd -19 (MaxRatio times what a large pickle builds per byte).
	BudgetPerCompressedByte = 256
)

// ErrBudget is wrapped by the *DecodeError of a decode that would build more than
// its budget.
var ErrBudget = errors.New("snapshot: decode budget exceeded")

// Budget returns how many bytes the decode of an n-byte pickle may build.
func Budget(n int) int64 { return BudgetBase + BudgetPerByte*int64(n) }

// Sizes charged to the budget.
const (
	sizeVal       = int64(unsafe.Sizeof(val{}))
	sizeValue     = int64(unsafe.Sizeof(Value(nil)))
	sizeItem      = int64(unsafe.Sizeof(Item{}))
	sizeSlice     = int64(unsafe.Sizeof([]Value(nil)))
	sizeString    = int64(unsafe.Sizeof(""))
	sizeSparse    = 2 * (8 + sizeVal) // one map entry, with the map's slack
	sizeEntry     = int64(unsafe.Sizeof(TraceEntry{}))
	sizeFrame     = int64(unsafe.Sizeof(Frame{}))
	sizeFrameList = int64(unsafe.Sizeof(frameList{}))
	sizeSegment   = int64(unsafe.Sizeof(Segment{}))
	sizeBlock     = int64(unsafe.Sizeof(Block{}))
	sizeSnapshot  = int64(unsafe.Sizeof(Snapshot{}))
)

// charge spends n bytes of the budget, or refuses the opcode at at if that would
// overspend it.
func (d *decoder) charge(at int, op byte, n int64) error {
	d.left -= n
	if d.left < 0 {
		return d.overBudget(at, op)
	}
	return nil
}

// spend spends n bytes where no error can be returned; the opcode's handler then
// calls spent, which refuses the opcode if the budget is overspent.
func (d *decoder) spend(n int64) { d.left -= n }

func (d *decoder) spent(at int, op byte) error {
	if d.left < 0 {
		return d.overBudget(at, op)
	}
	return nil
}

func (d *decoder) overBudget(at int, op byte) error {
	e := d.fail(at, op, "refused: decoding would build more than its budget of %d bytes for %d bytes of pickle", d.budget, len(d.data)).(*DecodeError)
	e.Err = ErrBudget
	return e
}
