"""A training loop that is stopped part-way, for the hook's stopping tests (run
against the fake torch). Arguments are key=value:

  wait=window|spool   train only once the hook has its window (or the agent's spool)
  batches=N pace=S    how long to train (default: until stopped)
  fail=N              raise RuntimeError at batch N (an uncaught exception)
  oom=N               at batch N: torch's OOM observer fires, then OutOfMemoryError
  exit=N              sys.exit(3) at batch N
  prev=py|ign         a SIGTERM handler installed before the hook: a Python one that
                      prints and exits 7, or SIG_IGN (training goes on; the loop ends
                      once the hook has handled the SIGTERM)
  stop_wait=S         the hook's bound on waiting for its messages
  term_in_dump=1      the process SIGTERMs itself while the hook takes a snapshot
  thread=1            create the hook on another thread, print its errors, exit

It prints "batch N" as each batch starts."""
import os
import signal
import sys
import threading
import time

import torch  # the fake one, from PYTHONPATH
import memsnap_hook

opts = dict(a.split("=", 1) for a in sys.argv[1:])


def num(k, default=-1):
    return int(opts.get(k, default))


if opts.get("thread") == "1":
    out = []
    t = threading.Thread(target=lambda: out.append(memsnap_hook.Hook()))
    t.start()
    t.join()
    print("errors:", out[0].errors)
    print("handler is SIG_DFL:", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
    sys.exit(0)

if opts.get("prev") == "py":
    def previous(signum, frame):
        print("previous handler called with", signum, flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, previous)
elif opts.get("prev") == "ign":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

if opts.get("term_in_dump") == "1":
    real_snapshot = torch.cuda.memory._snapshot

    def snapshot_and_term():
        os.kill(os.getpid(), signal.SIGTERM)
        return real_snapshot()
    torch.cuda.memory._snapshot = snapshot_and_term

hook = memsnap_hook.get_hook()
if "stop_wait" in opts:
    hook.stop_wait = float(opts["stop_wait"])
deadline = time.time() + 60
want = opts.get("wait")
while time.time() < deadline and ((want == "window" and hook._window is None) or (want == "spool" and hook._spool is None)):
    time.sleep(0.01)
if want == "window" and hook._window is None or want == "spool" and hook._spool is None:
    sys.exit("no %s from the agent within 60 s" % want)

batches, pace = num("batches", 1 << 30), float(opts.get("pace", "0.01"))
for b in range(batches):
    print("batch", b, flush=True)
    with memsnap_hook.step(b):
        if b == num("fail"):
            raise RuntimeError("boom at batch %d" % b)
        if b == num("oom"):
            torch._C.observers[-1](0, 1 << 30, 10, 20)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        if b == num("exit"):
            sys.exit(3)
        time.sleep(pace)
    if hook._stopped and opts.get("prev") == "ign":
        print("trained on after SIGTERM", flush=True)
        break
hook.close()
print("errors:", hook.errors)
