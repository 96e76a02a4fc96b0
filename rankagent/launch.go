package rankagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/memsnap/memsnap/internal/wait"
)

// Trainer is a training command the agent launches and waits for
// (`memsnap agent -- python train.py`).
type Trainer struct {
	Command []string
	Env     []string // added to this process's environment (MEMSNAP_SOCKET is set too)
	// Hide names variables of this process's environment the trainer does not
	// inherit (the gossip key: the trainer and every process it starts need
	// none of it).
	Hide   []string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Signals are forwarded to the trainer while it runs; one that arrives after it
	// exited stops the wait for uploads at once.
	Signals <-chan os.Signal
	// DrainTimeout bounds the wait for uploads after the trainer exits.
	DrainTimeout time.Duration
	// OnExit, when set, is called with the trainer's exit status once it exited,
	// before the wait for uploads.
	OnExit func(code int)
	// Run, when set, runs the agent (with whatever runs beside it, such as its
	// cluster membership) instead of the agent's own Run.
	Run func(ctx context.Context) error
	// Idle, when set, must also hold before the wait for uploads ends (a leader
	// still merging, say).
	Idle func() bool
	// Unfinished, when set, says what is left undone when the wait ends (a
	// signal, the timeout) while Idle does not hold; it goes into the outcome's
	// problems.
	Unfinished func() string
}

// Outcome is how a launched training run ended for memsnap.
type Outcome struct {
	ExitCode int      // the trainer's exit status (128+N when signal N killed it, -1 when it could not be waited for)
	Stats    Stats    // what the agent did
	Problems []string // what memsnap did not do: windows missed, snapshots not uploaded
	Stopped  bool     // a signal stopped the wait for uploads
}

// Code is the status `memsnap agent -- CMD` exits with: the trainer's when it
// failed, else 1 when a window was missed or a snapshot was not uploaded, else 0.
func (o Outcome) Code() int {
	switch {
	case o.ExitCode > 0:
		return o.ExitCode
	case o.ExitCode < 0:
		return 1
	case len(o.Problems) > 0:
		return 1
	}
	return 0
}

// RunWithTrainer runs the agent, launches the trainer with the agent's socket in
// its environment, waits for it, then waits (up to DrainTimeout, or until a signal)
// for the agent to upload what it holds, and stops the agent. The agent outlives
// the signals that stop the trainer: it must still take the trainer's last
// snapshot and upload it.
func RunWithTrainer(a *Agent, t Trainer) (Outcome, error) {
	if len(t.Command) == 0 {
		return Outcome{}, errors.New("rankagent: no trainer command")
	}
	a.mu.Lock()
	a.launched = true
	a.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	run := a.Run
	if t.Run != nil {
		run = t.Run
	}
	go func() { done <- run(ctx) }()
	stop := func() error { cancel(); return <-done }

	child := exec.Command(t.Command[0], t.Command[1:]...)
	child.Stdin, child.Stdout, child.Stderr = t.Stdin, t.Stdout, t.Stderr
	child.Env = trainerEnv(t, a.Socket())
	if err := child.Start(); err != nil {
		stop()
		return Outcome{ExitCode: -1}, fmt.Errorf("rankagent: starting %s: %w", t.Command[0], err)
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	var werr error
wait:
	for {
		select {
		case s := <-t.Signals:
			a.TrainerSignalled(s) // the cluster hears of it before the trainer's hook says so
			child.Process.Signal(s)
		case werr = <-exited:
			break wait
		case err := <-done: // the agent stopped on its own (it could not listen)
			child.Process.Kill()
			<-exited
			return Outcome{ExitCode: -1}, err
		}
	}
	o := Outcome{ExitCode: exitCode(werr)}
	if t.OnExit != nil {
		t.OnExit(o.ExitCode)
	}
	// the trainer's last messages (its snapshot, say) are read before the connection
	// closes: judge the window only once they are
	waitDisconnected(a)
	// the trainer is gone: a window it was in is over, and a trainer that failed
	// is an incident the cluster hears of
	a.TrainerExited(o.ExitCode)
	o.Stopped = waitForUploads(a, t)
	var undone string
	if t.Idle != nil && t.Unfinished != nil && !t.Idle() {
		undone = t.Unfinished()
	}
	if err := stop(); err != nil {
		return o, err
	}
	o.Stats = a.Stats()
	o.Problems = problems(a, o.Stats, undone)
	return o, nil
}

// trainerEnv is the trainer's environment: this process's, less the hidden
// variables, with the trainer's own and the agent's socket added.
func trainerEnv(t Trainer, socket string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !slices.Contains(t.Hide, k) {
			env = append(env, kv)
		}
	}
	return append(append(env, t.Env...), "MEMSNAP_SOCKET="+socket)
}

// exitCode is the trainer's exit status from its wait's error, as a shell
// reports it.
func exitCode(werr error) int {
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(werr, &ee):
		code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal()) // as a shell reports it
		}
	case werr != nil:
		code = -1
	}
	return code
}

// waitDisconnected waits (up to 10 seconds) for the trainer's connection to
// close, so that its last messages are read.
func waitDisconnected(a *Agent) {
	wait.Until(context.Background(), 10*time.Second, func() bool { return !a.Connected() })
}

// waitForUploads waits for the agent (and t.Idle) to be idle, up to
// t.DrainTimeout or a signal; it reports whether a signal stopped the wait.
func waitForUploads(a *Agent, t Trainer) (stopped bool) {
	idle := a.Idle
	if t.Idle != nil {
		idle = func() bool { return a.Idle() && t.Idle() }
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var signalled atomic.Bool
	go func() { // a signal ends the wait
		select {
		case <-t.Signals:
			signalled.Store(true)
			cancel()
		case <-ctx.Done():
		}
	}()
	ok, _ := wait.Every(ctx, t.DrainTimeout, 50*time.Millisecond, idle)
	return !ok && signalled.Load()
}

// problems lists what memsnap did not do, for the outcome: snapshots left
// incoming, what the wait left undone, and the windows and uploads in s.
func problems(a *Agent, s Stats, undone string) []string {
	var p []string
	if n := len(a.sp.incomingSnapshots()); n > 0 {
		p = append(p, fmt.Sprintf("%d snapshot(s) not taken into the spool (kept in %s/incoming, the spool's disk was full; an agent started with this spool takes them)", n, a.Spool()))
	}
	if undone != "" {
		p = append(p, undone)
	}
	if s.WindowsMissed > 0 {
		p = append(p, fmt.Sprintf("%d window(s) missed", s.WindowsMissed))
	}
	if s.WindowsPartial > 0 {
		p = append(p, fmt.Sprintf("%d snapshot(s) did not cover their whole window (kept under .partial names)", s.WindowsPartial))
	}
	if s.UploadFailed > 0 {
		p = append(p, fmt.Sprintf("%d snapshot(s) refused by the store (kept in %s/failed)", s.UploadFailed, a.Spool()))
	}
	if s.Pending > 0 {
		p = append(p, fmt.Sprintf("%d snapshot(s) not uploaded yet (kept in %s/pending; an agent started with this spool uploads them)", s.Pending, a.Spool()))
	}
	return p
}

// String says how the run ended, for the agent's last log line.
func (o Outcome) String() string {
	if len(o.Problems) == 0 {
		return fmt.Sprintf("trainer exited %d; %d snapshot(s) uploaded", o.ExitCode, o.Stats.Uploaded)
	}
	return fmt.Sprintf("trainer exited %d; %s", o.ExitCode, strings.Join(o.Problems, "; "))
}
