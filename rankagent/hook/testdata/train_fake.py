"""A training loop that uses the memsnap hook, run against the fake torch.

argv: batches pace [wait]. With wait=1 the loop starts only once the hook has its
window from the agent, so a test never depends on how fast the machine is."""
import os
import sys
import time

import torch  # the fake one, from PYTHONPATH
import memsnap_hook

batches = int(sys.argv[1]) if len(sys.argv) > 1 else 40
pace = float(sys.argv[2]) if len(sys.argv) > 2 else 0.02
wait = len(sys.argv) > 3 and sys.argv[3] == "1"
hook = memsnap_hook.get_hook()
if wait:
    deadline = time.time() + 60
    while hook._window is None and time.time() < deadline:
        time.sleep(0.01)
    if hook._window is None:
        sys.exit("no window from the agent within 60 s")
for b in range(batches):
    with memsnap_hook.step(b):
        time.sleep(pace)
hook.close()
print("calls:", torch.calls)
print("errors:", hook.errors)
