"""Per-batch cost of the memsnap hook while no window is armed, against an empty
loop that calls two no-op functions (the baseline), measured in the same run.
Prints microseconds per batch and the ratio last. Imports torch first when it is
installed, so the numbers are those of a real training process."""
import sys
import time

try:
    import torch  # noqa: F401
except ImportError:
    pass
import memsnap_hook

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000000


def noop(b):
    pass


def best(fn, reps=5):
    out = 1e9
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t)
    return out / N * 1e6


def base():
    for b in range(N):
        noop(b)
        noop(b)


hook = memsnap_hook.Hook()  # connects in the background if an agent is there


def with_hook():
    for b in range(N):
        hook.batch_start(b)
        hook.batch_end(b)


def with_step():
    for b in range(N):
        with hook.step(b):
            pass


b, h, s = best(base), best(with_hook), best(with_step)
print("baseline (two no-op calls): %.3f us/batch" % b)
print("batch_start + batch_end:    %.3f us/batch" % h)
print("with step(b):               %.3f us/batch" % s)
print("hook overhead per batch: %.3f us (ratio to baseline %.2f)" % (h - b, h / b))
hook.close(timeout=1)
