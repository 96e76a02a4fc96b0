// Package leader is the work of the member that leads: it takes a term in the
// run's log, plans windows (asked for, scheduled, triggered, post-mortems),
// sends them to the ranks, drives each window's state machine
// (coordinator/window) with what the ranks answer, merges and publishes the
// ranks' snapshots from the store, and finishes from the log whatever an
// earlier leader or launch left unfinished.
//
// It asks the member it runs in for the cluster (Member: nodes, messages,
// terms believed); it holds none of the member's locks and the member holds
// none of its own while calling it.
//
// Goroutines and what each owns:
//   - The loop (Start's goroutine, run) owns the term, the store and the run's
//     log, and every window in progress: a window's state is its machine
//     (win.m), stepped and its effects carried out on this goroutine alone; a
//     win's other fields are what carrying out those effects needs (the
//     command sent, the steps not yet told, preloaded inputs, the ranks'
//     messages that came while a post-mortem interrupted it), never a second
//     copy of the window's phase: why the leader stops running a window is the
//     machine's Exit.
//   - Under l.mu, shared with the member's goroutines that call in (Deliver,
//     WatchNow, Crossed, Busy, Deferred): the queue of requests and deferred
//     requests, the schedule's next start, the trigger's cooldown, the kinds
//     of the windows in progress (whether the leader is busy and whether a
//     trigger's window runs are read from them), the post-mortem quiet time (a
//     cache of the run's log, read whole when not known: runlog.NewestOf), and
//     the windows this leader finishes later (later): of each only when this
//     leader first found it (each try's machine is planned from then) and the
//     members waiting for it, dropped when its result is told or, with no
//     member waiting, once the run's log lists it finished.
//   - WatchNow's goroutines (one per member re-asking how a window ended)
//     only read the run's log and reply.
//   - send's workers only send a command's bytes and report who was not reached.
package leader
