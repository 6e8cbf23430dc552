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
- a new **user** namespace, entered from an unprivileged uid (``nobody`` when the trainer runs as
  root), so the process limit applies and nothing outside is writable; the program runs with no
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
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass

__all__ = ["SandboxLimits", "SandboxResult", "SandboxUnavailable", "isolation", "run_python"]

NOBODY = 65534


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


# Runs inside the namespaces as their root (pid 1): builds the new root, chroots, sets the limits and
# runs the code as its child, then exits with the child's status (128 + signal when it was killed).
_RUNNER = r'''
import ctypes, json, os, resource, shutil, signal, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")
def bind_ro(path, root):
    if not os.path.exists(path):
        return
    target = root + path
    if os.path.islink(path):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            os.symlink(os.readlink(path), target)
        return
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(path, target, None, MS_BIND | MS_REC)
    locked = 0
    st = os.statvfs(path)
    for bit, flag in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC)):
        if st.f_flag & bit:
            locked |= flag
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | locked)
mount(None, "/", None, MS_REC | MS_PRIVATE)
root = cfg["root"]
mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
for path in cfg["ro"]:
    bind_ro(path, root)
for name, size in (("sandbox", cfg["disk_mb"]), ("tmp", cfg["disk_mb"])):
    os.makedirs(f"{root}/{name}", exist_ok=True)
    mount("tmpfs", f"{root}/{name}", "tmpfs", MS_NOSUID | MS_NODEV, f"size={size}m,mode=1777")
os.makedirs(root + "/dev", exist_ok=True)
for dev in ("null", "zero", "random", "urandom"):
    open(f"{root}/dev/{dev}", "a").close()
    mount("/dev/" + dev, f"{root}/dev/{dev}", None, MS_BIND)
os.makedirs(root + "/proc", exist_ok=True)
mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
shutil.copyfile(cfg["code"], root + "/sandbox/main.py")
# Make the tmpfs the root and detach the old one: no path leads back to the host's files (a chroot alone
# can be left by a process that may call chroot again).
os.makedirs(root + "/.old", exist_ok=True)
os.chdir(root)
if libc.syscall(cfg["pivot_root"], b".", b".old") != 0:
    err = ctypes.get_errno()
    raise OSError(err, "pivot_root: " + os.strerror(err))
os.chroot(".")
os.chdir("/")
if libc.umount2(b"/.old", 2) != 0:  # MNT_DETACH
    err = ctypes.get_errno()
    raise OSError(err, "umount old root: " + os.strerror(err))
os.rmdir("/.old")
os.chdir("/sandbox")
CAP_LAST = int(open("/proc/sys/kernel/cap_last_cap").read())
pid = os.fork()
if pid == 0:
    os.setsid()
    # The code runs as this namespace's root: take every capability away for good. Securebits first
    # (needs CAP_SETPCAP): uid 0 gains nothing at exec, and that cannot be undone; then the bounding
    # set; no_new_privs for setuid files.
    if libc.prctl(28, 0x1 | 0x2 | 0x4 | 0x8 | 0x40 | 0x80, 0, 0, 0) != 0:  # PR_SET_SECUREBITS
        raise OSError(ctypes.get_errno(), "PR_SET_SECUREBITS")
    for cap in range(CAP_LAST + 1):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    for limit, value in ((resource.RLIMIT_CPU, (cfg["cpu"], cfg["cpu"] + 1)),
                         (resource.RLIMIT_AS, (cfg["memory"],) * 2), (resource.RLIMIT_NPROC, (cfg["nproc"],) * 2),
                         (resource.RLIMIT_FSIZE, (cfg["fsize"],) * 2), (resource.RLIMIT_NOFILE, (cfg["nofile"],) * 2),
                         (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(limit, value)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/sandbox", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "PYTHONIOENCODING": "utf-8"}
    os.execve(cfg["python"], [cfg["python"], "-I", "-B", "main.py"], env)
while True:
    done, status = os.waitpid(-1, 0)
    if done == pid:
        break
os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
'''


# pivot_root has no libc wrapper: its system call number per architecture.
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}


def _interpreter() -> str:
    """An interpreter an unprivileged uid can run: the system's, else this one's base installation."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.isfile(candidate):
            return os.path.realpath(candidate)
    import sys

    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _privileges() -> dict:
    """Popen arguments: a new session (one process group to kill), and as root the uid/gid of nobody (root
    is exempt from the process limit and could read everything). Done by Popen itself, not a preexec_fn:
    Python code between fork and exec crashes in a process with threads (a Ray driver has many)."""
    if os.getuid() != 0:
        return {"start_new_session": True}
    return {"start_new_session": True, "user": NOBODY, "group": NOBODY, "extra_groups": []}


def _readonly_paths(python: str) -> list[str]:
    paths = ["/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin", "/etc"]
    prefix = os.path.dirname(os.path.dirname(python))  # .../bin/python3.x -> its installation
    if not prefix.startswith("/usr") and prefix not in paths:
        paths.append(prefix)
    return [p for p in paths if os.path.lexists(p)]


@functools.lru_cache(maxsize=1)
def isolation() -> str:
    """``"namespaces"`` when code can be sandboxed here, else a sentence saying what is missing."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "no `unshare` binary (util-linux) on this machine"
    try:
        result = run_python("print('ok')", limits=SandboxLimits(wall_seconds=20), _check=False)
    except OSError as err:
        return f"`unshare` could not start: {err}"
    if result.status != "ok" or result.stdout.strip() != "ok":
        return (f"user/network/mount/PID namespaces are not available to an unprivileged user here "
                f"({result.reason})")
    return "namespaces"


def run_python(code: str, stdin: str = "", limits: SandboxLimits = SandboxLimits(), *,
               _check: bool = True) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh sandbox with ``stdin``; see the module docstring."""
    if _check:
        available = isolation()
        if available != "namespaces":
            raise SandboxUnavailable(f"cannot run untrusted code safely: {available}. Code rewards and the code "
                                     "tool need Linux user namespaces (unshare from util-linux)")
    python = _interpreter()
    work = tempfile.mkdtemp(prefix="verl-sandbox-")
    try:
        os.chmod(work, 0o755)
        code_file = os.path.join(work, "main.py")
        with open(code_file, "w", encoding="utf-8") as f:
            f.write(code)
        os.chmod(code_file, 0o644)
        os.makedirs(os.path.join(work, "root"), mode=0o755)
        os.chmod(os.path.join(work, "root"), 0o777)
        config = {"root": os.path.join(work, "root"), "code": code_file, "python": python,
                  "pivot_root": _PIVOT_ROOT[os.uname().machine],
                  "ro": _readonly_paths(python), "cpu": int(limits.cpu_seconds),
                  "memory": int(limits.memory_mb) << 20, "nproc": int(limits.max_processes),
                  "fsize": int(limits.max_file_mb) << 20, "nofile": int(limits.max_open_files),
                  "disk_mb": max(32, 2 * int(limits.max_file_mb))}
        command = [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--net", "--pid", "--fork",
                   "--mount", "--ipc", "--uts", "--kill-child", python, "-I", "-S", "-c", _RUNNER,
                   json.dumps(config)]
        return _communicate(command, stdin, limits)
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
    if returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL) and "MemoryError" not in stderr:
        # the kernel sends SIGXCPU at the CPU limit and SIGKILL one second later
        if returncode == 128 + signal.SIGXCPU:
            return "cpu_limit", f"used more than {limits.cpu_seconds} s of CPU time"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "memory_limit", f"ran out of its {limits.memory_mb} MB of memory"
    if returncode > 128:
        return "killed", f"killed by signal {returncode - 128}"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {returncode}"
    return "error", last[:300]
