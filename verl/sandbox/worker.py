"""Long-lived sandboxes serving calls of one trusted function on untrusted input: the ``numina_*`` grader.

A :class:`SandboxWorker` is a sandbox (:mod:`verl.sandbox.process`) that imported its modules once; each call
runs in a fork of it that is alone in namespaces of its own, with no /proc, no capability and a seccomp filter
(see :mod:`verl.sandbox.programs.worker`), so a call decides its own result and nothing else.
:class:`SandboxPool` holds several.

    # source defines handle(request) -> a JSON value; the entry takes one JSON argument
    pool = SandboxPool(4, modules=[("grader", source)], entry="grader.handle", libraries=[sympy_folder])
    pool.call({"answer": "1/2", "ground_truth": "0.5"}).value   # {"correct": True}
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass

from verl.sandbox.process import (_DENIED_CALLS, SandboxLimits, SandboxUnavailable, _kill, _library_paths, _prepare,
                                  _privileges, _require_isolation, _seccomp, _syscall)
from verl.sandbox.programs import program_source

__all__ = ["CallResult", "SandboxPool", "SandboxWorker"]

# main.py of a worker sandbox: see verl/sandbox/programs/worker.py.
_WORKER = program_source("worker")


# Workers and pools of this process: a forked child forgets them (its copies would hold the parent's pipes
# open, and their locks may have been held by a parent thread).
_FORK_AWARE: weakref.WeakSet = weakref.WeakSet()


def _forget_workers_after_fork() -> None:
    for obj in list(_FORK_AWARE):
        obj._forget_after_fork()


os.register_at_fork(after_in_child=_forget_workers_after_fork)


@dataclass
class CallResult:
    """``status``: ``ok`` (``value`` is the function's result), ``error`` (it raised: ``error`` says what),
    ``timeout``, ``cpu_limit``, ``too_large`` (its result was over the limit) or ``crashed`` (the call or the
    worker died)."""

    status: str
    value: object = None
    error: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class SandboxWorker:
    """A long-lived sandbox serving calls of one trusted function on untrusted arguments.

    ``modules`` are ``(dotted name, source)`` pairs executed inside in order (the function's code and what it
    imports from this project); ``entry`` is ``"dotted.module.function"``; ``libraries`` are installed package
    folders shown read-only (e.g. sympy's); ``warmup`` are trusted arguments called once at start so lazy
    imports happen before any untrusted call. The function takes and returns JSON values. Each call runs in
    a fresh fork of the warmed-up process, alone in PID, user and mount namespaces of its own, on a read-only
    file system (see :mod:`verl.sandbox.programs.worker`), with ``limits.cpu_seconds`` of CPU and a wall-clock
    timeout (``limits.wall_seconds`` unless given); ``limits.memory_mb`` bounds every process. A call decides its
    own result and nothing else. Thread-safe (calls are serialised); a worker that dies is started again on the
    next call; a forked child of this process starts its own.
    """

    def __init__(self, modules, entry: str, libraries=(), limits: SandboxLimits = SandboxLimits(),
                 warmup=(), start_timeout: float = 120.0, max_reply_bytes: int = 1 << 20) -> None:
        self.setup = {"modules": [list(m) for m in modules], "entry": entry, "warmup": list(warmup),
                      "cpu": int(limits.cpu_seconds), "max_reply_bytes": int(max_reply_bytes),
                      "capset": _syscall("capset"), "seccomp": _seccomp(_DENIED_CALLS)}
        self.libraries = list(libraries)
        self.limits = limits
        self.start_timeout = start_timeout
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._stderr: list[str] = []
        self._calls = 0
        _FORK_AWARE.add(self)

    def _forget_after_fork(self) -> None:
        """In a forked child: the parent's worker is not ours; drop our copies of its pipes (else it would
        never see them close) and a lock some parent thread may have held."""
        if self._proc is not None:
            for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
                try:
                    os.close(stream.fileno())
                except (OSError, ValueError):
                    pass
        self._proc, self._buffer, self._lock = None, b"", threading.Lock()

    # -- process management
    def _start(self) -> None:
        _require_isolation()
        libraries = _library_paths(self.libraries)
        work = tempfile.mkdtemp(prefix="verl-sandbox-worker-")
        try:
            # The worker's own CPU limit is generous (it only forks and waits); each call gets limits.cpu_seconds.
            command = _prepare(work, _WORKER, self.limits, libraries, cpu_seconds=10 ** 6, worker=True)
            self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, close_fds=True, cwd="/", **_privileges())
            self._buffer, self._stderr = b"", []
            os.set_blocking(self._proc.stdin.fileno(), False)  # written with a deadline, never blocking
            threading.Thread(target=self._drain_stderr, args=(self._proc,), daemon=True).start()
            deadline = time.monotonic() + self.start_timeout
            # the import path gets the folders holding the packages (only those packages are shown there)
            try:
                self._send({**self.setup, "paths": sorted({os.path.dirname(path) for path in libraries})}, deadline)
                line = self._read_line(deadline)
            except OSError:
                line = None
            if line is None or not json.loads(line).get("ready"):
                exited = self._proc.poll() is not None
                self._stop()
                time.sleep(0.1)  # let the stderr reader catch the last lines
                tail = "".join(self._stderr[-20:]).strip() or "no output"
                when = "exited while starting" if exited else f"did not start within {self.start_timeout:g} s"
                raise SandboxUnavailable(f"the sandbox worker for {self.setup['entry']} {when}: {tail}")
        finally:
            shutil.rmtree(work, ignore_errors=True)  # once started it lives in its own root

    def _drain_stderr(self, proc: subprocess.Popen) -> None:
        for raw in iter(proc.stderr.readline, b""):
            if len(self._stderr) < 200:
                self._stderr.append(raw.decode("utf-8", "replace"))

    def _send(self, obj, deadline: float) -> None:
        """One line to the worker; TimeoutError when it does not take it by ``deadline``."""
        fd = self._proc.stdin.fileno()
        view = memoryview(json.dumps(obj).encode() + b"\n")
        while view:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise TimeoutError("the worker does not read its input")
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                continue

    def _read_line(self, deadline: float) -> bytes | None:
        """One line from the worker, or None on end of output or at the deadline."""
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            data = os.read(fd, 1 << 16)
            if not data:
                return None
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _stop(self) -> None:
        if self._proc is not None:
            _kill(self._proc)
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
        self._proc = None

    # -- calls
    def call(self, argument, timeout: float | None = None) -> CallResult:
        timeout = self.limits.wall_seconds if timeout is None else float(timeout)
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._stop()
                self._start()
            self._calls += 1
            start = time.monotonic()
            try:
                self._send({"id": self._calls, "arg": argument, "timeout": timeout}, start + 10.0)
            except OSError as exc:  # gone (BrokenPipeError) or not reading (TimeoutError)
                self._stop()
                return CallResult("crashed", error=f"the worker did not take the call: {exc}",
                                  seconds=time.monotonic() - start)
            line = self._read_line(start + timeout + 10.0)  # the worker enforces the timeout; this is a backstop
            seconds = time.monotonic() - start
            if line is None:
                self._stop()
                return CallResult("timeout" if seconds >= timeout else "crashed",
                                  error="the worker stopped answering", seconds=seconds)
            try:
                reply = json.loads(line)  # written by the worker itself, which checked what the call sent
            except Exception:
                reply = {}
            if not isinstance(reply, dict) or reply.get("id") != self._calls:
                self._stop()
                return CallResult("crashed", error="the worker answered out of turn", seconds=seconds)
            return CallResult(reply["status"], reply.get("value"), reply.get("error", ""), seconds)

    def close(self) -> None:
        with self._lock:
            self._stop()


class SandboxPool:
    """Up to ``size`` :class:`SandboxWorker` s with the same set-up, started as needed; ``call`` borrows an idle
    one, so ``size`` calls from different threads run at once."""

    def __init__(self, size: int, **worker_kwargs) -> None:
        self.size = max(1, int(size))
        self.worker_kwargs = worker_kwargs
        self._idle: list[SandboxWorker] = []
        self._created = 0
        self._available = threading.Condition()
        _FORK_AWARE.add(self)

    def _forget_after_fork(self) -> None:
        self._idle, self._created, self._available = [], 0, threading.Condition()

    def call(self, argument, timeout: float | None = None) -> CallResult:
        with self._available:
            while not self._idle and self._created >= self.size:
                self._available.wait()
            if self._idle:
                worker = self._idle.pop()
            else:
                worker = SandboxWorker(**self.worker_kwargs)
                self._created += 1
        try:
            return worker.call(argument, timeout)
        finally:
            with self._available:
                self._idle.append(worker)
                self._available.notify()

    def close(self) -> None:
        with self._available:
            for worker in self._idle:
                worker.close()
