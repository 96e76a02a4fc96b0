"""A stand-in for the parts of torch the memsnap hook uses, for tests without torch.

_snapshot() returns the real recorded snapshot named by $MEMSNAP_FAKE_SNAPSHOT (or an
empty one); every call is recorded in ``calls``."""
import os
import pickle

__version__ = "2.11.0+fake"
calls = []


class _Memory:
    def _record_memory_history(self, enabled="all", context="all", stacks="python", max_entries=0):
        calls.append(("record", enabled, context, stacks, max_entries))

    def _snapshot(self):
        calls.append(("snapshot",))
        p = os.environ.get("MEMSNAP_FAKE_SNAPSHOT")
        if p:
            with open(p, "rb") as f:
                return pickle.load(f)
        return {"segments": [], "device_traces": [[]]}


class OutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError (also torch.cuda.OutOfMemoryError)."""


class _Props:
    uuid = "GPU-fake-0000"


class cuda:  # noqa: N801 (mirrors torch.cuda)
    memory = _Memory()
    OutOfMemoryError = OutOfMemoryError

    @staticmethod
    def is_available():
        return True

    # the allocator's figures: a test sets them (stats), or none are initialised
    initialized = True
    stats = {"allocated_bytes.all.current": 1000, "reserved_bytes.all.current": 4096,
             "allocated_bytes.all.peak": 3000, "inactive_split_bytes.all.current": 96,
             "num_alloc_retries": 2, "num_ooms": 0}
    free_total = (70 << 30, 80 << 30)

    @staticmethod
    def is_initialized():
        return cuda.initialized

    # other devices' figures, by index: a test that sets some has that many
    # devices (device 0 has stats)
    others = {}

    @staticmethod
    def device_count():
        return 1 + max(cuda.others, default=0)

    @staticmethod
    def memory_stats(device=None):
        calls.append(("memory_stats", device))
        if device:
            return dict(cuda.others.get(device, {}))
        return dict(cuda.stats)

    @staticmethod
    def memory_reserved(device=None):
        calls.append(("memory_reserved", device))
        st = cuda.others.get(device, {}) if device else cuda.stats
        return st.get("reserved_bytes.all.current", 0)

    @staticmethod
    def mem_get_info(device=None):
        calls.append(("mem_get_info", device))
        return cuda.free_total

    # the allocator's per-process cap (set_per_process_memory_fraction); None:
    # a torch that does not tell it
    fraction = 1.0

    @staticmethod
    def get_per_process_memory_fraction(device=None):
        if cuda.fraction is None:
            raise AttributeError("get_per_process_memory_fraction")
        return cuda.fraction

    @staticmethod
    def current_device():
        return 0

    @staticmethod
    def get_device_properties(d):
        return _Props()


class _C:  # noqa: N801
    observers = []

    @staticmethod
    def _cuda_attach_out_of_memory_observer(fn):
        _C.observers.append(fn)
