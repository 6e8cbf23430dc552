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
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass

__all__ = ["CallResult", "SandboxLimits", "SandboxPool", "SandboxResult", "SandboxUnavailable", "SandboxWorker",
           "isolation", "run_python"]

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
    """What a sandboxed process needs to build its seccomp filter (see ``_SECCOMP_CODE``)."""
    spec = {"arch": _SECCOMP_ARCH[_machine()], "fcntl": _syscall("fcntl"), "locks": list(_FCNTL_DENIED),
            "denied": [n for n in (_syscall(name) for name in names) if n is not None]}
    if socket_families is not None:
        spec.update(socket=_syscall("socket"), families=list(socket_families))
    return spec


# Builds and installs a classic-BPF seccomp filter in a sandboxed process: another architecture (i386 through
# int 0x80 too) is killed; x32 system calls, the ``denied`` ones and the listed fcntl commands get EPERM; the
# rest is allowed.
_SECCOMP_CODE = r"""
class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]

def seccomp_program(spec):
    LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
    ALLOW, KILL, EPERM = 0x7FFF0000, 0x80000000, 0x00050001
    prog, labels = [], {}
    def op(code, k, jt=None, jf=None):  # jt/jf: a label further on, or None for the next instruction
        prog.append((code, jt, jf, k))
    def label(name):
        labels[name] = len(prog)
    op(LD, 4)
    op(JEQ, spec["arch"], jf="kill")
    op(LD, 0)
    op(JGE, 0x40000000, jt="deny")  # x32 system calls on x86_64
    for number in spec["denied"]:
        op(JEQ, number, jt="deny")
    op(JEQ, spec["fcntl"], jt="fcntl")
    if spec.get("socket") is not None:
        op(JEQ, spec["socket"], jt="socket")
    op(RET, ALLOW)
    label("fcntl")
    op(LD, 24)  # the low half of the second argument: the command
    for command in spec["locks"]:
        op(JEQ, command, jt="deny")
    op(RET, ALLOW)
    if spec.get("socket") is not None:
        label("socket")
        op(LD, 16)  # the first argument: the address family
        for family in spec["families"]:
            op(JEQ, family, jt="allow")
        op(RET, EPERM)
    label("allow")
    op(RET, ALLOW)
    label("deny")
    op(RET, EPERM)
    label("kill")
    op(RET, KILL)
    code = []
    for i, (c, jt, jf, k) in enumerate(prog):
        offsets = [0 if target is None else labels[target] - i - 1 for target in (jt, jf)]
        assert all(0 <= o < 256 for o in offsets)
        code.append(SockFilter(c, offsets[0], offsets[1], k))
    filters = (SockFilter * len(code))(*code)
    return SockFprog(len(code), ctypes.cast(filters, ctypes.POINTER(SockFilter))), filters

def install_seccomp(program):
    if libc.prctl(22, 2, ctypes.byref(program[0]), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")
"""


# Runs inside the namespaces as their root (pid 1): builds the new root, chroots, sets the limits and
# runs the code as its child, then exits with the child's status (128 + signal when it was killed).
_RUNNER = r'''
import ctypes, json, os, resource, shutil, signal, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
''' + _SECCOMP_CODE + r'''
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
for name, size in (("sandbox", cfg["disk_mb"]), ("tmp", cfg["disk_mb"])):
    os.makedirs(f"{root}/{name}", exist_ok=True)
    mount("tmpfs", f"{root}/{name}", "tmpfs", MS_NOSUID | MS_NODEV, f"size={size}m,mode=1777")
for path in cfg["ro"]:  # after the tmpfs mounts, which would hide a library folder under /tmp
    bind_ro(path, root)
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
# Read-only from here: the root (nothing can be planted next to the libraries), and for a worker, whose calls
# must not leave anything for the next one, /sandbox and /tmp as well.
for path in ["/"] + (["/sandbox", "/tmp"] if cfg["readonly"] else []):
    mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
os.chdir("/sandbox")
# Nested user namespaces (each a kernel object outside every limit, and capabilities inside): none for a
# program; a worker makes one per call (its calls cannot make any: their uid is not mapped), and the kernel
# frees them asynchronously, hence the room.
with open("/proc/sys/user/max_user_namespaces", "w") as f:
    f.write(str(cfg["userns"]))
CAP_LAST = int(open("/proc/sys/kernel/cap_last_cap").read())
with open("/proc/self/oom_score_adj", "w") as f:  # out of memory, the kernel kills sandboxed code first
    f.write("1000")
# A new, empty session keyring rather than the trainer's (best effort: keyctl is refused to the code anyway).
libc.syscall(cfg["keyctl"], 1, None)  # KEYCTL_JOIN_SESSION_KEYRING
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
    install_seccomp(seccomp_program(cfg["seccomp"]))
    for limit, value in ((resource.RLIMIT_CPU, (cfg["cpu"], cfg["cpu"] + 1)),
                         (resource.RLIMIT_AS, (cfg["memory"],) * 2), (resource.RLIMIT_NPROC, (cfg["nproc"],) * 2),
                         (resource.RLIMIT_FSIZE, (cfg["fsize"],) * 2), (resource.RLIMIT_NOFILE, (cfg["nofile"],) * 2),
                         (resource.RLIMIT_CORE, (0, 0)), (resource.RLIMIT_SIGPENDING, (64, 64)),
                         (resource.RLIMIT_MSGQUEUE, (0, 0)), (resource.RLIMIT_MEMLOCK, (0, 0)),
                         (resource.RLIMIT_RTPRIO, (0, 0)), (resource.RLIMIT_NICE, (0, 0))):
        resource.setrlimit(limit, value)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/sandbox", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "PYTHONIOENCODING": "utf-8"}
    os.execve(cfg["python"], [cfg["python"], "-I", "-B", "main.py"], env)
# pid 1 keeps nothing a sandboxed process could borrow: not dumpable (its /proc/1/fd cannot be opened) and
# its copies of the pipes to the host replaced by /dev/null.
libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
null = os.open("/dev/null", os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
while True:
    done, status = os.waitpid(-1, 0)
    if done == pid:
        break
os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
'''


# pivot_root has no libc wrapper: its system call number per architecture.
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}




def _interpreter() -> str:
    """An interpreter an unprivileged uid can run: the system's, else this one's base installation."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.isfile(candidate):
            return os.path.realpath(candidate)
    import sys

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
        return (f"user/network/mount/PID namespaces are not available to an unprivileged user here "
                f"({result.reason})")
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
                        f"the sandbox runs as an unprivileged user and cannot enter {ancestor} (on the way to "
                        f"{path}); install "
                        "Python packages where every user can read them (chmod o+rx), e.g. a virtual environment "
                        "outside /root")
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


# ----------------------------------------------------------------------------- long-lived workers

# main.py of a worker sandbox. The first stdin line sets it up (library paths, module sources, the entry
# function, trusted warm-up arguments); then each line is one call, answered by one stdout line.
#
# Every call runs in a fork of the warmed-up process that first enters new user, PID, mount, IPC and UTS
# namespaces: it is pid 1 of a PID namespace of its own, with no /proc and no capability left, so it cannot
# see (signal, renice, prlimit, open /proc/N of) this process, the next call's process or anything else, nor
# share System V memory or queues with them; when it ends, the kernel kills everything it started. Its file
# descriptors are only its two pipes; the file system is read-only (a worker has no writable folder), so
# nothing can be planted for a later call; a seccomp filter (the sandbox's and the calls' own, see
# _SECCOMP_CODE) refuses what would outlive it; this process is not dumpable. The next call's process is made
# while a call runs and says when it is ready (a failed one is made again after the call). The reply is
# checked here (shape, nesting) and its id set here. So a call decides its own reply, and nothing else.
_WORKER = r'''
import ctypes, gc, json, os, resource, select, signal, sys, time, types
sys.path[:] = [p for p in sys.path if p.startswith("/usr")]
os.chdir("/")
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
''' + _SECCOMP_CODE + r'''
stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

def send(obj):
    stdout.write(json.dumps(obj).encode() + b"\n")
    stdout.flush()

setup = json.loads(stdin.readline())
sys.path += setup["paths"]  # after the standard library
for name, source in setup["modules"]:
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        if prefix not in sys.modules:
            module = types.ModuleType(prefix)
            if depth < len(parts):
                module.__path__ = []
            sys.modules[prefix] = module
            if depth > 1:
                setattr(sys.modules[".".join(parts[:depth - 1])], parts[depth - 1], module)
    module = sys.modules[name]
    module.__file__ = "/" + name.replace(".", "/") + ".py"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
module_name, _, function_name = setup["entry"].rpartition(".")
function = getattr(sys.modules[module_name], function_name)
for argument in setup["warmup"]:
    function(argument)
null = os.open("/dev/null", os.O_RDWR)
nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
with open("/proc/sys/kernel/cap_last_cap") as f:
    cap_last = int(f.read())

seccomp_call = seccomp_program(setup["seccomp"])
gc.collect()
gc.freeze()  # what is loaded now is never scanned again: a fork's garbage collector leaves those pages shared

def read_all(fd):
    chunks = []
    while data := os.read(fd, 1 << 16):
        chunks.append(data)
    return b"".join(chunks)

def exit_like(status):
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))

# user, PID, mount, IPC, UTS. Not network: the sandbox's has no interface, a call has no capability in it, and
# a worker runs one call at a time (a namespace of its own would cost ~1 ms a call).
NAMESPACES = 0x10000000 | 0x20000000 | 0x00020000 | 0x08000000 | 0x04000000

def spawn():
    """The next call's process, made ahead while the current call runs: a fork (S) that enters new
    namespaces and forks the call's process (pid 1 there), which says b"R" when it is ready for its request.
    None when the fork fails (the current call may be using up the process limit): retried later."""
    request_r, request_w = os.pipe()
    result_r, result_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        for fd in (request_r, request_w, result_r, result_w):
            os.close(fd)
        return None
    if pid == 0:
        try:
            gc.disable()  # a short-lived copy: collecting would touch (and copy) the parent's pages
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            keep = sorted({null, request_r, result_w})
            for low, high in zip([3] + [fd + 1 for fd in keep], keep + [nofile]):
                os.closerange(low, high)
            if libc.unshare(NAMESPACES) != 0:
                os._exit(71)
            inner = os.fork()
            if inner == 0:
                libc.mount(None, b"/", None, 16384 | (1 << 18), None)  # MS_REC | MS_PRIVATE
                # No /proc at all (an empty read-only folder over it): nothing of the worker to look at, and no
                # oom_score_adj to lower.
                if libc.mount(b"none", b"/proc", b"tmpfs", 1 | 2 | 4 | 8, b"size=4k") != 0:
                    os._exit(72)
                # Then no capability at all, even in its own namespaces (it cannot unmount that, mount anything,
                # or make a user namespace: its uid is not mapped), and the system calls in _DENIED refused.
                for cap in range(cap_last + 1):
                    libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
                if libc.syscall(setup["capset"], (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()):
                    os._exit(73)
                try:
                    install_seccomp(seccomp_call)  # on top of the sandbox's own filter
                except OSError:
                    os._exit(74)
                os.write(result_w, b"R")
                request = read_all(request_r)
                if not request:
                    os._exit(0)  # never used
                os.write(result_w, b"A")  # accepted: from here on, what happens is this call's doing
                signal.signal(signal.SIGXCPU, lambda *_: os._exit(75))  # pid 1 ignores it unless handled
                resource.setrlimit(resource.RLIMIT_CPU, (setup["cpu"], setup["cpu"] + 1))
                try:
                    data = json.dumps({"status": "ok", "value": function(json.loads(request)["arg"])}).encode()
                except BaseException as exc:
                    data = json.dumps({"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}).encode()
                view = memoryview(data)
                while view:
                    view = view[os.write(result_w, view):]
                os._exit(0)
            for fd in (request_r, result_w):
                os.close(fd)
            exit_like(os.waitpid(inner, 0)[1])
        finally:
            os._exit(70)
    os.close(request_r)
    os.close(result_w)
    return pid, request_w, result_r

def ready(spare):
    """Whether the spare's call process said it is ready (within 10 s)."""
    if spare is None:
        return False
    read_end = spare[2]
    return bool(select.select([read_end], [], [], 10.0)[0]) and os.read(read_end, 1) == b"R"

def discard(spare):
    if spare is not None:
        os.close(spare[1])
        os.close(spare[2])
        end(spare[0], 0.0)

def children_of(parent):
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == parent:
                        found.append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    return found

def end(pid, grace):
    """The exit status of a call's process S, given ``grace`` seconds to end by itself; then it and the
    namespace under it are killed, and this waits until they are gone (else it stops: the host starts a
    fresh worker rather than run the next call beside a survivor)."""
    status, waited = None, time.monotonic() + grace
    while status is None and time.monotonic() < waited:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            status = wait_status
        else:
            time.sleep(0.0005)
    if status is None:
        for victim in children_of(pid) + [pid]:
            try:
                os.kill(victim, signal.SIGKILL)
            except OSError:
                pass
        status = os.waitpid(pid, 0)[1]
    gone_by = time.monotonic() + 2.0
    while children_of(pid) or children_of(1) != [me]:  # orphans are reaped by pid 1
        if time.monotonic() > gone_by:
            os._exit(3)
        time.sleep(0.001)
    return status

def depth(value, limit=64):
    """How deeply ``value`` nests, counted up to ``limit`` (a reply nested deeper could overflow the host's
    parser's stack)."""
    level, layer = 0, [value]
    while layer and level <= limit:
        layer = [v for item in layer if isinstance(item, (list, dict))
                 for v in (item.values() if isinstance(item, dict) else item)]
        level += 1
    return level

def check(data):
    """The call's reply, re-made here: only an ok with a value, or an error with a message."""
    try:
        reply = json.loads(data)
        if isinstance(reply, dict) and reply.get("status") == "ok" and "value" in reply:
            if depth(reply["value"]) <= 64:
                return {"status": "ok", "value": reply["value"]}
        elif isinstance(reply, dict) and reply.get("status") == "error" and isinstance(reply.get("error"), str):
            return {"status": "error", "error": reply["error"][:2000]}
    except Exception:  # undecodable, or too deep for the decoder
        pass
    return None

me = os.getpid()

def run(request, spare):
    """Answer ``request`` with the spare call process; returns the reply and the next spare."""
    for _ in range(2):  # a second time when the call process died before taking the request
        if not ready(spare):  # it failed while the previous call ran (which may have used up the limits)
            discard(spare)
            spare = spawn()
            if not ready(spare):
                discard(spare)
                return {"status": "crashed", "error": "could not start the call's process"}, spawn()
        pid, request_w, read_end = spare
        view = memoryview(json.dumps(request).encode())
        try:
            while view:
                view = view[os.write(request_w, view):]
        except OSError:
            pass
        os.close(request_w)
        spare = spawn()
        if select.select([read_end], [], [], 10.0)[0] and os.read(read_end, 1) == b"A":
            break
        os.close(read_end)
        end(pid, 0.0)
    else:
        return {"status": "crashed", "error": "the call's process died before taking its request"}, spare
    deadline = time.monotonic() + request["timeout"]
    chunks, size, status = [], 0, None
    while status is None:
        left = deadline - time.monotonic()
        if left <= 0:
            status = "timeout"
        elif select.select([read_end], [], [], left)[0]:
            data = os.read(read_end, 1 << 16)
            if not data:
                break  # the call's process closed its end: it wrote all it will write
            size += len(data)
            if size > setup["max_reply_bytes"]:
                status = "too_large"
            chunks.append(data)
    os.close(read_end)
    exited = end(pid, 0.5 if status is None else 0.0)  # a complete reply: S ends right after its call
    if status is not None:
        return {"status": status}, spare
    reply = check(b"".join(chunks))
    if reply is not None:
        return reply, spare
    if chunks:
        return {"status": "crashed", "error": "the call sent a malformed reply"}, spare
    code = os.WEXITSTATUS(exited) if os.WIFEXITED(exited) else 128 + os.WTERMSIG(exited)
    if code == 75:  # its SIGXCPU handler
        return {"status": "cpu_limit", "error": f"used more than {setup['cpu']} s of CPU time"}, spare
    how = {128 + signal.SIGKILL: "killed (its CPU limit, or out of memory)"}.get(
        code, f"killed by signal {code - 128}" if code > 128 else f"exit status {code}")
    return {"status": "crashed", "error": how}, spare

spare = spawn()
send({"ready": True})
while line := stdin.readline():
    request = json.loads(line)
    reply, spare = run(request, spare)
    send({**reply, "id": request["id"]})
'''


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
    file system (see ``_WORKER``), with ``limits.cpu_seconds`` of CPU and a wall-clock timeout
    (``limits.wall_seconds`` unless given); ``limits.memory_mb`` bounds every process. A call decides its own
    result and nothing else. Thread-safe (calls are serialised); a worker that dies is started again on the
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
