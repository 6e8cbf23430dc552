"""Run untrusted Python (model-written code) in a sandbox: code rewards and the code-execution tool.

Each run is its own process tree, isolated with Linux namespaces (``unshare`` from util-linux, no
daemon and no package to install):

- a new **network** namespace with no interface up: no sockets reach anything;
- a new **mount** namespace whose root (``pivot_root``, the old one detached) is a fresh tmpfs
  holding read-only binds of the system's ``/usr``, ``/etc`` and the interpreter, a fresh ``/proc``,
  ``/dev/null``-style devices, a size-limited ``/tmp`` and the working directory ``/sandbox`` (also a
  size-limited tmpfs). Nothing of
  the training process is visible: not the project, the data, the checkpoints or the home directory;
- a new **PID** namespace: when the run ends (or is killed) every process it started dies with it;
- a new **user** namespace, entered from an unprivileged uid (a random unused one per sandbox when the
  trainer runs as root), so the process limit applies and nothing outside is writable; the program runs with no
  capabilities at all (bounding set emptied, securebits locked, no_new_privs), so it cannot mount,
  chroot or regain them;
- resource limits: CPU seconds, address space, processes, file size, open files, no core dumps; a
  wall-clock timeout and a cap on the output read back.

:func:`isolation` says whether this machine allows all that; when it does not, :func:`run_python`
raises :class:`SandboxUnavailable` rather than run the code unprotected.

    result = run_python("print(sum(map(int, input().split())))", stdin="1 2")
    result.status, result.stdout     # ("ok", "3\\n")
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from verl.sandbox.programs import program_source

__all__ = ["SandboxLimits", "SandboxResult", "SandboxUnavailable", "isolation", "run_python"]

SANDBOX_UIDS = (0x40000000, 0x7FFF0000)  # as root, each sandbox runs as a random uid from here


class SandboxUnavailable(RuntimeError):
    """This machine cannot isolate code (no ``unshare``, or user namespaces are disabled)."""


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_mb: int = 512           # address space of each process
    max_processes: int = 32
    max_output_bytes: int = 64 * 1024   # stdout and stderr each; more ends the run
    max_file_mb: int = 16          # largest file it may write; /sandbox and /tmp hold 32 MB each
    max_open_files: int = 64


@dataclass
class SandboxResult:
    """``status``: ``ok`` (exit 0), ``error`` (non-zero exit), ``timeout`` (wall clock), ``cpu_limit``,
    ``memory_limit``, ``output_limit`` or ``killed``; ``reason`` says it in words."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    reason: str
    wall_seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# Seccomp: the architectures sandboxes run on, and the system calls refused (EPERM) to everything sandboxed
# -- keys (the trainer's keyring; the key quota), memory outside its limits (memfd, System V and POSIX
# queues), the machine's AIO contexts, watching or locking the shown host files (inotify, fanotify, flock,
# fcntl locks, leases, dnotify), sessions and process groups (each would be a scheduling autogroup of its own)
# -- and, on top, to a worker's calls: sockets (one sent to itself outlives the call), tracing, namespaces.
_SECCOMP_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SYSCALLS = {  # name: (x86_64, aarch64); None where the architecture has no such call
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218), "memfd_create": (319, 279),
    "memfd_secret": (447, 447), "io_setup": (206, 0), "io_uring_setup": (425, 425), "shmget": (29, 194),
    "msgget": (68, 186), "semget": (64, 190), "inotify_init": (253, None), "inotify_init1": (294, 26),
    "fanotify_init": (300, 262), "flock": (73, 32), "fcntl": (72, 25), "capset": (126, 91),
    "setsid": (112, 157), "setpgid": (109, 154), "socket": (41, 198), "socketpair": (53, 199),
    "ptrace": (101, 117), "unshare": (272, 97), "setns": (308, 268), "mq_open": (240, 180),
    "perf_event_open": (298, 241), "fadvise64": (221, 223)}
_DENIED_ALL = ("keyctl", "add_key", "request_key", "memfd_create", "memfd_secret", "io_setup", "io_uring_setup",
               "shmget", "msgget", "semget", "mq_open", "inotify_init", "inotify_init1", "fanotify_init", "flock",
               "setsid", "setpgid", "perf_event_open", "fadvise64")
# socket() only for these address families (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK): vsock, say, is not
# confined by the network namespace. Worker calls get no sockets at all.
_SOCKET_FAMILIES = (1, 2, 10, 16)
_DENIED_CALLS = ("socket", "socketpair", "ptrace", "unshare", "setns")
# fcntl commands refused: F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW (locks), F_SETLEASE, F_NOTIFY (watching
# or blocking shown host files), F_SETPIPE_SZ (pipe pages are counted per user, across sandboxes)
_FCNTL_DENIED = (6, 7, 37, 38, 1024, 1026, 1031)


def _machine() -> str:
    machine = os.uname().machine
    return "aarch64" if machine == "arm64" else machine


def _syscall(name: str) -> int | None:
    return _SYSCALLS[name][("x86_64", "aarch64").index(_machine())]


def _seccomp(names, socket_families=None) -> dict:
    """What a sandboxed process needs to build its seccomp filter (see verl/sandbox/programs/seccomp.py)."""
    spec = {"arch": _SECCOMP_ARCH[_machine()], "fcntl": _syscall("fcntl"), "locks": list(_FCNTL_DENIED),
            "denied": [n for n in (_syscall(name) for name in names) if n is not None]}
    if socket_families is not None:
        spec.update(socket=_syscall("socket"), families=list(socket_families))
    return spec


# pivot_root has no libc wrapper: its system call number per architecture.
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

# Every sandbox's pid 1, run as ``python -I -S -c _RUNNER <json config>``: see verl/sandbox/programs/runner.py.
_RUNNER = program_source("runner")


def _interpreter() -> str:
    """An interpreter an unprivileged uid can run: the system's, else this one's base installation."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.isfile(candidate):
            return os.path.realpath(candidate)
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _privileges() -> dict:
    """Popen arguments: a new session (one process group to kill), and as root a uid/gid of its own for each
    sandbox, unused on the machine (root is exempt from the process limit and could read everything; and some
    kernel limits -- epoll watches, pipe pages, file descriptors in flight -- are counted per user, so
    sandboxes sharing one user could starve each other). Done by Popen itself, not a preexec_fn: Python code
    between fork and exec crashes in a process with threads (a Ray driver has many). Without root, sandboxes
    run as the trainer's user and share those per-user limits with it."""
    if os.getuid() != 0:
        return {"start_new_session": True}
    uid = random.SystemRandom().randrange(SANDBOX_UIDS[0], SANDBOX_UIDS[1])
    return {"start_new_session": True, "user": uid, "group": uid, "extra_groups": []}


def _readonly_paths(python: str) -> list[str]:
    paths = ["/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin", "/etc"]
    prefix = os.path.dirname(os.path.dirname(python))  # .../bin/python3.x -> its installation
    if not prefix.startswith("/usr") and prefix not in paths:
        paths.append(prefix)
    return [p for p in paths if os.path.lexists(p)]


@functools.lru_cache(maxsize=1)
def isolation() -> str:
    """``"namespaces"`` when code can be sandboxed here, else a sentence saying what is missing."""
    if _machine() not in _SECCOMP_ARCH:
        return f"the sandbox runs on x86_64 and aarch64, not {os.uname().machine}"
    unshare = shutil.which("unshare")
    if unshare is None:
        return "no `unshare` binary (util-linux) on this machine"
    try:
        result = run_python("print('ok')", limits=SandboxLimits(wall_seconds=20), _check=False)
    except OSError as err:
        return f"`unshare` could not start: {err}"
    if result.status != "ok" or result.stdout.strip() != "ok":
        return f"user/network/mount/PID namespaces are not available to an unprivileged user here ({result.reason})"
    return "namespaces"


def _require_isolation() -> None:
    available = isolation()
    if available != "namespaces":
        raise SandboxUnavailable(f"cannot run untrusted code safely: {available}. Code rewards, the code tool and the "
                                 "numina_* math grader need Linux user namespaces (unshare from util-linux)")


def _library_paths(libraries) -> list[str]:
    """Host folders (installed packages) shown read-only inside; as root the sandbox runs as an unprivileged
    uid, which must be able to read them."""
    paths = []
    for library in libraries:
        path = os.path.realpath(library)
        if not os.path.isdir(path):
            raise SandboxUnavailable(f"library folder {library!r} for the sandbox does not exist")
        if os.getuid() == 0:
            ancestor = path
            while ancestor != "/":
                if not os.stat(ancestor).st_mode & 0o001:
                    raise SandboxUnavailable(
                        f"the sandbox runs as an unprivileged user and cannot enter {ancestor} (on the way to {path}); "
                        "install Python packages where every user can read them (chmod o+rx), e.g. a virtual "
                        "environment outside /root")
                ancestor = os.path.dirname(ancestor)
        paths.append(path)
    return paths


def _prepare(work: str, code: str, limits: SandboxLimits, libraries=(), cpu_seconds: int | None = None,
             worker: bool = False) -> list[str]:
    """Write ``code`` into the folder ``work`` and return the command that runs it in a sandbox (``worker``: with
    no writable folder at all, and room for the user namespaces of its calls)."""
    python = _interpreter()
    os.chmod(work, 0o755)
    code_file = os.path.join(work, "main.py")
    with open(code_file, "w", encoding="utf-8") as f:
        f.write(code)
    os.chmod(code_file, 0o644)
    os.makedirs(os.path.join(work, "root"), mode=0o755)
    os.chmod(os.path.join(work, "root"), 0o777)
    config = {"root": os.path.join(work, "root"), "code": code_file, "python": python,
              "pivot_root": _PIVOT_ROOT[_machine()], "keyctl": _syscall("keyctl"),
              "seccomp": _seccomp(_DENIED_ALL, _SOCKET_FAMILIES),
              "ro": _readonly_paths(python) + _library_paths(libraries),
              "cpu": int(limits.cpu_seconds if cpu_seconds is None else cpu_seconds),
              "memory": int(limits.memory_mb) << 20, "nproc": int(limits.max_processes),
              "fsize": int(limits.max_file_mb) << 20, "nofile": int(limits.max_open_files),
              "disk_mb": max(32, 2 * int(limits.max_file_mb)), "readonly": worker, "userns": 1024 if worker else 0}
    return [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--net", "--pid", "--fork",
            "--mount", "--ipc", "--uts", "--kill-child", python, "-I", "-S", "-c", _RUNNER, json.dumps(config)]


def run_python(code: str, stdin: str = "", limits: SandboxLimits = SandboxLimits(), *,
               _check: bool = True) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh sandbox with ``stdin``; see the module docstring."""
    if _check:
        _require_isolation()
    work = tempfile.mkdtemp(prefix="verl-sandbox-")
    try:
        return _communicate(_prepare(work, code, limits), stdin, limits)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _communicate(command: list[str], stdin: str, limits: SandboxLimits) -> SandboxResult:
    start = time.monotonic()
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            close_fds=True, cwd="/", **_privileges())
    overflow = threading.Event()
    chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}

    def read(name: str, stream) -> None:
        total = 0
        while True:
            data = stream.read1(65536)
            if not data:
                return
            total += len(data)
            if total > limits.max_output_bytes:
                chunks[name].append(data[:max(0, limits.max_output_bytes - (total - len(data)))])
                overflow.set()
                _kill(proc)
                return
            chunks[name].append(data)

    readers = [threading.Thread(target=read, args=(name, getattr(proc, name)), daemon=True) for name in chunks]
    for reader in readers:
        reader.start()
    def feed() -> None:  # a thread: a program that never reads a large stdin must not stall the timeout
        try:
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    timed_out = False
    try:
        proc.wait(timeout=limits.wall_seconds)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc)
        proc.wait()
    for thread in (*readers, writer):
        thread.join(timeout=5)
    stdout, stderr = (b"".join(chunks[n]).decode("utf-8", "replace") for n in ("stdout", "stderr"))
    status, reason = _classify(proc.returncode, stderr, timed_out, overflow.is_set(), limits)
    return SandboxResult(status, proc.returncode, stdout, stderr, reason, time.monotonic() - start)


def _kill(proc: subprocess.Popen) -> None:
    if proc.returncode is not None:  # already reaped: its pid may belong to someone else now
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # unshare and, through --kill-child and the PID namespace, all of it
    except (ProcessLookupError, PermissionError):
        pass


def _classify(returncode: int, stderr: str, timed_out: bool, overflow: bool, limits: SandboxLimits):
    if timed_out:
        return "timeout", f"killed after {limits.wall_seconds:g} s of wall-clock time"
    if overflow:
        return "output_limit", f"stopped after more than {limits.max_output_bytes} bytes of output"
    if returncode == 0:
        return "ok", "exited 0"
    if returncode == 128 + signal.SIGXCPU and "MemoryError" not in stderr:  # the kernel's signal at the CPU limit
        return "cpu_limit", f"used more than {limits.cpu_seconds} s of CPU time"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "memory_limit", f"ran out of its {limits.memory_mb} MB of memory"
    if returncode > 128:
        return "killed", f"killed by signal {returncode - 128}"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {returncode}"
    return "error", last[:300]
