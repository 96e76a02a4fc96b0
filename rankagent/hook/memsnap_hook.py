"""memsnap trainer hook: records this rank's CUDA allocations over the batch windows
its memsnap agent asks for.

Import it in the training script and report batch boundaries; everything else runs
in a background thread and never blocks the training step:

    import memsnap_hook
    for batch, data in enumerate(loader):
        with memsnap_hook.step(batch):
            train_step(data)

or ``memsnap_hook.batch_start(b)`` / ``memsnap_hook.batch_end(b)``, or one of the
callbacks: ``composer_callback(...)`` (the arguments of Composer's MemorySnapshot),
``lightning_callback()``, ``hf_callback()``. Importing this module needs only the
standard library; torch is imported when a window starts.

The hook connects to the agent's Unix socket ($MEMSNAP_SOCKET, or the default path
for this run and local rank), says hello, and reports the current batch. When the
agent sends a window [start, stop), the hook turns allocator history on at the start
of batch ``start``, dumps ``torch.cuda.memory._snapshot()`` after batch ``stop - 1``,
turns history off, writes the snapshot into the agent's spool and tells the agent,
with the wall-clock start and end of every batch in the window. It also attaches
torch's OOM observer and dumps a snapshot when an OOM happens. If the agent is absent
or dies, training goes on untouched and the hook reconnects when it returns.

When the process is being stopped (SIGTERM, as torchrun sends every worker when one
fails; an uncaught exception; an interpreter exit while a window records), the hook
tells the agent why ("stopping"), dumps what history it holds (reason "crash"),
waits a bounded time for both messages to leave, and lets the stop go on as it
would have: the previous SIGTERM handler or excepthook is called.

Protocol: newline-delimited JSON, version 1 (see docs/protocol.md in memsnap).
"""

import atexit
import collections
import json
import operator
import os
import pickle
import signal
import socket
import sys
import threading
import time
import warnings
import weakref

__all__ = [
    "Hook", "get_hook", "batch_start", "batch_end", "step",
    "composer_callback", "lightning_callback", "hf_callback", "default_socket_path",
]

PROTOCOL_VERSION = 1
HOOK_VERSION = "memsnap-hook/2"
MAX_LINE = 64 << 10
SOCKET_MARKS = 256  # more batch marks than this go only into the message file beside the snapshot

STOP_WAIT = 10.0   # seconds a stopping trainer waits for its messages to reach the agent
OOM_RECENT = 5.0   # an OutOfMemoryError this soon after an OOM dump needs no crash dump
MEMORY_EVERY = 1.0  # least seconds between two memory reports ($MEMSNAP_MEMORY_EVERY; 0: none)
MAX_CAUSE = 512    # bytes of a stopping cause (UTF-8)

# error codes the agent tells apart
CODE_START_PASSED = "start_passed"
CODE_RECORD_FAILED = "record_failed"
CODE_DUMP_FAILED = "dump_failed"
TENSORS_KEY = "memsnap_tensors"  # the snapshot's key for the watched tensors
MAX_MODULE = 512                 # bytes of a module's name kept


def _now_us():
    return time.time_ns() // 1000


def _env_int(*names, default=0):
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                pass
    return default


def _run_name():
    for n in ("MEMSNAP_RUN_NAME", "COMPOSER_RUN_NAME", "RUN_NAME", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        v = os.environ.get(n)
        if v:
            return v
    return "memsnap"


def _local_rank():
    return _env_int("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")


def _rank():
    return _env_int("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")


def _private_dir_problem(path):
    """Why the folder ``path`` is unsafe to share with the agent (another local user
    could replace the socket or read the snapshots), or None when it is safe: it must
    be a real folder owned by this user and writable by no one else."""
    import stat
    try:
        st = os.lstat(path)
    except OSError as e:
        return "%s: %s" % (path, e.strerror)
    if stat.S_ISLNK(st.st_mode):
        return "%s is a symbolic link" % path
    if not stat.S_ISDIR(st.st_mode):
        return "%s is not a folder" % path
    if st.st_uid != os.getuid():
        return "%s belongs to user %d, not to this user (%d)" % (path, st.st_uid, os.getuid())
    if st.st_mode & 0o022:
        return "%s is writable by others (mode %o)" % (path, st.st_mode & 0o777)
    return None


def default_socket_path(run_name=None, local_rank=None):
    """The agent's default socket path; the Go agent computes the same one."""
    import re
    import tempfile
    run = re.sub(r"[^A-Za-z0-9_.-]+", "_", run_name if run_name is not None else _run_name()) or "default"
    run = run[:40]
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    lr = _local_rank() if local_rank is None else local_rank
    return os.path.join(base, "memsnap-%d" % os.getuid(), "%s.%d.sock" % (run, lr))


class _Torch:
    """The parts of torch the hook uses, looked up once, lazily."""

    def __init__(self):
        self._t = None

    @property
    def torch(self):
        if self._t is None:
            import torch  # noqa: WPS433 (imported on first use)
            self._t = torch
        return self._t

    def legacy(self):
        import inspect
        fn = self.torch.cuda.memory._record_memory_history
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return False
        return "max_entries" not in params

    def start(self, max_entries, stacks):
        mem = self.torch.cuda.memory
        if self.legacy():
            mem._record_memory_history(True, trace_alloc_max_entries=max_entries, trace_alloc_record_context=True)
        else:
            mem._record_memory_history(enabled="all", context="all", stacks=stacks, max_entries=max_entries)

    def stop(self):
        mem = self.torch.cuda.memory
        if self.legacy():
            mem._record_memory_history(False)
        else:
            mem._record_memory_history(enabled=None)

    def snapshot(self):
        return self.torch.cuda.memory._snapshot()

    def device_uuid(self):
        try:
            t = self.torch
            if not t.cuda.is_available():
                return ""
            u = getattr(t.cuda.get_device_properties(t.cuda.current_device()), "uuid", "")
            return str(u) if u else ""
        except Exception:  # a hook must never break training
            return ""

    def version(self):
        try:
            return str(self.torch.__version__)
        except Exception:
            return ""

    # how many readings go by before memory_device looks at every device again
    DEVICE_RECHECK = 60

    def memory_device(self):
        """The device whose figures are this process's: the current device, unless
        the allocator holds more on another (a trainer that puts its model on cuda:N
        without torch.cuda.set_device). Chosen again every DEVICE_RECHECK readings."""
        cuda = self.torch.cuda
        cur = cuda.current_device()
        n = cuda.device_count()
        if n <= 1:
            return cur
        k = getattr(self, "_dev_reads", 0)
        self._dev_reads = k + 1
        if k % self.DEVICE_RECHECK != 0 and getattr(self, "_dev", None) is not None:
            return self._dev
        best, most = cur, cuda.memory_reserved(cur)
        for d in range(n):
            if d != cur:
                r = cuda.memory_reserved(d)
                if r > most:
                    best, most = d, r
        self._dev = best
        return best

    def memory(self):
        """The allocator's figures and the device's free and total bytes, as the
        agent's memory message carries them; None while CUDA is not initialised
        (reading them must not initialise it)."""
        cuda = self.torch.cuda
        if not cuda.is_initialized():
            return None
        dev = self.memory_device()
        st = cuda.memory_stats(dev)
        free, total = cuda.mem_get_info(dev)
        m = {"allocated": int(st.get("allocated_bytes.all.current", 0)),
             "reserved": int(st.get("reserved_bytes.all.current", 0)),
             "peak": int(st.get("allocated_bytes.all.peak", 0)),
             "inactive_split": int(st.get("inactive_split_bytes.all.current", 0)),
             "alloc_retries": int(st.get("num_alloc_retries", 0)),
             "ooms": int(st.get("num_ooms", 0)),
             "device_free": int(free), "device_total": int(total)}
        limit = self.allocator_limit(dev, int(total))
        if limit is not None:
            m["device_limit"] = limit
        return m

    def allocator_limit(self, dev, total):
        """The most the allocator may hold (set_per_process_memory_fraction's
        cap: the device's total times the fraction), or None when no cap is set
        or this torch does not tell it."""
        get = getattr(self.torch.cuda, "get_per_process_memory_fraction", None)
        if get is None:
            return None
        try:
            frac = float(get(dev))
        except Exception:  # noqa: BLE001 (a torch that cannot tell: no cap known)
            return None
        if not 0 < frac < 1:
            return None
        return min(int(total * frac), total)


class Hook:
    """One training process's link to its memsnap agent."""

    def __init__(self, socket_path=None, connect=True, torch_api=None):
        self.socket_path = socket_path or os.environ.get("MEMSNAP_SOCKET") or default_socket_path()
        self._torch = torch_api or _Torch()
        self._lock = threading.Lock()
        self._sock = None
        self._spool = None
        self._window = None       # dict from the agent: id, start, stop, max_entries, stacks
        self._recording = None    # the window being recorded
        self._marks = []          # [batch, start_us, end_us] inside the recording window
        self._cur_start = 0
        self._batch = -1
        self._sent_batch = -1
        self._outbox = []
        self._closed = False
        self._oom_attached = False
        self._wake = threading.Event()
        self._unsafe = None       # why the socket's folder was refused, once
        self._always = None       # history kept on from the start: {"max_entries", "stacks"}
        self._always_on = False
        self.errors = []          # what went wrong, for tests and logs
        # messages of a stopping process: appended from signal handlers, so taking
        # no lock (the interrupted thread may hold self._lock), drained by the thread
        self._urgent = collections.deque()
        self._stopped = False     # a stopping event was handled (at most once)
        self._oom_at = None       # time.monotonic() of the last OOM dump
        self.stop_wait = STOP_WAIT
        self._watched = None      # (model, [optimizers]), each a weak reference (see watch)
        self._grad_hooks = []     # handles of the gradient hooks of the window being recorded
        self._grads = {}          # (address, bytes, batch) -> [address, bytes, module, batch] made in the window
        self._mem_every = _memory_every()
        self._mem_next = 0.0      # time.monotonic() of the next memory report
        self._thread = None
        if connect:
            self._thread = threading.Thread(target=self._run, name="memsnap-hook", daemon=True)
            self._thread.start()
            _watch_stopping(self)

    # --- the training thread: cheap, never blocks ---------------------------------

    def batch_start(self, batch):
        """Call at the start of batch ``batch`` (0-based)."""
        self._batch = batch
        if self._grad_hooks and self._recording is None:
            self._unhook_grads()  # a cancelled window's, removed on the training thread
        if self._always is not None and not self._always_on:
            self._start_always()
        w = self._window
        if w is None and self._recording is None:
            return
        now = _now_us()
        if self._recording is None and w is not None:
            if batch == w["start"]:
                try:
                    if not self._always_on:
                        self._torch.start(w.get("max_entries") or 100000, w.get("stacks") or "python")
                    self._attach_oom()
                except Exception as e:  # recording failed: tell the agent, train on
                    self._window = None
                    self._send({"type": "error", "window": w["id"], "code": CODE_RECORD_FAILED,
                                "message": "could not start recording: %r" % (e,)})
                    return
                self._recording, self._marks = w, []
                self._hook_grads()
                self._send({"type": "recording", "window": w["id"], "batch": batch, "t_us": now})
            elif batch > w["start"]:
                self._window = None
                self._send({"type": "error", "window": w["id"], "code": CODE_START_PASSED,
                            "message": "window start %d already passed (batch %d)" % (w["start"], batch)})
                return
        if self._recording is not None:
            self._cur_start = now

    def batch_end(self, batch):
        """Call at the end of batch ``batch``."""
        if self._mem_every > 0 and time.monotonic() >= self._mem_next:
            self._report_memory(batch)
        w = self._recording
        if w is None:
            return
        self._marks.append({"batch": batch, "start_us": self._cur_start, "end_us": _now_us()})
        if batch >= w["stop"] - 1:
            self._recording, self._window = None, None
            stall = time.perf_counter()  # the training thread waits from here
            try:
                snap = self._snapshot()
                self._unhook_grads()
            except Exception as e:
                snap = None
                self._send({"type": "error", "window": w["id"], "code": CODE_DUMP_FAILED,
                            "message": "could not take the snapshot: %r" % (e,)})
            if not self._always_on:
                try:
                    self._torch.stop()
                except Exception:
                    pass
            stall_us = int((time.perf_counter() - stall) * 1e6)
            if snap is not None:
                marks, self._marks = self._marks, []
                w = dict(w, stall_us=stall_us)
                # pickling and writing happen on the hook's thread, not here
                with self._lock:
                    self._outbox.append(("dump", w, "window", snap, marks))
                self._wake.set()

    def _report_memory(self, batch):
        """Send the allocator's figures (at most once per MEMORY_EVERY seconds): a
        dict lookup of torch's statistics, about as cheap as torch.cuda.memory_allocated.
        Only the newest report waits while the agent is away."""
        self._mem_next = time.monotonic() + self._mem_every
        if self._sock is None or "torch" not in sys.modules:
            return
        try:
            m = self._torch.memory()
        except Exception as e:  # never again: a broken reading must not cost every batch
            self._mem_every = 0
            self.errors.append("memory figures: %r" % (e,))
            return
        if m is not None:
            with self._lock:
                self._outbox = [it for it in self._outbox if not (it[0] == "msg" and it[1].get("type") == "memory")]
                self._outbox.append(("msg", {"type": "memory", "batch": batch, "memory": m}))
            self._wake.set()

    def watch(self, model=None, *optimizers):
        """Tell the hook the trainer's model and optimizers. Every snapshot then
        carries the address range of each parameter, gradient and optimizer-state
        tensor (with its module's name, from ``named_parameters``), and memsnap's
        analysis says what the memory is: parameters, gradients, optimizer state,
        activations or temporaries. Gradients made during a window are seen as
        autograd makes them (torch 2.1's post-accumulate-grad hooks), so a
        trainer that frees them before the window ends is still understood. Only
        weak references are kept; call again when they change."""
        if model is not None and not callable(getattr(model, "named_parameters", None)):
            _warn_once("watch-model:" + type(model).__name__,
                       "memsnap_hook.watch: %s is not a torch.nn.Module (it has no named_parameters): its parameters "
                       "and gradients are not told apart in snapshots" % _type_name(model))
        for o in optimizers:
            if o is not None and not isinstance(getattr(o, "param_groups", None), (list, tuple)):
                _warn_once("watch-opt:" + type(o).__name__,
                           "memsnap_hook.watch: %s is not a torch optimizer (it has no param_groups): its state is "
                           "not told apart in snapshots" % _type_name(o))
        self._watched = (_ref(model) if model is not None else None, [_ref(o) for o in optimizers if o is not None])
        return self

    def _watched_objects(self):
        w = self._watched
        if w is None:
            return None, []
        model = w[0]() if w[0] is not None else None
        return model, [o for o in (r() for r in w[1]) if o is not None]

    def _named_params(self, model, opts):
        """(module name, parameter) of the model, then of the optimizers' groups."""
        seen = set()
        if model is not None:
            for name, p in model.named_parameters():
                seen.add(id(p))
                yield _cut_name(name.rpartition(".")[0] or "(model)"), p
        for o in opts:
            for g in getattr(o, "param_groups", ()):
                for p in g.get("params", ()):
                    if id(p) not in seen:
                        seen.add(id(p))
                        yield "(optimizer)", p

    def _hook_grads(self):
        """While a window records, note every gradient autograd accumulates."""
        self._grads = {}
        model, opts = self._watched_objects()
        if model is None and not opts:
            return
        try:
            for mod, p in self._named_params(model, opts):
                if not getattr(p, "requires_grad", True):
                    continue  # a frozen parameter has no gradient (and refuses the hook)
                reg = getattr(p, "register_post_accumulate_grad_hook", None)
                if reg is None:
                    break  # torch before 2.1: the gradients alive at the snapshot only
                try:
                    self._grad_hooks.append(reg(lambda t, mod=mod: self._note_grad(t, mod)))
                except Exception as e:  # this parameter only
                    if len(self.errors) < 100:
                        self.errors.append("gradient hook: %r" % (e,))
        except Exception as e:  # never break training
            self.errors.append("gradient hooks: %r" % (e,))

    def _note_grad(self, p, mod):
        """Runs inside autograd's backward: it must never raise."""
        try:
            if self._recording is None:
                return  # a cancelled window: its hooks go at the next batch
            r = _tensor_range(getattr(p, "grad", None))
            if r is None:
                return
            b = self._batch
            if type(b) is not int:
                b = int(operator.index(b))  # a numpy or torch integer; anything else is not noted
            key = (r[0], r[1], b)  # the allocator hands one address to many blocks
            if key not in self._grads and len(self._grads) < MAX_TENSORS:
                self._grads[key] = [r[0], r[1], mod, b]
        except Exception:
            pass

    def _unhook_grads(self):
        """The window's end (after its snapshot) or its cancellation: its gradient
        hooks go, and so do the gradients it saw made (a later OOM or post-mortem
        dump has no batch marks to place them by)."""
        hooks, self._grad_hooks = self._grad_hooks, []
        self._grads = {}
        for h in hooks:
            try:
                h.remove()
            except Exception:
                pass

    def _snapshot(self):
        """torch's snapshot, with the watched tensors under TENSORS_KEY."""
        snap = self._torch.snapshot()
        try:
            t = self._tensors()
            if t is not None and isinstance(snap, dict):
                snap[TENSORS_KEY] = t
        except Exception as e:  # the snapshot stands without them
            self.errors.append("watched tensors: %r" % (e,))
        return snap

    def _tensors(self):
        """The watched tensors now, [[address, bytes, kind, module], ...] with
        each storage once, and the gradients autograd made during the window,
        [[address, bytes, module, batch], ...]: the caching allocator hands a
        gradient's address to other blocks in other batches, so each is told
        with the batch it was made in."""
        model, opts = self._watched_objects()
        if model is None and not opts:
            return None
        out, seen, names = [], set(), {}

        def add(t, kind, mod):
            r = _tensor_range(t)
            if r is None or r[0] in seen or len(out) >= MAX_TENSORS:
                return
            seen.add(r[0])
            out.append([r[0], r[1], kind, mod])

        for mod, p in self._named_params(model, opts):
            mod = _cut_name(mod)
            names[id(p)] = mod
            add(p, "parameter", mod)
            add(getattr(p, "grad", None), "gradient", mod)
        for o in opts:
            try:
                states = list(getattr(o, "state", {}).items())
            except Exception as e:  # this optimizer only
                self.errors.append("optimizer state: %r" % (e,))
                continue
            for p, st in states:
                if isinstance(st, dict):
                    for v in st.values():
                        add(v, "optimizer_state", names.get(id(p), "(optimizer)"))
        return {"version": 2, "tensors": out, "gradients_made": list(self._grads.values())}

    def recording(self):
        """The window being recorded now, as {"id", "start", "stop"}, or None."""
        w = self._recording
        if w is None:
            return None
        return {"id": w["id"], "start": w["start"], "stop": w["stop"]}

    def step(self, batch):
        """A context manager around one training step."""
        return _Step(self, batch)

    def _start_always(self):
        """Turn allocator history on for good (the agent asked for --record-always)."""
        a = self._always
        self._always_on = True
        try:
            self._torch.start(a.get("max_entries") or 100000, a.get("stacks") or "python")
            self._attach_oom()
        except Exception as e:
            self.errors.append("record always: %r" % (e,))
            self._send({"type": "error", "code": CODE_RECORD_FAILED, "message": "could not keep history on: %r" % (e,)})

    # --- OOM --------------------------------------------------------------------

    def _attach_oom(self):
        if self._oom_attached:
            return
        attach = getattr(getattr(self._torch.torch, "_C", None), "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return
        attach(self._on_oom)
        self._oom_attached = True

    def attach_oom_observer(self):
        """Dump a snapshot whenever an OOM happens (done at the first window, too)."""
        try:
            self._attach_oom()
        except Exception as e:
            self.errors.append("oom observer: %r" % (e,))

    def _on_oom(self, device, alloc, device_alloc, device_free):
        try:
            snap = self._snapshot()
            # written now: the process may not live long after an OOM
            self._dump(None, "oom", snap, [])
            self._oom_at = time.monotonic()
        except Exception as e:
            self.errors.append("oom dump: %r" % (e,))
            self._send({"type": "error", "code": CODE_DUMP_FAILED, "message": "could not dump the OOM snapshot: %r" % (e,)})

    # --- a stopping process -------------------------------------------------------

    def _stopping(self, cause, exc=None):
        """The process is being stopped: tell the agent why, dump what history holds
        (reason "crash"), and wait up to stop_wait seconds until the hook's thread has
        sent both. Runs on the thread that noticed (a signal handler, the excepthook,
        atexit), at most once; never raises, never takes self._lock."""
        t = self._thread
        if self._stopped or self._closed or t is None or not t.is_alive() or self._sock is None or self._spool is None:
            return  # handled already, or no agent to tell: nothing is sent and nothing waits
        self._stopped = True
        now = _now_us()
        msg = {"type": "stopping", "cause": cause, "t_us": now}
        if self._batch >= 0:
            msg["batch"] = self._batch
        self._urgent.append(("msg", msg))
        rec = self._recording
        if (rec is not None or self._always_on) and not self._oom_dumped_for(exc):
            self._crash_dump(rec, cause, now)
        done = threading.Event()
        self._urgent.append(("done", done))
        self._wake.set()
        if threading.current_thread() is not t:
            done.wait(max(0.0, float(self.stop_wait)))

    def _crash_dump(self, rec, cause, now):
        marks = list(self._marks) if rec is not None else []
        b = self._batch
        if rec is not None and b >= rec["start"] and (not marks or marks[-1]["batch"] < b):
            # the batch in progress, up to now
            start = self._cur_start or now
            if marks:
                start = max(start, marks[-1]["end_us"])
            marks.append({"batch": b, "start_us": min(start, now), "end_us": now})
        try:
            snap = self._snapshot()
            if rec is not None:
                # the window ends here: a trainer that trains on (its previous SIGTERM
                # handler did not exit) does not dump it a second time
                self._recording, self._window, self._marks = None, None, []
                if not self._always_on:
                    try:
                        self._torch.stop()
                    except Exception:
                        pass
            self._urgent.append(("msg", self._write_spool(rec, "crash", snap, marks, cause=cause)))
        except Exception as e:
            self.errors.append("crash dump: %r" % (e,))
            err = {"type": "error", "code": CODE_DUMP_FAILED, "message": "could not dump the crash snapshot: %r" % (e,)}
            if rec is not None:
                err["window"] = rec["id"]
            self._urgent.append(("msg", err))

    def _oom_dumped_for(self, exc):
        """Whether exc is torch's OutOfMemoryError right after an OOM dump, which
        already holds what a crash dump would."""
        at = self._oom_at
        return at is not None and time.monotonic() - at < OOM_RECENT and _is_torch_oom(exc)

    # --- the hook's thread --------------------------------------------------------

    def _send(self, msg):
        with self._lock:
            self._outbox.append(("msg", msg))
        self._wake.set()

    def _connect(self):
        folder = os.path.dirname(os.path.abspath(self.socket_path))
        if not os.path.lexists(folder):
            # no agent yet (it makes the folder when it starts): nothing to say
            # beyond the warning at the first step, and no folder to judge
            raise OSError("%s: no such folder" % folder)
        problem = _private_dir_problem(folder)
        if problem is None:
            try:
                st = os.lstat(self.socket_path)
                if st.st_uid != os.getuid():
                    problem = "%s belongs to user %d, not to this user" % (self.socket_path, st.st_uid)
            except OSError:
                pass  # no socket yet: connect fails below
        if problem is not None:
            if self._unsafe != problem:
                self._unsafe = problem
                msg = "memsnap hook: not connecting to the agent: %s" % problem
                self.errors.append(msg)
                print(msg, file=sys.stderr)
            raise OSError(problem)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(1.0)
            s.connect(self.socket_path)
        except OSError:
            s.close()
            raise
        s.settimeout(0.05)
        hello = {"v": PROTOCOL_VERSION, "type": "hello", "pid": os.getpid(), "rank": _rank(),
                 "local_rank": _local_rank(), "hook": HOOK_VERSION}
        uuid = self._torch.device_uuid() if "torch" in sys.modules else ""
        if uuid:
            hello["device_uuid"] = uuid
        v = self._torch.version() if "torch" in sys.modules else ""
        if v:
            hello["torch"] = v
        s.sendall((json.dumps(hello) + "\n").encode())
        self._sock, self._sent_batch = s, -1

    def _drop(self):
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None

    def _run(self):
        buf = b""
        backoff = 0.2
        while not self._closed:
            if self._sock is None:
                try:
                    self._connect()
                    buf, backoff = b"", 0.2
                except OSError:
                    self._drop()
                    self._flush(connected=False)
                    self._wake.wait(backoff)
                    self._wake.clear()
                    backoff = min(backoff * 2, 5.0)
                    continue
            try:
                if self._batch != self._sent_batch:
                    b = self._batch
                    self._sock.sendall((json.dumps({"type": "batch", "batch": b, "t_us": _now_us()}) + "\n").encode())
                    self._sent_batch = b
                self._flush(connected=True)
                try:
                    chunk = self._sock.recv(65536)
                    if not chunk:
                        raise OSError("agent closed the connection")
                    buf += chunk
                    if len(buf) > MAX_LINE and b"\n" not in buf:
                        raise OSError("agent sent an overlong line")
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        self._on_message(line)
                except socket.timeout:
                    pass
            except OSError as e:
                self.errors.append("connection: %r" % (e,))
                self._drop()
                # a window in flight stays armed; the agent re-sends it on reconnect
            self._wake.wait(0.05)
            self._wake.clear()
        self._drop()

    def _flush(self, connected):
        items = []
        # a signal handler on the training thread may hold self._lock while it waits
        # for this thread: the urgent messages go out without it
        locked = self._lock.acquire(timeout=0.5)
        if locked:
            items, self._outbox = self._outbox, []
            self._lock.release()
        while self._urgent:
            items.append(self._urgent.popleft())
        try:
            self._send_items(items, connected, locked)
        except OSError:
            for it in items:
                if it[0] == "done":
                    it[1].set()  # the connection broke: a stopping trainer waits no longer
            raise

    def _send_items(self, items, connected, locked):
        keep = []
        for it in items:
            if it[0] == "done":
                if connected:
                    it[1].set()  # everything queued before it was sent
                else:
                    keep.append(it)
            elif it[0] == "dump":
                _, w, reason, snap, marks = it
                if self._spool is None:
                    keep.append(it)  # written once the agent says where
                    continue
                try:
                    self._dump(w, reason, snap, marks, send=connected)
                except Exception as e:
                    self.errors.append("dump: %r" % (e,))
                    msg = {"type": "error", "code": CODE_DUMP_FAILED,
                           "message": "could not write the snapshot: %r" % (e,)}
                    if w is not None:
                        msg["window"] = w["id"]
                    if connected:
                        self._sock.sendall((json.dumps(msg) + "\n").encode())
                    else:
                        keep.append(("msg", msg))
            elif connected:
                self._sock.sendall((json.dumps(it[1]) + "\n").encode())
            else:
                keep.append(it)
        if keep:
            if locked and self._lock.acquire(timeout=0.5):
                self._outbox = keep + self._outbox
                self._lock.release()
            else:
                self._urgent.extendleft(reversed(keep))

    def _dump(self, w, reason, snap, marks, send=True):
        """Write the snapshot into the agent's spool (see _write_spool) and tell the
        agent. A failure (a full disk) removes what was written and raises."""
        msg = self._write_spool(w, reason, snap, marks)
        if send and self._sock is not None and threading.current_thread() is self._thread:
            self._sock.sendall((json.dumps(msg) + "\n").encode())
        else:
            self._send(msg)

    def _write_spool(self, w, reason, snap, marks, cause=None):
        """Write the snapshot into the agent's spool: first the snapshot message beside
        it (NAME.json, so an agent that starts later can adopt the file), then the
        pickle under a hidden name, renamed into place once complete. Returns the
        message; a failure (a full disk) removes what was written and raises."""
        spool = self._spool
        if spool is None:
            raise OSError("no spool folder from the agent yet")
        wid = w["id"] if w is not None else 0
        kind = {"window": "w", "crash": "crash"}.get(reason, "oom")
        name = "rank%d.%s%d.%d.pickle" % (_rank(), kind, wid, time.time_ns())
        msg = {"type": "snapshot", "window": wid, "reason": reason}
        if cause is not None:
            msg["cause"] = cause
        msg["file"], msg["batches"] = name, marks
        if w is not None and "start" in w:
            msg["start"], msg["stop"] = w["start"], w["stop"]
        if w is not None and "stall_us" in w:
            msg["stall_us"] = w["stall_us"]
        line = (json.dumps(msg) + "\n").encode()
        side = os.path.join(spool, name[:-len(".pickle")] + ".json")
        written = []
        try:
            for path, write in ((side, lambda f: f.write(line)), (os.path.join(spool, name), lambda f: pickle.dump(snap, f, protocol=4))):
                t = os.path.join(spool, "." + os.path.basename(path))
                written.append(t)
                with open(t, "wb") as f:
                    write(f)
                    f.flush()
                    os.fsync(f.fileno())
                os.rename(t, path)
                written[-1] = path
        except BaseException:
            for p in written:
                try:
                    os.remove(p)
                except OSError:
                    pass
            raise
        if len(marks) > SOCKET_MARKS:
            # a long window's marks would not fit a socket line: the file beside
            # the snapshot holds them all
            msg = dict(msg)
            del msg["batches"]
            msg["batches_file"] = True
        return msg

    def _on_message(self, line):
        try:
            m = json.loads(line)
        except ValueError:
            self.errors.append("agent sent something that is not JSON")
            return
        if not isinstance(m, dict):
            return
        t = m.get("type")
        if t == "welcome":
            if m.get("record_always"):
                self._always = {"max_entries": m.get("max_entries"), "stacks": m.get("stacks")}
            sp = m.get("spool")
            if isinstance(sp, str):
                problem = _private_dir_problem(sp)
                if problem is None:
                    self._spool = sp
                else:
                    self.errors.append("agent's spool refused: %s" % problem)
        elif t == "window":
            try:
                w = {"id": int(m["id"]), "start": int(m["start"]), "stop": int(m["stop"]),
                     "max_entries": int(m.get("max_entries") or 100000), "stacks": str(m.get("stacks") or "python")}
            except (KeyError, TypeError, ValueError):
                self.errors.append("agent sent a malformed window")
                return
            if not (w["stop"] > w["start"] >= 0) or (self._recording is not None and self._recording["id"] == w["id"]):
                return
            if self._batch >= w["start"]:
                self._send({"type": "error", "window": w["id"], "code": CODE_START_PASSED,
                            "message": "window start %d already passed (batch %d)" % (w["start"], self._batch)})
                return
            self._window = w
            self._send({"type": "armed", "window": w["id"]})
        elif t == "dump":
            # a post-mortem: this rank's allocator state now, for another rank's OOM
            try:
                wid = int(m["id"])
            except (KeyError, TypeError, ValueError):
                self.errors.append("agent sent a malformed dump")
                return
            try:
                snap = self._snapshot()
                self._dump({"id": wid}, "postmortem", snap, [])
            except Exception as e:
                self.errors.append("post-mortem dump: %r" % (e,))
                self._send({"type": "error", "window": wid, "code": CODE_DUMP_FAILED,
                            "message": "could not take the post-mortem snapshot: %r" % (e,)})
        elif t == "cancel":
            w = self._window
            if w is not None and w["id"] == m.get("id"):
                self._window = None
            r = self._recording
            if r is not None and r["id"] == m.get("id"):
                self._recording, self._marks = None, []
                try:
                    self._torch.stop()
                except Exception:
                    pass
        elif t == "error":
            self.errors.append("agent: %s" % (m.get("message"),))

    def close(self, timeout=5.0):
        """Finish pending dumps (up to timeout seconds) and stop the thread."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self._lock:
                empty = not self._outbox and not self._urgent
            if empty:
                break
            self._wake.set()
            time.sleep(0.02)
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, deadline - time.time()) + 1.0)


# --- stopping events: SIGTERM, an uncaught exception, exit while recording ---------

_stop_lock = threading.Lock()
_stop_hooks = weakref.WeakSet()   # the connected hooks to tell
_stop_prev = {}                   # "excepthook", "sigterm": the handlers chained to
# "busy": stopping events being handled; "deferred": a SIGTERM that came meanwhile
_stop_state = {"busy": 0}


MAX_TENSORS = 1 << 20


def _tensor_range(t):
    """(address, bytes) of a CUDA tensor's storage, or None (also for anything that
    is not one, or raises)."""
    try:
        if t is None or not getattr(t, "is_cuda", False):
            return None
        try:
            st = t.untyped_storage()
            addr, n = int(st.data_ptr()), int(st.nbytes())
        except AttributeError:  # torch before 2.0
            addr, n = int(t.data_ptr()), int(t.numel() * t.element_size())
    except Exception:
        return None
    if addr <= 0 or n <= 0:
        return None
    return addr, n


def _cut_name(s):
    """A module's name as stored: at most MAX_MODULE bytes of UTF-8."""
    s = str(s)
    b = s.encode("utf-8", "replace")
    if len(b) <= MAX_MODULE:
        return s
    return b[:MAX_MODULE].decode("utf-8", "ignore")


def _ref(o):
    """A weak reference to o (a strong one when o takes none)."""
    try:
        return weakref.ref(o)
    except TypeError:
        return lambda: o


def _same(ref, o):
    return ref is not None and ref() is o


def _clip(s, n=MAX_CAUSE):
    """s cut to at most n bytes of UTF-8, never inside a character."""
    return s.encode("utf-8", "replace")[:n].decode("utf-8", "ignore")


def _is_torch_oom(exc):
    return exc is not None and any(
        c.__name__ == "OutOfMemoryError" and str(getattr(c, "__module__", "")).split(".")[0] == "torch"
        for c in type(exc).__mro__)


def _stop_all(cause, exc=None, recording_only=False):
    _stop_state["busy"] += 1
    try:
        for h in list(_stop_hooks):
            if recording_only and h._recording is None:
                continue
            try:
                h._stopping(cause, exc)
            except Exception:  # a hook must never stand in the way of a stop
                pass
    finally:
        _stop_state["busy"] -= 1


def _on_sigterm(signum, frame):
    if _stop_state["busy"]:
        # a SIGTERM while a stop is being handled (the excepthook's dump, say) is
        # passed on once that is done: the dump is not cut short, nor taken twice
        _stop_state["deferred"] = (signum, frame)
        return
    _stop_all("SIGTERM")
    _stop_state.pop("deferred", None)  # one SIGTERM passed on for both
    _chain_sigterm(signum, frame)


def _run_deferred():
    d = _stop_state.pop("deferred", None)
    if d is not None:
        _chain_sigterm(*d)


def _chain_sigterm(signum, frame):
    prev = _stop_prev.get("sigterm")
    if prev == signal.SIG_IGN:
        return
    if prev == signal.SIG_DFL or not callable(prev):
        # die by SIGTERM, as the process would have without the hook
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    prev(signum, frame)


def _excepthook(tp, value, tb):
    try:
        try:
            text = str(value)
        except Exception:
            text = "<unprintable %s>" % getattr(tp, "__name__", "exception")
        _stop_all(_clip("exception: %s: %s" % (getattr(tp, "__name__", "exception"), text)), value)
    except Exception:
        pass
    try:
        (_stop_prev.get("excepthook") or sys.__excepthook__)(tp, value, tb)
    finally:
        _run_deferred()


def _at_exit():
    _stop_all("exit", recording_only=True)  # an exit with no window recording is no stop
    _run_deferred()


def _watch_stopping(hook):
    """Tell hook about stopping events. The first hook installs the handlers, once a
    process: the excepthook and atexit from any thread, the SIGTERM handler only from
    the main thread (Python allows no other)."""
    with _stop_lock:
        _stop_hooks.add(hook)
        if "excepthook" not in _stop_prev:
            _stop_prev["excepthook"] = sys.excepthook
            sys.excepthook = _excepthook
            atexit.register(_at_exit)
        if "sigterm" in _stop_prev:
            return
        if threading.current_thread() is not threading.main_thread():
            hook.errors.append("no SIGTERM handler: the hook was created outside the main thread")
            return
        try:
            prev = signal.getsignal(signal.SIGTERM)
            if prev is None:
                hook.errors.append("no SIGTERM handler: SIGTERM's handler was not set from Python")
                return
            _stop_prev["sigterm"] = prev  # before the handler can run
            signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError) as e:
            _stop_prev.pop("sigterm", None)
            hook.errors.append("no SIGTERM handler: %r" % (e,))


class _Step:
    __slots__ = ("hook", "batch")

    def __init__(self, hook, batch):
        self.hook, self.batch = hook, batch

    def __enter__(self):
        self.hook.batch_start(self.batch)
        return self

    def __exit__(self, *exc):
        self.hook.batch_end(self.batch)
        return False


_default = None
_default_lock = threading.Lock()


def _memory_every():
    v = os.environ.get("MEMSNAP_MEMORY_EVERY", "")
    try:
        return float(v) if v else MEMORY_EVERY
    except ValueError:
        return MEMORY_EVERY


def get_hook():
    """The process-wide hook, created on first use (the first step): it warns
    then, once, of what would keep every window from being recorded."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Hook()
                _check_setup(_default)
    return _default


_warned = set()


def _warn_once(key, msg):
    """A RuntimeWarning, once per process and key, pointing at the trainer's call."""
    if key in _warned:
        return
    _warned.add(key)
    level, f = 2, sys._getframe(1)  # level 1 is this function
    while f is not None and f.f_globals.get("__name__") == __name__:
        level, f = level + 1, f.f_back
    warnings.warn(msg, RuntimeWarning, stacklevel=level)


def _type_name(o):
    t = type(o)
    return "%s.%s" % (t.__module__, t.__qualname__) if t.__module__ not in ("builtins", "__main__") else t.__qualname__


def _check_setup(hook):
    """Warn (once) of what keeps windows from being recorded: torch that cannot be
    imported, or no agent at the socket. Training goes on in either case."""
    mod = sys.modules.get("torch", False)
    missing = mod is None  # (None: importing it is known to fail)
    if mod is False:
        try:
            import importlib.util
            missing = importlib.util.find_spec("torch") is None
        except Exception:
            missing = False
    if missing:
        _warn_once("torch", "memsnap: torch cannot be imported in this process: no window can be recorded "
                            "(the agent hears 'could not start recording' for each)")
    if not _agent_present(hook.socket_path):
        where = "$MEMSNAP_SOCKET" if os.environ.get("MEMSNAP_SOCKET") else \
            "the default path for this run and local rank; $MEMSNAP_SOCKET is not set"
        _warn_once("agent", "memsnap: no agent listens at %s (%s): training goes on unrecorded, and the hook "
                            "connects when one does (run the trainer under `memsnap agent ... -- python train.py`, "
                            "which sets MEMSNAP_SOCKET)" % (hook.socket_path, where))


def watch(model=None, *optimizers):
    """Tell memsnap the trainer's model and optimizers (see Hook.watch): snapshots
    then say which memory is parameters, gradients, optimizer state and
    activations, per module."""
    return get_hook().watch(model, *optimizers)


def batch_start(batch):
    get_hook().batch_start(batch)


def batch_end(batch):
    get_hook().batch_end(batch)


def step(batch):
    return get_hook().step(batch)


# --- framework callbacks -------------------------------------------------------


def _agent_present(path=None):
    p = path or os.environ.get("MEMSNAP_SOCKET") or default_socket_path()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(0.5)
        s.connect(p)
        return True
    except OSError:
        return False
    finally:
        s.close()


class _ComposerLike:
    """Composer's MemorySnapshot, driven by the memsnap agent when one is present.

    With an agent, windows come from the agent (``memsnap agent --window`` or the
    leader) and the snapshot goes to the agent's store. With none, it behaves as
    Composer's own callback: it records ``interval`` batches after ``skip_batches``
    and writes ``folder/filename.pickle`` (and uploads it through Composer's logger
    when ``remote_file_name`` is set and a logger is given)."""

    def __init__(self, skip_batches=1, interval="3ba", max_entries=100000, folder="{run_name}/torch_traces",
                 filename="rank{rank}.{batch}.memory_snapshot", remote_file_name="{run_name}/torch_memory_traces",
                 overwrite=False, hook=None):
        self.skip_batches = int(skip_batches)
        iv = str(interval).strip()
        self.interval = int(iv[:-2] if iv.endswith("ba") else iv)
        if self.interval <= 0:
            raise ValueError("interval must be a positive number of batches")
        self.max_entries = int(max_entries)
        self.folder, self.filename = folder, filename
        self.remote_file_name, self.overwrite = remote_file_name, overwrite
        self._hook = hook
        self._standalone = None
        self._cur = 0
        self._watching = None

    def _get_hook(self):
        if self._hook is None:
            if _agent_present():
                self._hook = get_hook()
                self._standalone = False
            else:
                self._hook = Hook(connect=False)
                self._standalone = True
                start = self.skip_batches
                self._hook._window = {"id": 1, "start": start, "stop": start + self.interval,
                                      "max_entries": self.max_entries, "stacks": "python"}
        return self._hook

    def _fmt(self, s, state, batch):
        run = getattr(state, "run_name", None) or _run_name()
        return s.format(run_name=run, rank=_rank(), local_rank=_local_rank(),
                        node_rank=_env_int("GROUP_RANK", "SLURM_NODEID", "OMPI_COMM_WORLD_NODE_RANK"),
                        world_size=_env_int("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", default=1),
                        local_world_size=_env_int("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", default=1),
                        batch=batch, epoch=0)

    def on_batch_start(self, batch, state=None):
        self._cur = batch
        h = self._get_hook()
        model = getattr(state, "model", None)
        if model is not None and not _same(self._watching, model):
            self._watching = _ref(model)
            opts = getattr(state, "optimizers", None) or []
            h.watch(model, *(opts if isinstance(opts, (list, tuple)) else [opts]))
        h.batch_start(batch)

    def on_batch_end(self, state=None, logger=None):
        h = self._get_hook()
        h.batch_end(self._cur)
        if self._standalone:
            with h._lock:
                items, h._outbox = h._outbox, []
            for it in items:
                if it[0] == "dump":
                    self._write_local(it[3], state, logger, self._cur + 1)

    def _write_local(self, snap, state, logger, batch):
        folder = self._fmt(self.folder, state, batch)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, self._fmt(self.filename, state, batch) + ".pickle")
        if os.path.exists(path) and not self.overwrite:
            raise FileExistsError("%s exists; pass overwrite=True to replace it" % path)
        with open(path, "wb") as f:
            pickle.dump(snap, f, protocol=4)
        if logger is not None and self.remote_file_name:
            remote = os.path.join(self._fmt(self.remote_file_name, state, batch), os.path.basename(path)).lstrip("/")
            logger.upload_file(remote_file_name=remote, file_path=path, overwrite=self.overwrite)
        return path

    # Composer's event API
    def run_event(self, event, state, logger):
        name = getattr(event, "value", str(event))
        if name == "batch_start":
            self.on_batch_start(int(state.timestamp.batch), state)
        elif name == "batch_end":
            self.on_batch_end(state, logger)

    def batch_start(self, state, logger):
        self.on_batch_start(int(state.timestamp.batch), state)

    def batch_end(self, state, logger):
        self.on_batch_end(state, logger)


def _subclass(base_paths, cls, name):
    import importlib
    for mod, attr in base_paths:
        try:
            base = getattr(importlib.import_module(mod), attr)
            return type(name, (cls, base), {})
        except Exception:
            continue
    return cls


def composer_callback(**kwargs):
    """A Composer callback with MemorySnapshot's arguments (a composer Callback when
    Composer is installed; the same object, duck-typed, when it is not)."""
    cls = _subclass([("composer.core", "Callback")], _ComposerLike, "MemsnapMemorySnapshot")
    obj = cls.__new__(cls)
    _ComposerLike.__init__(obj, **kwargs)
    return obj


class _LightningLike:
    """Numbers batches by the trainer's ``global_step`` (restored with a
    checkpoint, so a resumed or requeued job goes on counting where it stopped);
    with gradient accumulation over k batches, batch ``global_step * k + i`` for
    the i-th batch of the step. Without a global_step, it counts batches itself."""

    def __init__(self, hook=None):
        self._hook, self._n = hook, 0
        self._b = -1
        self._watching = None

    def _batch(self, trainer, batch_idx):
        gs = getattr(trainer, "global_step", None)
        if not isinstance(gs, int) or isinstance(gs, bool) or gs < 0:
            return self._n
        acc = getattr(trainer, "accumulate_grad_batches", 1)
        if isinstance(acc, int) and not isinstance(acc, bool) and acc > 1 and isinstance(batch_idx, int):
            return gs * acc + batch_idx % acc
        return gs

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx, *args):
        h = self._hook or get_hook()
        if pl_module is not None and not _same(self._watching, pl_module):
            self._watching = _ref(pl_module)
            h.watch(pl_module, *(getattr(trainer, "optimizers", None) or []))
        self._b = self._batch(trainer, batch_idx)
        h.batch_start(self._b)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        (self._hook or get_hook()).batch_end(self._b)
        self._n += 1


def lightning_callback(hook=None):
    """A PyTorch Lightning callback (lightning.pytorch or pytorch_lightning)."""
    cls = _subclass([("lightning.pytorch", "Callback"), ("pytorch_lightning", "Callback")], _LightningLike, "MemsnapLightning")
    obj = cls.__new__(cls)
    _LightningLike.__init__(obj, hook)
    return obj


class _HFLike:
    def __init__(self, hook=None):
        self._hook, self._b = hook, 0
        self._watching = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._b = int(getattr(state, "global_step", self._b))
        h = self._hook or get_hook()
        model, opt = kwargs.get("model"), kwargs.get("optimizer")
        if model is not None and not _same(self._watching, model):
            self._watching = _ref(model)
            h.watch(model, *([opt] if opt is not None else []))
        h.batch_start(self._b)

    def on_step_end(self, args, state, control, **kwargs):
        (self._hook or get_hook()).batch_end(self._b)


def hf_callback(hook=None):
    """A Hugging Face transformers TrainerCallback."""
    cls = _subclass([("transformers", "TrainerCallback")], _HFLike, "MemsnapHF")
    obj = cls.__new__(cls)
    _HFLike.__init__(obj, hook)
    return obj
