"""A training loop that uses the memsnap hook, run against the fake torch."""
import os
import sys
import time

import torch  # the fake one, from PYTHONPATH
import memsnap_hook

batches = int(sys.argv[1]) if len(sys.argv) > 1 else 40
pace = float(sys.argv[2]) if len(sys.argv) > 2 else 0.02
for b in range(batches):
    with memsnap_hook.step(b):
        time.sleep(pace)
memsnap_hook.get_hook().close()
print("calls:", torch.calls)
print("errors:", memsnap_hook.get_hook().errors)
