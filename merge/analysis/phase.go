package analysis

import (
	"strings"

	"github.com/memsnap/memsnap/merge/snapshot"
)

// Training phases an allocation's stack can show.
const (
	PhaseForward   = "forward"
	PhaseBackward  = "backward"
	PhaseOptimizer = "optimizer"
)

// phaseLookback is how many events before the peak peakPhase looks through for
// one whose stack shows a phase (allocations on autograd's own thread carry no
// Python stack).
const phaseLookback = 10000

// peakPhase returns the phase of the event at idx, or of the nearest earlier event
// whose stack shows one; "" when none does.
func peakPhase(trace []*snapshot.TraceEntry, idx int) string {
	for i := idx; i >= 0 && i > idx-phaseLookback && i < len(trace); i-- {
		if p := stackPhase(trace[i].Frames); p != "" {
			return p
		}
	}
	return ""
}

// stackPhase classifies a stack, innermost frame first: a frame of torch/optim or
// an optimizer step is the optimizer; autograd's engine, a backward() call or an
// activation checkpoint's recomputation is the backward pass; any other stack
// with a Python frame is the forward pass. An empty stack shows nothing.
func stackPhase(frames []*snapshot.Frame) string {
	python := false
	for _, f := range frames {
		if f == nil {
			continue
		}
		switch {
		case isOptimizerFrame(f):
			return PhaseOptimizer
		case isBackwardFrame(f):
			return PhaseBackward
		}
		python = python || strings.HasSuffix(f.Filename, ".py")
	}
	if python {
		return PhaseForward
	}
	return ""
}

func isOptimizerFrame(f *snapshot.Frame) bool {
	fn := f.Filename
	return strings.Contains(fn, "torch/optim/") || strings.Contains(f.Name, "optimizer_step") ||
		(f.Name == "step" && strings.Contains(fn, "optim"))
}

func isBackwardFrame(f *snapshot.Frame) bool {
	fn, name := f.Filename, f.Name
	switch {
	case name == "backward" || name == "_engine_run_backward" || name == "run_backward":
		return true
	case strings.Contains(fn, "torch/autograd/") && !strings.HasSuffix(fn, "torch/autograd/function.py"):
		return true // autograd.Function.apply runs a custom function's forward
	case strings.Contains(fn, "torch/utils/checkpoint.py") && (name == "unpack_hook" || strings.Contains(name, "recompute")):
		return true
	case strings.Contains(name, "torch::autograd::Engine") || strings.Contains(name, "autograd::Engine::"):
		return true // a C++ stack (stacks="all")
	}
	return false
}
