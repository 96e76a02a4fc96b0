// Package testjob synthesises a rank's training, its snapshot and its sidecar,
// for the tests of the analysis and of the merge: a job of known activations,
// gradients, optimizer state and leak, whose figures the tests know.
package testjob

import (
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
)

const mib = 1 << 20

// tensorsKey is the snapshot's key under which the hook stores the watched
// tensors (analysis.TensorsKey: the analysis's tests import this package, so it
// cannot import the analysis).
const tensorsKey = "memsnap_tensors"

// Job is a synthesised rank's training: a 1 GiB segment holding 256 MiB of
// weights allocated before recording; in each of its batches an activation of
// 64 MiB is allocated and freed, a gradient of 32 MiB is allocated in the batch
// and freed in the next one, and (Leak > 0) Leak bytes are allocated at
// LeakSite and never freed. Batch b runs over [b*1000, b*1000+900) µs after t0.
type Job struct {
	Batches int
	Leak    int64
	// Watch: the hook was told the model (fc1 and fc2, 128 MiB of weights each,
	// the gradient is fc2's) and its optimizer (64 MiB of state each, allocated
	// before recording at 800 MiB into the segment)
	Watch bool
	// BigAct: an activation of this many bytes more in every batch, made by
	// another module's forward
	BigAct int64
	// GradFlip: the gradient's block alternates between two addresses, and (with
	// Watch) the hook saw the one the snapshot does not hold (SeenGrad)
	GradFlip, SeenGrad bool
	// MadeNotes: the hook tells every gradient made with its batch (version 2);
	// OptTemp: in every batch after the first, the optimizer's step makes a
	// temporary of the gradient's size at the address the last batch's gradient
	// had (AdamW's foreach temporaries do, in a real trainer)
	MadeNotes, OptTemp bool
	// GradFreed: the last batch frees its gradient before the snapshot (Hugging
	// Face's Trainer zeroes them before its step-end callback)
	GradFreed bool
}

// The frames of the job's allocations: a module's forward (the activation),
// the backward pass (the gradient), another module's forward (BigAct), the
// training loop (the leak) and the optimizer's step (OptTemp).
var (
	ActFrame  = &snapshot.Frame{Name: "forward", Filename: "/job/model.py", Line: 10, Has: snapshot.FrameName | snapshot.FrameFilename | snapshot.FrameLine}
	GradFrame = &snapshot.Frame{Name: "backward", Filename: "/job/train.py", Line: 20, Has: snapshot.FrameName | snapshot.FrameFilename | snapshot.FrameLine}
	BigFrame  = &snapshot.Frame{Name: "forward", Filename: "/job/big.py", Line: 5, Has: snapshot.FrameName | snapshot.FrameFilename | snapshot.FrameLine}
	LeakFrame = &snapshot.Frame{Name: "remember", Filename: "/job/train.py", Line: 33, Has: snapshot.FrameName | snapshot.FrameFilename | snapshot.FrameLine}
	OptFrame  = &snapshot.Frame{Name: "_multi_tensor_adamw", Filename: "/venv/torch/optim/adamw.py", Line: 40, Has: snapshot.FrameName | snapshot.FrameFilename | snapshot.FrameLine}
)

// LeakSite is the site the leak is allocated at, as the analysis names it.
const LeakSite = "remember (/job/train.py:33)"

// Build returns the job's snapshot and its sidecar, batch 0 starting at t0.
func (j Job) Build(t0 int64) (*snapshot.Snapshot, *sidecar.RankMeta) {
	var tr []*snapshot.TraceEntry
	ev := func(action string, addr, size, t int64, fr *snapshot.Frame) {
		e := &snapshot.TraceEntry{Action: action, Addr: addr, Size: size, TimeUS: t,
			Has: snapshot.EntryAction | snapshot.EntryAddr | snapshot.EntrySize | snapshot.EntryTimeUS}
		if fr != nil {
			e.Frames, e.Has = []*snapshot.Frame{fr}, e.Has|snapshot.EntryFrames
		}
		tr = append(tr, e)
	}
	meta := &sidecar.RankMeta{Version: 1, Rank: 0, WorldSize: 1}
	var blocks []*snapshot.Block
	blocks = append(blocks, &snapshot.Block{Address: base, Size: 256 * mib, State: snapshot.BlockActiveAllocated,
		Has: snapshot.BlockAddress | snapshot.BlockSize | snapshot.BlockState})
	for b := 0; b < j.Batches; b++ {
		s := t0 + int64(b)*1000
		meta.Batches = append(meta.Batches, sidecar.BatchMark{Batch: int64(b), StartUS: s, EndUS: s + 900})
		if b > 0 {
			ev(snapshot.ActionFreeRequested, j.gradAt(b-1), 32*mib, s+10, GradFrame)
			ev(snapshot.ActionFreeCompleted, j.gradAt(b-1), 32*mib, s+11, GradFrame)
		}
		act := int64(base + 512*mib)
		ev(snapshot.ActionAlloc, act, 64*mib, s+100, ActFrame)
		ev(snapshot.ActionAlloc, j.gradAt(b), 32*mib, s+200, GradFrame)
		if j.BigAct > 0 {
			ev(snapshot.ActionAlloc, base+700*mib, j.BigAct, s+150, BigFrame)
			ev(snapshot.ActionFreeCompleted, base+700*mib, j.BigAct, s+350, BigFrame)
		}
		if j.OptTemp && b > 0 {
			ev(snapshot.ActionAlloc, j.gradAt(b-1), 32*mib, s+250, OptFrame)
			ev(snapshot.ActionFreeCompleted, j.gradAt(b-1), 32*mib, s+260, OptFrame)
		}
		ev(snapshot.ActionFreeRequested, act, 64*mib, s+300, ActFrame)
		ev(snapshot.ActionFreeCompleted, act, 64*mib, s+301, ActFrame)
		if j.Leak > 0 {
			addr := int64(base + 600*mib + int64(b)*j.Leak)
			ev(snapshot.ActionAlloc, addr, j.Leak, s+400, LeakFrame)
			blocks = append(blocks, &snapshot.Block{Address: addr, Size: j.Leak, State: snapshot.BlockActiveAllocated,
				Has: snapshot.BlockAddress | snapshot.BlockSize | snapshot.BlockState})
		}
	}
	if j.GradFreed {
		last := t0 + int64(j.Batches-1)*1000
		ev(snapshot.ActionFreeRequested, j.gradAt(j.Batches-1), 32*mib, last+850, GradFrame)
		ev(snapshot.ActionFreeCompleted, j.gradAt(j.Batches-1), 32*mib, last+851, GradFrame)
	} else {
		blocks = append(blocks, &snapshot.Block{Address: j.gradAt(j.Batches - 1), Size: 32 * mib, State: snapshot.BlockActiveAllocated,
			Has: snapshot.BlockAddress | snapshot.BlockSize | snapshot.BlockState})
	}
	var extra []snapshot.Item
	if j.Watch {
		blocks = append(blocks, &snapshot.Block{Address: base + 800*mib, Size: 128 * mib, State: snapshot.BlockActiveAllocated,
			Has: snapshot.BlockAddress | snapshot.BlockSize | snapshot.BlockState})
		extra = []snapshot.Item{{Key: tensorsKey, Value: &snapshot.Dict{Items: j.hookItems()}}}
	}
	seg := &snapshot.Segment{Device: 0, Address: base, TotalSize: 1 << 30, Blocks: blocks,
		Has: snapshot.SegDevice | snapshot.SegAddress | snapshot.SegTotalSize | snapshot.SegBlocks}
	s := &snapshot.Snapshot{Segments: []*snapshot.Segment{seg}, DeviceTraces: [][]*snapshot.TraceEntry{tr},
		Has: snapshot.SnapSegments | snapshot.SnapDeviceTraces, Extra: extra}
	return s, meta
}

// base is the address of the job's segment.
const base = 1 << 40

// gradAt is the address of batch b's gradient: the allocator reuses the block.
func (j Job) gradAt(b int) int64 {
	if j.GradFlip {
		return base + 256*mib + int64(b%2)*32*mib
	}
	return base + 256*mib
}

// hookItems are what the hook stores of a watched job under tensorsKey: the
// model's and the optimizer's tensors (and a few malformed ones), the gradient
// it saw, and with MadeNotes the gradients made.
func (j Job) hookItems() []snapshot.Item {
	tensor := func(addr, size int64, kind, module string) snapshot.Value {
		return &snapshot.List{Items: []snapshot.Value{addr, size, kind, module}}
	}
	list := &snapshot.List{Items: []snapshot.Value{
		tensor(base, 128*mib, "parameter", "fc1"), tensor(base+128*mib, 128*mib, "parameter", "fc2"),
		tensor(base+800*mib, 64*mib, "optimizer_state", "fc1"), tensor(base+864*mib, 64*mib, "optimizer_state", "fc2"),
		tensor(base+864*mib, 64*mib, "optimizer_state", "fc2"),                 // a storage named twice counts once
		tensor(-5, 10, "parameter", "bad"), tensor(base, 1, "weights?", "bad"), // malformed: skipped
	}}
	if !j.GradFreed {
		list.Items = append(list.Items, tensor(j.gradAt(j.Batches-1), 32*mib, "gradient", "fc2"))
	}
	if j.SeenGrad {
		list.Items = append(list.Items, tensor(j.gradAt(j.Batches), 32*mib-100, "gradient", "fc2"))
	}
	items := []snapshot.Item{{Key: "version", Value: int64(1)}, {Key: "tensors", Value: list}}
	if j.MadeNotes {
		made := &snapshot.List{}
		for b := 0; b < j.Batches; b++ {
			made.Items = append(made.Items, &snapshot.List{Items: []snapshot.Value{j.gradAt(b), int64(32 * mib), "fc2", int64(b)}})
		}
		made.Items = append(made.Items, &snapshot.List{Items: []snapshot.Value{int64(-1), int64(1), "bad", int64(0)}}) // malformed: skipped
		items = append(items, snapshot.Item{Key: "gradients_made", Value: made})
	}
	return items
}
