"""Tests of the hook's state machine against a stand-in torch and a stand-in agent.
Run: PYTHONPATH=rankagent/hook/testdata/faketorch python3 -m unittest discover -s rankagent/hook"""
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
# MEMSNAP_HOOK_INSTALLED=1 tests the copy pip installed, not the one beside this file
INSTALLED = os.environ.get("MEMSNAP_HOOK_INSTALLED") == "1"
SRC = [] if INSTALLED else [HERE]
sys.path.insert(0, os.path.join(HERE, "testdata", "faketorch"))
if not INSTALLED:
    sys.path.insert(0, HERE)

import torch  # noqa: E402  (the stand-in)
import memsnap_hook  # noqa: E402

if INSTALLED and os.path.dirname(os.path.abspath(memsnap_hook.__file__)) == HERE:
    raise ImportError("MEMSNAP_HOOK_INSTALLED=1, but memsnap_hook comes from the source folder")


class FakeAgent:
    """A Unix-socket server that speaks the agent's side of the protocol."""

    def __init__(self, window=None, record_always=False):
        self.record_always = record_always
        self.dir = tempfile.mkdtemp(prefix="msh")
        self.path = os.path.join(self.dir, "a.sock")
        self.spool = os.path.join(self.dir, "incoming")
        os.mkdir(self.spool)
        self.window = window
        self.messages = []
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(4)
        self.conn = None
        self.stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stop:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            self.conn = c
            buf = b""
            while True:
                try:
                    d = c.recv(65536)
                except OSError:
                    break
                if not d:
                    break
                buf += d
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    m = json.loads(line)
                    self.messages.append(m)
                    if m["type"] == "hello":
                        welcome = {"v": 1, "type": "welcome", "spool": self.spool}
                        if getattr(self, "record_always", False):
                            welcome.update(record_always=True, max_entries=777, stacks="python")
                        c.sendall((json.dumps(welcome) + "\n").encode())
                        if self.window:
                            c.sendall((json.dumps(dict(self.window, type="window")) + "\n").encode())

    def close(self):
        self.stop = True
        self.srv.close()
        if self.conn:
            self.conn.close()

    def of(self, t):
        return [m for m in self.messages if m["type"] == t]


def wait(cond, timeout=5.0):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


class FakeStorage:
    def __init__(self, ptr, n):
        self.ptr, self.n = ptr, n

    def data_ptr(self):
        return self.ptr

    def nbytes(self):
        return self.n


class FakeTensor:
    """A CUDA tensor of n bytes at ptr (a view shares its base's storage)."""

    def __init__(self, ptr, n, cuda=True, base=None):
        self.storage = base.storage if base is not None else FakeStorage(ptr, n)
        self.is_cuda = cuda
        self.grad = None
        self.hooks = {}

    def untyped_storage(self):
        return self.storage

    def register_post_accumulate_grad_hook(self, fn):
        key = object()
        self.hooks[key] = fn
        t = self

        class Handle:
            def remove(self):
                t.hooks.pop(key, None)
        return Handle()

    def backward_made(self, grad):
        """What autograd does: set .grad, then call the hooks."""
        self.grad = grad
        for fn in list(self.hooks.values()):
            fn(self)


class FakeModel:
    def __init__(self, params):
        self.params = params

    def named_parameters(self):
        return iter(self.params)


class FakeOptimizer:
    def __init__(self, params, state):
        self.param_groups = [{"params": params}]
        self.state = state


MiB = 1 << 20


class WatchTest(unittest.TestCase):
    def setUp(self):
        torch.calls.clear()

    def test_snapshot_carries_the_watched_tensors(self):
        w1, b1 = FakeTensor(0x10000000, 4 * MiB), FakeTensor(0x10400000, 4096)
        w2, scale = FakeTensor(0x20000000, 8 * MiB), FakeTensor(0x30000000, 512)
        view = FakeTensor(0, 0, base=w2)           # shares w2's storage: counted once
        cpu = FakeTensor(0x40000000, 1 << 30, cuda=False)
        model = FakeModel([("enc.fc1.weight", w1), ("enc.fc1.bias", b1), ("dec.weight", w2), ("scale", scale), ("dec.tied", view)])
        extra = FakeTensor(0x50000000, 2 * MiB)    # in the optimizer only
        m1, v1 = FakeTensor(0x60000000, 4 * MiB), FakeTensor(0x60400000, 4 * MiB)
        opt = FakeOptimizer([w1, b1, w2, scale, extra], {w1: {"exp_avg": m1, "exp_avg_sq": v1, "step": cpu}, extra: {"momentum_buffer": FakeTensor(0x70000000, 2 * MiB)}})
        w1.grad = FakeTensor(0x80000000, 4 * MiB)  # alive at the snapshot
        agent = FakeAgent({"id": 2, "start": 1, "stop": 3})
        hook = memsnap_hook.Hook(agent.path)
        try:
            hook.watch(model, opt)
            self.assertTrue(wait(lambda: hook._window is not None), "the window never arrived")
            hook.batch_start(0)
            hook.batch_end(0)
            self.assertEqual(w2.hooks, {}, "gradient hooks before the window")
            hook.batch_start(1)
            self.assertEqual(len(w2.hooks), 1, "no gradient hook while the window records")
            # a gradient made in the window and freed before its end (zero_grad(set_to_none))
            w2.backward_made(FakeTensor(0x90000000, 8 * MiB))
            w2.backward_made(FakeTensor(0x90000000, 8 * MiB))  # accumulated again: told once
            w2.grad = None
            hook.batch_end(1)
            hook.batch_start(2)
            # the next batch's gradient of another size at the same address: told too
            w2.backward_made(FakeTensor(0x90000000, 4096))
            w2.grad = None
            hook.batch_end(2)
            self.assertEqual(w2.hooks, {}, "gradient hooks left after the window")
            self.assertTrue(wait(lambda: agent.of("snapshot")), "no snapshot message")
            with open(os.path.join(agent.spool, agent.of("snapshot")[0]["file"]), "rb") as f:
                snap = pickle.load(f)
            t = snap[memsnap_hook.TENSORS_KEY]
            self.assertEqual(t["version"], 2)
            self.assertEqual(sorted(map(tuple, t["gradients_made"])), [(0x90000000, 4096, "dec", 2), (0x90000000, 8 * MiB, "dec", 1)])
            got = sorted(map(tuple, t["tensors"]))
            want = sorted([
                (0x10000000, 4 * MiB, "parameter", "enc.fc1"), (0x10400000, 4096, "parameter", "enc.fc1"),
                (0x20000000, 8 * MiB, "parameter", "dec"), (0x30000000, 512, "parameter", "(model)"),
                (0x50000000, 2 * MiB, "parameter", "(optimizer)"),
                (0x80000000, 4 * MiB, "gradient", "enc.fc1"),
                (0x60000000, 4 * MiB, "optimizer_state", "enc.fc1"), (0x60400000, 4 * MiB, "optimizer_state", "enc.fc1"),
                (0x70000000, 2 * MiB, "optimizer_state", "(optimizer)"),
            ])
            self.assertEqual(got, want)
            self.assertEqual(hook.errors, [])
        finally:
            hook.close()
            agent.close()

    def test_unwatched_snapshot_is_torchs_own(self):
        agent = FakeAgent({"id": 3, "start": 0, "stop": 1})
        hook = memsnap_hook.Hook(agent.path)
        try:
            self.assertTrue(wait(lambda: hook._window is not None))
            hook.batch_start(0)
            hook.batch_end(0)
            self.assertTrue(wait(lambda: agent.of("snapshot")))
            with open(os.path.join(agent.spool, agent.of("snapshot")[0]["file"]), "rb") as f:
                self.assertNotIn(memsnap_hook.TENSORS_KEY, pickle.load(f))
        finally:
            hook.close()
            agent.close()

    def test_a_broken_model_does_not_break_the_snapshot(self):
        class Broken:
            def named_parameters(self):
                raise RuntimeError("no parameters today")
        agent = FakeAgent({"id": 4, "start": 0, "stop": 1})
        hook = memsnap_hook.Hook(agent.path)
        try:
            broken = Broken()  # the hook keeps only a weak reference
            hook.watch(broken)
            self.assertTrue(wait(lambda: hook._window is not None))
            hook.batch_start(0)
            hook.batch_end(0)
            self.assertTrue(wait(lambda: agent.of("snapshot")), "the snapshot was lost")
            self.assertTrue(any("no parameters today" in e for e in hook.errors), hook.errors)
        finally:
            hook.close()
            agent.close()

    def test_hostile_tensors_never_reach_training(self):
        class Raising(FakeTensor):
            @property
            def is_cuda(self):
                raise RuntimeError("no device")

            @is_cuda.setter
            def is_cuda(self, v):
                pass
        frozen = FakeTensor(0x1000, 4096)
        frozen.requires_grad = False

        def refuse(fn):
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        frozen.register_post_accumulate_grad_hook = refuse
        live = FakeTensor(0x2000, 4096)
        long_name = "\u00e9" * 400 + ".weight"   # 800 bytes of UTF-8 before the dot
        model = FakeModel([("frozen", frozen), (long_name, live)])
        hook = memsnap_hook.Hook(connect=False)
        hook.watch(model)
        hook._recording = {"id": 1, "start": 0, "stop": 1}
        hook._hook_grads()
        self.assertEqual(len(live.hooks), 1, "a frozen parameter stopped the others' gradient hooks")
        live.backward_made(Raising(0x3000, 64))   # the hook swallows it; backward goes on
        t = hook._tensors()["tensors"]
        mods = {x[3] for x in t}
        self.assertEqual(len(mods), 2)
        for m in mods:
            self.assertLessEqual(len(m.encode("utf-8")), memsnap_hook.MAX_MODULE)
        hook._unhook_grads()

    def test_gradient_notes_hold_plain_batches(self):
        """_note_grad runs inside autograd's backward: a batch that is not a plain
        int (a numpy or torch integer, an object that is none) never raises, and
        the snapshot holds only plain ints (the analysis reads nothing else, and
        a batch object that cannot be pickled would lose the whole snapshot)."""
        class Index:  # a numpy or 0-d torch integer: hashable only by identity, not equal to its int
            def __init__(self, n):
                self.n = n

            def __index__(self):
                return self.n

            def __reduce__(self):
                raise TypeError("cannot pickle an Index")

        class Unhashable:
            __hash__ = None

            def __index__(self):
                raise TypeError("not an integer")

        w = FakeTensor(0x1000, 4096)
        model = FakeModel([("fc.weight", w)])  # watch keeps a weak reference
        hook = memsnap_hook.Hook(connect=False)
        hook.watch(model)
        hook._recording = {"id": 1, "start": 0, "stop": 9}
        hook._hook_grads()
        for b in (Index(3), Index(3), Unhashable(), 4, True):
            hook._batch = b
            w.backward_made(FakeTensor(0x9000, 4096))
        made = hook._tensors()["gradients_made"]
        self.assertEqual(sorted(map(tuple, made)), [(0x9000, 4096, "fc", 1), (0x9000, 4096, "fc", 3), (0x9000, 4096, "fc", 4)])
        for m in made:
            self.assertIs(type(m[3]), int)
        pickle.dumps(made)
        hook._unhook_grads()

    def test_gradient_notes_end_with_their_window(self):
        """The gradients a window saw made are told in its snapshot only: an OOM or
        post-mortem dump after it (with no batch marks) must not carry them (the
        analysis would take every block at those addresses, in any batch, for a
        gradient), nor keep them in the trainer's memory."""
        w = FakeTensor(0x1000, 4096)
        model = FakeModel([("fc.weight", w)])  # watch keeps a weak reference
        hook = memsnap_hook.Hook(connect=False)
        hook.watch(model)
        hook._recording = {"id": 1, "start": 0, "stop": 1}
        hook._batch = 0
        hook._hook_grads()
        w.backward_made(FakeTensor(0x9000, 4096))
        self.assertEqual(len(hook._tensors()["gradients_made"]), 1)
        hook._recording = None
        hook._unhook_grads()  # the window's end, after its snapshot
        self.assertEqual(hook._tensors()["gradients_made"], [])

    def test_callbacks_watch_on_their_own(self):
        model = FakeModel([("w", FakeTensor(0x1000, 4096))])
        opt = FakeOptimizer([], {})
        hook = memsnap_hook.Hook(connect=False)
        lc = memsnap_hook.lightning_callback(hook)

        class Trainer:
            optimizers = [opt]
        lc.on_train_batch_start(Trainer(), model, None, 0)
        self.assertIs(hook._watched_objects()[0], model)
        self.assertEqual(hook._watched_objects()[1], [opt])
        hook2 = memsnap_hook.Hook(connect=False)
        hf = memsnap_hook.hf_callback(hook2)

        class State:
            global_step = 0
        hf.on_step_begin(None, State(), None, model=model, optimizer=opt)
        self.assertIs(hook2._watched_objects()[0], model)
        self.assertEqual(hook2._tensors()["tensors"], [[0x1000, 4096, "parameter", "(model)"]])


class EarlyWarningTest(unittest.TestCase):
    """What keeps windows from being recorded is said at the first step, once, as
    a RuntimeWarning at the trainer's own line."""

    def run_trainer(self, code, env=None):
        e = dict(os.environ, PYTHONPATH=os.pathsep.join(SRC + [os.path.join(HERE, "testdata", "faketorch")]))
        e.update(env or {})
        return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=60)

    def test_no_agent_is_said_at_the_first_step(self):
        sock = os.path.join(tempfile.mkdtemp(prefix="msh"), "none.sock")
        r = self.run_trainer("import memsnap_hook\nfor b in range(3):\n    memsnap_hook.batch_start(b); memsnap_hook.batch_end(b)\n",
                             {"MEMSNAP_SOCKET": sock})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr.count("RuntimeWarning: memsnap: no agent listens at " + sock + " ($MEMSNAP_SOCKET)"), 1, r.stderr)
        self.assertIn("<string>:3: RuntimeWarning", r.stderr)  # the trainer's line: its first batch_start
        r = self.run_trainer("import memsnap_hook\nmemsnap_hook.batch_start(0)\n", {"MEMSNAP_SOCKET": ""})
        self.assertIn("$MEMSNAP_SOCKET is not set", r.stderr)

    def test_an_agent_present_is_no_warning(self):
        agent = FakeAgent()
        try:
            r = self.run_trainer("import memsnap_hook\nmemsnap_hook.batch_start(0)\n", {"MEMSNAP_SOCKET": agent.path})
        finally:
            agent.close()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("Warning", r.stderr)

    def test_no_torch_is_said_at_the_first_step(self):
        agent = FakeAgent()
        try:
            r = self.run_trainer("import sys\nsys.modules['torch'] = None\nimport memsnap_hook\nmemsnap_hook.batch_start(0)\n",
                                 {"MEMSNAP_SOCKET": agent.path})
        finally:
            agent.close()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("RuntimeWarning: memsnap: torch cannot be imported", r.stderr)
        self.assertNotIn("no agent", r.stderr)

    def test_watch_of_what_is_no_model_is_said_once(self):
        import warnings
        hook = memsnap_hook.Hook(connect=False)

        class NotAModel:
            pass
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            hook.watch(NotAModel(), object())
            hook.watch(NotAModel(), object())
            hook.watch(FakeModel([]), FakeOptimizer([], {}))
        msgs = [str(w.message) for w in got]
        self.assertEqual(len(msgs), 2, msgs)
        self.assertIn("NotAModel is not a torch.nn.Module", msgs[0])
        self.assertIn("object is not a torch optimizer", msgs[1])
        self.assertEqual(got[0].filename, os.path.abspath(__file__).replace(".pyc", ".py"))


class LightningNumberingTest(unittest.TestCase):
    def test_batches_are_numbered_by_global_step(self):
        hook = memsnap_hook.Hook(connect=False)
        lc = memsnap_hook.lightning_callback(hook)

        class Trainer:
            optimizers = []
            global_step = 120  # resumed from a checkpoint
            accumulate_grad_batches = 1
        t = Trainer()
        seen = []
        for i in range(3):
            lc.on_train_batch_start(t, None, None, i)
            seen.append(hook._batch)
            t.global_step += 1  # the optimizer steps before the batch ends
            lc.on_train_batch_end(t, None, None, None, i)
        self.assertEqual(seen, [120, 121, 122])
        # accumulating 4 batches a step: global_step * 4 + the batch's place in it
        t.global_step, t.accumulate_grad_batches, seen = 10, 4, []
        for i in range(8):
            lc.on_train_batch_start(t, None, None, i)
            seen.append(hook._batch)
            if i % 4 == 3:
                t.global_step += 1
            lc.on_train_batch_end(t, None, None, None, i)
        self.assertEqual(seen, list(range(40, 48)))
        # a trainer without a global_step: counted by the callback
        lc2 = memsnap_hook.lightning_callback(memsnap_hook.Hook(connect=False))

        class Bare:
            optimizers = []
        lc2.on_train_batch_start(Bare(), None, None, 0)
        self.assertEqual(lc2._b, 0)


class HookTest(unittest.TestCase):
    def setUp(self):
        torch.calls.clear()

    def run_batches(self, hook, n, pace=0.005, first=0):
        for b in range(first, first + n):
            with hook.step(b):
                time.sleep(pace)

    def test_window_records_exactly_the_asked_batches(self):
        agent = FakeAgent({"id": 7, "start": 3, "stop": 6, "max_entries": 1234, "stacks": "python"})
        hook = memsnap_hook.Hook(agent.path)
        try:
            self.assertTrue(wait(lambda: hook._window is not None), "the window never arrived")
            self.run_batches(hook, 10)
            self.assertTrue(wait(lambda: agent.of("snapshot")), "no snapshot message")
            rec = [c for c in torch.calls if c[0] == "record"]
            self.assertEqual(rec[0], ("record", "all", "all", "python", 1234))
            self.assertEqual(rec[1][1], None)  # enabled=None turns history off
            snap = agent.of("snapshot")[0]
            self.assertEqual(snap["window"], 7)
            self.assertEqual([b["batch"] for b in snap["batches"]], [3, 4, 5])
            for b in snap["batches"]:
                self.assertLessEqual(b["start_us"], b["end_us"])
            with open(os.path.join(agent.spool, snap["file"]), "rb") as f:
                self.assertIn("device_traces", pickle.load(f))
            # batch progress reached the agent
            self.assertTrue(wait(lambda: any(m.get("batch") == 9 for m in agent.of("batch"))))
        finally:
            hook.close()
            agent.close()

    def test_window_lifecycle_messages_and_companion(self):
        agent = FakeAgent({"id": 4, "start": 2, "stop": 4})
        hook = memsnap_hook.Hook(agent.path)
        try:
            self.assertTrue(wait(lambda: agent.of("armed")), "no armed message")
            self.assertEqual(agent.of("armed")[0]["window"], 4)
            self.run_batches(hook, 6)
            self.assertTrue(wait(lambda: agent.of("snapshot")))
            self.assertEqual(agent.of("recording")[0], {"type": "recording", "window": 4, "batch": 2,
                                                        "t_us": agent.of("recording")[0]["t_us"]})
            snap = agent.of("snapshot")[0]
            self.assertEqual((snap["start"], snap["stop"]), (2, 4))
            side = os.path.join(agent.spool, snap["file"][:-len(".pickle")] + ".json")
            with open(side) as f:
                self.assertEqual(json.loads(f.read()), snap)
            self.assertFalse([n for n in os.listdir(agent.spool) if n.startswith(".")], "hidden leftovers")
        finally:
            hook.close()
            agent.close()

    def test_failed_dump_reaches_the_agent(self):
        import errno

        class Full:
            def __reduce__(self):
                raise OSError(errno.ENOSPC, "No space left on device")

        orig = torch.cuda.memory._snapshot
        torch.cuda.memory._snapshot = lambda: {"segments": [], "device_traces": [[]], "x": Full()}
        agent = FakeAgent({"id": 5, "start": 1, "stop": 2})
        hook = memsnap_hook.Hook(agent.path)
        try:
            self.assertTrue(wait(lambda: agent.of("armed")))
            self.run_batches(hook, 3)
            self.assertTrue(wait(lambda: agent.of("error")), "the failed dump was not reported")
            err = agent.of("error")[0]
            self.assertEqual((err["code"], err["window"]), ("dump_failed", 5))
            self.assertIn("No space left", err["message"])
            self.assertEqual(os.listdir(agent.spool), [], "a failed dump left files behind")
            self.assertFalse(agent.of("snapshot"))
        finally:
            torch.cuda.memory._snapshot = orig
            hook.close()
            agent.close()

    def test_refuses_a_socket_folder_others_can_write(self):
        agent = FakeAgent({"id": 1, "start": 1, "stop": 2})
        os.chmod(agent.dir, 0o777)
        hook = memsnap_hook.Hook(agent.path)
        try:
            self.assertTrue(wait(lambda: any("writable by others" in e for e in hook.errors)), hook.errors)
            self.assertFalse(agent.of("hello"), "the hook connected through a folder others can write")
        finally:
            hook.close()
            agent.close()

    def test_legacy_signature(self):
        calls = []

        def legacy(enabled, trace_alloc_max_entries=1, trace_alloc_record_context=False):
            calls.append((enabled, trace_alloc_max_entries, trace_alloc_record_context))

        orig = torch.cuda.memory._record_memory_history
        torch.cuda.memory._record_memory_history = legacy
        agent = FakeAgent({"id": 1, "start": 1, "stop": 3, "max_entries": 99})
        hook = memsnap_hook.Hook(agent.path)
        try:
            self.assertTrue(wait(lambda: hook._window is not None))
            self.run_batches(hook, 4)
            self.assertEqual(calls, [(True, 99, True), (False, 1, False)])
            self.assertTrue(wait(lambda: agent.of("snapshot")))
        finally:
            torch.cuda.memory._record_memory_history = orig
            hook.close()
            agent.close()

    def test_missed_window_is_reported(self):
        agent = FakeAgent()
        hook = memsnap_hook.Hook(agent.path)
        try:
            self.assertTrue(wait(lambda: agent.of("hello")))
            self.run_batches(hook, 5)
            hook._on_message(json.dumps({"type": "window", "id": 2, "start": 1, "stop": 3}).encode())
            self.run_batches(hook, 1, first=5)
            self.assertTrue(wait(lambda: agent.of("error")))
            self.assertIn("already passed", agent.of("error")[0]["message"])
            self.assertEqual(agent.of("error")[0]["code"], "start_passed")
            self.assertFalse([c for c in torch.calls if c[0] == "record"])
        finally:
            hook.close()
            agent.close()

    def test_no_agent_trains_on_and_reconnects(self):
        d = tempfile.mkdtemp(prefix="msh")
        path = os.path.join(d, "a.sock")
        hook = memsnap_hook.Hook(path)
        try:
            t = time.perf_counter()
            self.run_batches(hook, 20, pace=0)
            self.assertLess(time.perf_counter() - t, 1.0)  # nothing waited on the absent agent
            agent = FakeAgent.__new__(FakeAgent)
            # the agent appears at the hook's path: the hook connects on its own
            agent.dir, agent.path = d, path
            agent.spool = os.path.join(d, "incoming")
            os.mkdir(agent.spool)
            agent.window, agent.messages, agent.conn, agent.stop = None, [], None, False
            agent.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            agent.srv.bind(path)
            agent.srv.listen(1)
            threading.Thread(target=agent._serve, daemon=True).start()
            self.assertTrue(wait(lambda: agent.of("hello"), 10), "the hook did not reconnect")
            agent.close()
        finally:
            hook.close()

    def test_oom_observer_dumps(self):
        agent = FakeAgent({"id": 1, "start": 0, "stop": 100})
        hook = memsnap_hook.Hook(agent.path)
        try:
            self.assertTrue(wait(lambda: hook._spool is not None and hook._window is not None))
            self.run_batches(hook, 1)
            self.assertTrue(torch._C.observers, "no OOM observer attached")
            torch._C.observers[-1](0, 1 << 30, 10, 20)
            self.assertTrue(wait(lambda: [m for m in agent.of("snapshot") if m["reason"] == "oom"]))
        finally:
            hook.close()
            agent.close()

    def test_composer_callback_standalone(self):
        d = tempfile.mkdtemp(prefix="msh")
        os.environ["MEMSNAP_SOCKET"] = os.path.join(d, "none.sock")
        try:
            cb = memsnap_hook.composer_callback(skip_batches=2, interval="3ba", folder=os.path.join(d, "{run_name}"),
                                                filename="rank{rank}.{batch}.memory_snapshot")

            class TS:
                batch = 0

            class State:
                run_name = "r1"
                timestamp = TS()

            class Ev:
                def __init__(self, v):
                    self.value = v

            st = State()
            for b in range(8):
                st.timestamp.batch = b
                cb.run_event(Ev("batch_start"), st, None)
                st.timestamp.batch = b + 1
                cb.run_event(Ev("batch_end"), st, None)
            out = os.path.join(d, "r1", "rank0.5.memory_snapshot.pickle")
            self.assertTrue(os.path.exists(out), os.listdir(d))
            rec = [c for c in torch.calls if c[0] == "record"]
            self.assertEqual(len(rec), 2)
        finally:
            del os.environ["MEMSNAP_SOCKET"]

    def test_per_batch_overhead_without_window(self):
        hook = memsnap_hook.Hook(connect=False)
        n = 200000
        t = time.perf_counter()
        for b in range(n):
            hook.batch_start(b)
            hook.batch_end(b)
        per = (time.perf_counter() - t) / n * 1e6
        print("\nper-batch overhead with no window armed: %.3f us" % per)

    def test_socket_path_matches_agent_rule(self):
        os.environ["MEMSNAP_RUN_NAME"] = "my run/1"
        os.environ["LOCAL_RANK"] = "3"
        try:
            p = memsnap_hook.default_socket_path()
            self.assertTrue(p.endswith("/memsnap-%d/my_run_1.3.sock" % os.getuid()), p)
        finally:
            del os.environ["MEMSNAP_RUN_NAME"]
            del os.environ["LOCAL_RANK"]


class MemoryTest(unittest.TestCase):
    """The allocator's figures reach the agent at the end of a batch, at most once
    per MEMORY_EVERY, without initialising CUDA, and a broken reading is given up."""

    def setUp(self):
        torch.calls.clear()
        torch.cuda.initialized = True

    def tearDown(self):
        torch.cuda.initialized = True

    def steps(self, hook, n, first=0):
        for b in range(first, first + n):
            with hook.step(b):
                pass

    def test_figures_reach_the_agent(self):
        agent = FakeAgent()
        hook = memsnap_hook.Hook(agent.path)
        try:
            hook._mem_every = 1e-6
            self.assertTrue(wait(lambda: hook._sock is not None), "never connected")
            self.steps(hook, 5)
            self.assertTrue(wait(lambda: any(m["batch"] == 4 for m in agent.of("memory"))), agent.messages)
            m = [m for m in agent.of("memory") if m["batch"] == 4][0]["memory"]
            self.assertEqual(m, {"allocated": 1000, "reserved": 4096, "peak": 3000, "inactive_split": 96,
                                 "alloc_retries": 2, "ooms": 0, "device_free": 70 << 30, "device_total": 80 << 30})
        finally:
            hook.close()
            agent.close()

    def test_at_most_one_report_per_period(self):
        agent = FakeAgent()
        hook = memsnap_hook.Hook(agent.path)
        try:
            hook._mem_every = 3600.0
            self.assertTrue(wait(lambda: hook._sock is not None), "never connected")
            self.steps(hook, 50)
            self.assertTrue(wait(lambda: agent.of("batch") and agent.of("batch")[-1]["batch"] == 49))
            # the reading is on the training thread: one reading is one report at most
            self.assertEqual(len([c for c in torch.calls if c[0] == "memory_stats"]), 1)
            self.assertTrue(wait(lambda: len(agent.of("memory")) == 1))
        finally:
            hook.close()
            agent.close()

    def test_cuda_not_initialised_is_not_read(self):
        agent = FakeAgent()
        hook = memsnap_hook.Hook(agent.path)
        try:
            hook._mem_every = 1e-6
            torch.cuda.initialized = False
            self.assertTrue(wait(lambda: hook._sock is not None), "never connected")
            self.steps(hook, 5)
            self.assertTrue(wait(lambda: agent.of("batch") and agent.of("batch")[-1]["batch"] == 4))
            self.assertEqual(agent.of("memory"), [])
            self.assertEqual([c for c in torch.calls if c[0] == "memory_stats"], [])
        finally:
            hook.close()
            agent.close()

    def test_figures_of_the_device_in_use(self):
        # a trainer on cuda:2 that never called set_device: its figures are device
        # 2's, not the current device's; looked for once, not at every reading
        torch.cuda.others = {2: {"allocated_bytes.all.current": 5 << 30, "reserved_bytes.all.current": 6 << 30}}
        try:
            t = memsnap_hook._Torch()
            for _ in range(3):
                m = t.memory()
            self.assertEqual((m["allocated"], m["reserved"]), (5 << 30, 6 << 30))
            self.assertEqual([c for c in torch.calls if c[0] == "mem_get_info"], [("mem_get_info", 2)] * 3)
            self.assertEqual(len([c for c in torch.calls if c[0] == "memory_reserved"]), 3)  # one look at each device
        finally:
            torch.cuda.others = {}

    def test_the_allocators_cap_is_reported(self):
        # set_per_process_memory_fraction(0.05) on an 80 GiB device: the cap (4
        # GiB) goes with the figures; no cap, or a torch that cannot tell, none
        t = memsnap_hook._Torch()
        try:
            torch.cuda.fraction = 0.05
            self.assertEqual(t.memory()["device_limit"], int((80 << 30) * 0.05))
            torch.cuda.fraction = 1.0
            self.assertNotIn("device_limit", t.memory())
            torch.cuda.fraction = None
            self.assertNotIn("device_limit", t.memory())
        finally:
            torch.cuda.fraction = 1.0

    def test_a_broken_reading_is_given_up(self):
        agent = FakeAgent()
        hook = memsnap_hook.Hook(agent.path)
        broken = mock.patch.object(torch.cuda, "memory_stats", side_effect=RuntimeError("no stats"))
        try:
            hook._mem_every = 1e-6
            self.assertTrue(wait(lambda: hook._sock is not None), "never connected")
            with broken as ms:
                self.steps(hook, 20)
                self.assertEqual(ms.call_count, 1)
            self.assertTrue(any("memory figures" in e for e in hook.errors), hook.errors)
            self.steps(hook, 5, first=20)  # training goes on
        finally:
            hook.close()
            agent.close()

    def test_per_batch_overhead_with_reports(self):
        hook = memsnap_hook.Hook(connect=False)
        hook._sock = object()  # as if connected: the reading is what costs
        hook._mem_every = 1e-9
        n = 20000
        t = time.perf_counter()
        for b in range(n):
            hook._mem_next = 0.0
            hook.batch_start(b)
            hook.batch_end(b)
        per = (time.perf_counter() - t) / n * 1e6
        print("\nper-batch cost with a memory report every batch (stand-in torch): %.3f us" % per)


class StopTest(unittest.TestCase):
    """A trainer process that is being stopped tells the agent why and dumps what it
    recorded (testdata/train_stop.py, a subprocess, against a stand-in agent)."""

    def trainer(self, agent_path, *args):
        env = dict(os.environ, MEMSNAP_SOCKET=agent_path, RANK="0", LOCAL_RANK="0",
                   PYTHONPATH=os.pathsep.join([os.path.join(HERE, "testdata", "faketorch")] + SRC))
        p = subprocess.Popen([sys.executable, os.path.join(HERE, "testdata", "train_stop.py")] + list(args),
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        p.out, p.err, p.readers = [], [], []
        for stream, lines in ((p.stdout, p.out), (p.stderr, p.err)):
            t = threading.Thread(target=lambda s=stream, l=lines: l.extend(iter(s.readline, "")), daemon=True)
            t.start()
            p.readers.append(t)

        def cleanup():
            if p.poll() is None:
                p.kill()
            p.wait()
        self.addCleanup(cleanup)
        return p

    def finish(self, p, timeout=30):
        """Wait for the trainer to end: its exit status, stdout and stderr."""
        p.wait(timeout=timeout)
        for t in p.readers:
            t.join(timeout)
        return p.returncode, "".join(p.out), "".join(p.err)

    def agent(self, **kw):
        a = FakeAgent(**kw)
        self.addCleanup(a.close)
        return a

    def until_batch(self, agent, b):
        self.assertTrue(wait(lambda: any(m.get("batch", -1) >= b for m in agent.of("batch")), 20),
                        "the trainer never reached batch %d" % b)

    def check_crash(self, agent, snap, cause):
        self.assertEqual((snap["reason"], snap["cause"]), ("crash", cause))
        self.assertRegex(snap["file"], r"^rank0\.crash%d\.\d+\.pickle$" % snap["window"])
        with open(os.path.join(agent.spool, snap["file"]), "rb") as f:
            self.assertIn("device_traces", pickle.load(f))
        with open(os.path.join(agent.spool, snap["file"][:-len(".pickle")] + ".json")) as f:
            self.assertEqual(json.loads(f.read()), snap)
        self.assertFalse([n for n in os.listdir(agent.spool) if n.startswith(".")], "hidden leftovers")
        # the stopping message came first
        kinds = [m["type"] for m in agent.messages if m["type"] in ("stopping", "snapshot")]
        self.assertEqual(kinds, ["stopping", "snapshot"])

    def test_sigterm_mid_window_dumps_and_dies_by_sigterm(self):
        agent = self.agent(window={"id": 3, "start": 2, "stop": 100000})
        p = self.trainer(agent.path, "wait=window")
        self.assertTrue(wait(lambda: agent.of("recording"), 20), "the window never started")
        self.until_batch(agent, 4)
        p.send_signal(signal.SIGTERM)
        code, out, err = self.finish(p)
        self.assertEqual(code, -signal.SIGTERM, err)
        self.assertTrue(wait(lambda: agent.of("snapshot")), "no crash snapshot reached the agent")
        stop, snap = agent.of("stopping"), agent.of("snapshot")
        self.assertEqual(len(stop), 1)
        self.assertEqual(len(snap), 1)
        stop, snap = stop[0], snap[0]
        self.assertEqual(stop["cause"], "SIGTERM")
        self.assertGreater(stop["t_us"], 0)
        self.check_crash(agent, snap, "SIGTERM")
        self.assertEqual((snap["window"], snap["start"], snap["stop"]), (3, 2, 100000))
        batches = [b["batch"] for b in snap["batches"]]
        self.assertEqual(batches, list(range(2, stop["batch"] + 1)), "marks up to the batch in progress")
        for a, b in zip(snap["batches"], snap["batches"][1:]):
            self.assertLessEqual(a["end_us"], b["start_us"])
        last = snap["batches"][-1]
        self.assertLessEqual(last["start_us"], last["end_us"])
        self.assertLessEqual(last["end_us"], stop["t_us"])

    def test_uncaught_exception_mid_window(self):
        agent = self.agent(window={"id": 4, "start": 1, "stop": 100})
        p = self.trainer(agent.path, "wait=window", "fail=3", "pace=0.001")
        code, out, err = self.finish(p)
        self.assertEqual(code, 1, err)
        self.assertIn("Traceback (most recent call last)", err)
        self.assertIn("RuntimeError: boom at batch 3", err)
        self.assertTrue(wait(lambda: agent.of("snapshot")), "no crash snapshot reached the agent")
        cause = "exception: RuntimeError: boom at batch 3"
        self.assertEqual(agent.of("stopping")[0]["cause"], cause)
        self.assertEqual(agent.of("stopping")[0]["batch"], 3)
        snap = agent.of("snapshot")[0]
        self.check_crash(agent, snap, cause)
        self.assertEqual((snap["window"], snap["start"], snap["stop"]), (4, 1, 100))
        self.assertEqual([b["batch"] for b in snap["batches"]], [1, 2, 3])

    def test_record_always_without_window(self):
        agent = self.agent(record_always=True)
        p = self.trainer(agent.path, "wait=spool")
        self.until_batch(agent, 2)
        p.send_signal(signal.SIGTERM)
        code, out, err = self.finish(p)
        self.assertEqual(code, -signal.SIGTERM, err)
        self.assertTrue(wait(lambda: agent.of("snapshot")), "no crash snapshot reached the agent")
        snap = agent.of("snapshot")[0]
        self.check_crash(agent, snap, "SIGTERM")
        self.assertEqual(snap["window"], 0)
        self.assertNotIn("start", snap)
        self.assertNotIn("stop", snap)
        self.assertEqual(snap["batches"], [])

    def test_no_history_sends_only_stopping(self):
        agent = self.agent()
        p = self.trainer(agent.path, "wait=spool")
        self.until_batch(agent, 2)
        p.send_signal(signal.SIGTERM)
        code, out, err = self.finish(p)
        self.assertEqual(code, -signal.SIGTERM, err)
        self.assertTrue(wait(lambda: agent.of("stopping")), "no stopping message")
        self.assertEqual(agent.of("stopping")[0]["cause"], "SIGTERM")
        self.assertFalse(agent.of("snapshot"))
        self.assertEqual(os.listdir(agent.spool), [])

    def test_previous_python_handler_is_called_and_dump_is_once(self):
        agent = self.agent(window={"id": 2, "start": 1, "stop": 100000})
        p = self.trainer(agent.path, "wait=window", "prev=py")
        self.assertTrue(wait(lambda: agent.of("recording"), 20), "the window never started")
        self.until_batch(agent, 2)
        p.send_signal(signal.SIGTERM)
        code, out, err = self.finish(p)
        self.assertEqual(code, 7, err)  # the previous handler's sys.exit(7)
        self.assertIn("previous handler called with %d" % signal.SIGTERM, out)
        self.assertTrue(wait(lambda: agent.of("snapshot")), "no crash snapshot reached the agent")
        # the SystemExit it raised, and the exit after it, dumped nothing more
        self.assertEqual(len(agent.of("stopping")), 1)
        self.assertEqual(len(agent.of("snapshot")), 1)
        self.check_crash(agent, agent.of("snapshot")[0], "SIGTERM")

    def test_sigterm_during_the_exception_dump(self):
        agent = self.agent(window={"id": 8, "start": 1, "stop": 100})
        p = self.trainer(agent.path, "wait=window", "fail=2", "term_in_dump=1", "pace=0.001")
        code, out, err = self.finish(p)
        # the dump was not cut short nor taken twice; the traceback was printed, then
        # the SIGTERM was passed on
        self.assertEqual(code, -signal.SIGTERM, err)
        self.assertIn("RuntimeError: boom at batch 2", err)
        self.assertTrue(wait(lambda: agent.of("snapshot")), "no crash snapshot reached the agent")
        cause = "exception: RuntimeError: boom at batch 2"
        self.assertEqual([m["cause"] for m in agent.of("stopping")], [cause])
        self.assertEqual(len(agent.of("snapshot")), 1)
        self.check_crash(agent, agent.of("snapshot")[0], cause)

    def test_ignored_sigterm_trains_on(self):
        agent = self.agent()
        p = self.trainer(agent.path, "wait=spool", "prev=ign")
        self.until_batch(agent, 1)
        p.send_signal(signal.SIGTERM)
        code, out, err = self.finish(p)
        self.assertEqual(code, 0, err)
        self.assertIn("trained on after SIGTERM", out)
        self.assertEqual([m["cause"] for m in agent.of("stopping")], ["SIGTERM"])

    def test_exit_mid_window(self):
        agent = self.agent(window={"id": 6, "start": 1, "stop": 100})
        p = self.trainer(agent.path, "wait=window", "exit=2", "pace=0.001")
        code, out, err = self.finish(p)
        self.assertEqual(code, 3, err)
        self.assertTrue(wait(lambda: agent.of("snapshot")), "no crash snapshot reached the agent")
        self.assertEqual(agent.of("stopping")[0]["cause"], "exit")
        snap = agent.of("snapshot")[0]
        self.check_crash(agent, snap, "exit")
        self.assertEqual([b["batch"] for b in snap["batches"]], [1, 2])

    def test_oom_error_after_oom_dump_skips_crash_dump(self):
        agent = self.agent(window={"id": 5, "start": 1, "stop": 100})
        p = self.trainer(agent.path, "wait=window", "oom=2", "pace=0.001")
        code, out, err = self.finish(p)
        self.assertEqual(code, 1, err)
        self.assertIn("OutOfMemoryError", err)
        self.assertTrue(wait(lambda: agent.of("stopping")), "no stopping message")
        self.assertTrue(agent.of("stopping")[0]["cause"].startswith("exception: OutOfMemoryError: CUDA out of memory"))
        self.assertEqual([m["reason"] for m in agent.of("snapshot")], ["oom"])
        self.assertFalse([n for n in os.listdir(agent.spool) if ".crash" in n])

    def test_no_agent_does_not_wait(self):
        d = tempfile.mkdtemp(prefix="msh")
        p = self.trainer(os.path.join(d, "none.sock"))
        self.assertTrue(wait(lambda: "batch 3\n" in p.out, 20), "the trainer never trained")
        t = time.monotonic()
        p.send_signal(signal.SIGTERM)
        code, out, err = self.finish(p)
        self.assertEqual(code, -signal.SIGTERM, err)
        self.assertLess(time.monotonic() - t, 5.0, "a trainer with no agent waited for one")

    def test_wait_is_bounded(self):
        hook = memsnap_hook.Hook(connect=False)
        release = threading.Event()
        hook._thread = threading.Thread(target=release.wait)  # a hook's thread that never sends
        hook._thread.start()
        self.addCleanup(hook._thread.join)
        self.addCleanup(release.set)
        hook._sock, hook._spool, hook.stop_wait = object(), tempfile.mkdtemp(prefix="msh"), 0.2
        t = time.monotonic()
        hook._stopping("SIGTERM")
        self.assertLess(time.monotonic() - t, 2.0)
        self.assertEqual([it[1]["type"] for it in hook._urgent if it[0] == "msg"], ["stopping"])
        hook._stopping("SIGTERM")  # at most once
        self.assertEqual(len([it for it in hook._urgent if it[0] == "msg"]), 1)

    def test_cause_is_clipped_to_512_bytes(self):
        c = memsnap_hook._clip("exception: ValueError: " + "é" * 600)
        self.assertLessEqual(len(c.encode("utf-8")), 512)
        self.assertTrue(c.startswith("exception: ValueError: éé"))
        self.assertEqual(memsnap_hook._clip("\udcff"), "?")

    def test_hook_on_another_thread_has_no_signal_handler(self):
        d = tempfile.mkdtemp(prefix="msh")
        p = self.trainer(os.path.join(d, "none.sock"), "thread=1")
        code, out, err = self.finish(p)
        self.assertEqual(code, 0, err)
        self.assertIn("no SIGTERM handler: the hook was created outside the main thread", out)
        self.assertIn("handler is SIG_DFL: True", out)


if __name__ == "__main__":
    unittest.main()
