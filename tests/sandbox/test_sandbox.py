"""The code sandbox against hostile programs: each is contained, reported with a reason, and the test
process (standing in for the trainer) is unaffected."""

import os
import shutil
import socket
import tempfile
import time

import pytest

from verl.sandbox import process as sandbox
from verl.sandbox import worker as sandbox_worker
from verl.sandbox.process import (
    SandboxLimits,
    SandboxUnavailable,
    isolation,
    run_python,
)

pytestmark = pytest.mark.skipif(isolation() != "namespaces", reason=f"no sandbox on this machine: {isolation()}")

FAST = SandboxLimits(cpu_seconds=2, wall_seconds=6, memory_mb=256, max_processes=16, max_output_bytes=4096)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_plain_program_reads_stdin_and_prints():
    result = run_python("a, b = map(int, input().split())\nprint(a * b)", stdin="6 7")
    assert result.ok and result.stdout == "42\n" and result.returncode == 0


def test_an_exception_is_an_error_with_its_last_line():
    result = run_python("raise ValueError('bad input')", limits=FAST)
    assert result.status == "error" and result.reason == "ValueError: bad input"


def test_infinite_loop_hits_the_cpu_limit():
    start = time.monotonic()
    result = run_python("while True:\n    pass", limits=FAST)
    assert result.status == "cpu_limit" and "2 s of CPU time" in result.reason
    assert time.monotonic() - start < FAST.wall_seconds + 2


def test_sleeping_forever_hits_the_wall_clock():
    result = run_python("import time\ntime.sleep(60)", limits=SandboxLimits(wall_seconds=1.5))
    assert result.status == "timeout" and result.wall_seconds < 5


def test_memory_bomb_is_refused_memory():
    result = run_python("x = bytearray(2 * 1024 ** 3)\nprint('allocated')", limits=FAST)
    assert result.status == "memory_limit" and "allocated" not in result.stdout


FORK_BOMB_CHECK = """
import ctypes, json, os, time
from verl.sandbox.process import SandboxLimits, run_python
# This process becomes the reaper of its orphaned descendants: a process the sandbox left behind stays counted here.
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
code = ("import os\\nfor _ in range(10000):\\n    try:\\n        os.fork()\\n    except OSError:\\n        pass\\n"
        "import time\\ntime.sleep(30)")
result = run_python(code, limits=SandboxLimits(wall_seconds=3, max_processes=16))
deadline = time.time() + 5  # the escaped would sleep 30 s: still here then
while True:
    while True:  # reap what has exited
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    left = DESCENDANTS()
    if not left or time.time() > deadline:
        break
    time.sleep(0.1)
print(json.dumps({"status": result.status, "left": left}))
"""


def test_fork_bomb_is_contained_and_leaves_no_process_behind():
    """Run in a child that is the subreaper of its descendants, so that a process escaping the sandbox would be
    reparented to it and counted (other programs on the machine are not)."""
    import inspect
    import json
    import subprocess
    import sys

    script = inspect.getsource(_processes).replace("def _processes", "def DESCENDANTS") + FORK_BOMB_CHECK
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] == "timeout"
    assert result["left"] == 0  # the PID namespace died with its first process


def test_the_project_and_the_host_filesystem_are_invisible():
    code = (f"import os\nprint(os.path.exists({REPO!r}), os.path.exists('/root'), os.path.exists('/work'))\n"
            "print(sorted(os.listdir('/')))")
    result = run_python(code, limits=FAST)
    assert result.ok, result.stderr
    first, listing = result.stdout.splitlines()
    assert first == "False False False"
    assert "work" not in listing and "root" not in listing and "home" not in listing


def test_writing_outside_its_directory_fails_and_its_files_vanish(tmp_path):
    target = tmp_path / "pwned.txt"
    code = (f"import os\nfor path in ({str(target)!r}, '/usr/pwned', '/etc/pwned'):\n"
            "    try:\n        open(path, 'w').write('x')\n        print('wrote', path)\n"
            "    except OSError as e:\n        print('refused', path, type(e).__name__)\n"
            "open('/sandbox/mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())")
    result = run_python(code, limits=FAST)
    assert result.ok, result.stderr
    assert "wrote" not in result.stdout and result.stdout.count("refused") == 3 and result.stdout.endswith("ok\n")
    assert not target.exists() and not os.path.exists("/usr/pwned") and not os.path.exists("/etc/pwned")


def test_no_network():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    code = ("import socket\ns = socket.socket()\ns.settimeout(2)\n"
            f"try:\n    s.connect(('127.0.0.1', {port}))\n    print('connected')\n"
            "except OSError as e:\n    print('refused', type(e).__name__)")
    try:
        result = run_python(code, limits=FAST)
    finally:
        listener.close()
    assert result.ok and result.stdout.startswith("refused")


def test_huge_output_is_cut():
    result = run_python("while True:\n    print('x' * 1000)", limits=FAST)
    assert result.status == "output_limit" and len(result.stdout) <= FAST.max_output_bytes


def test_huge_file_is_cut_by_the_file_size_limit():
    result = run_python("open('big', 'wb').write(b'0' * (64 * 1024 * 1024))", limits=FAST)
    assert result.status != "ok"


def test_without_namespaces_nothing_runs(monkeypatch):
    monkeypatch.setattr(sandbox, "isolation", lambda: "no `unshare` binary (util-linux) on this machine")
    with pytest.raises(SandboxUnavailable, match="cannot run untrusted code safely: no `unshare`"):
        run_python("print(1)")


def _processes() -> int:
    """Processes descended from this one (other programs on the machine come and go: not counted)."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # gone meanwhile
                pass
    me, count = os.getpid(), 0
    for pid in parents:
        if pid == me:
            continue
        seen = set()
        while pid in parents and pid not in seen and pid != me:
            seen.add(pid)
            pid = parents[pid]
        count += pid == me
    return count


def test_no_capabilities_so_no_chroot_escape_and_no_remount():
    code = ("import os\nprint(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
            "for attempt in ('chroot', 'mount'):\n    try:\n"
            "        if attempt == 'chroot':\n            os.makedirs('/tmp/x'); os.chroot('/tmp/x')\n"
            "            for _ in range(64): os.chdir('..')\n            os.chroot('.')\n"
            "            print('escaped', os.listdir('/'))\n"
            "        else:\n            import ctypes\n            libc = ctypes.CDLL(None, use_errno=True)\n"
            "            print('remounted' if libc.mount(None, b'/usr', None, 32 | 4096 | 1, None) == 0 "
            "and libc.mount(None, b'/usr', None, 32 | 4096, None) == 0 else 'refused')\n"
            "    except OSError as e:\n        print('refused', type(e).__name__)")
    result = run_python(code, limits=FAST)
    assert result.ok, result.stderr
    caps, *attempts = result.stdout.split("\n")[:3]
    assert caps == "0000000000000000"
    assert all(line.startswith("refused") for line in attempts), result.stdout


def test_a_large_stdin_the_program_never_reads_does_not_stall_the_timeout():
    result = run_python("import time\ntime.sleep(30)", stdin="1\n" * 200_000, limits=SandboxLimits(wall_seconds=2))
    assert result.status == "timeout" and result.wall_seconds < 6


# ----------------------------------------------------------------------------- long-lived workers

WORKER_MODULE = '''
import os, time
import tinylib
STATE = {"calls": 0}

def handle(arg):
    STATE["calls"] += 1
    kind = arg["kind"]
    if kind == "echo":
        return {"calls": STATE["calls"], "lib": tinylib.VALUE, "arg": arg.get("value")}
    if kind == "patch":
        globals()["handle"] = lambda a: "forged"
        return "patched"
    if kind == "raise":
        raise ValueError("bad argument")
    if kind == "loop":
        while True:
            pass
    if kind == "sleep":
        time.sleep(60)
    if kind == "exit":
        os._exit(3)
    if kind == "big":
        return "x" * (2 << 20)
    if kind == "linger":  # a daemon: double fork, new session (refused, so tried), ignores SIGTERM
        if os.fork() == 0:
            try:
                try:
                    os.setsid()
                except OSError:
                    pass
                if os.fork() == 0:
                    import signal
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                    time.sleep(60)
            finally:
                os._exit(0)  # never back into the worker's code: that would send a second reply
        return "left a process"
    if kind == "look":  # what other processes can this call see or touch?
        import resource
        seen = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        touched = []
        for pid in range(2, 300):
            for attempt in (lambda: os.kill(pid, 0), lambda: resource.prlimit(pid, resource.RLIMIT_AS),
                            lambda: os.setpriority(os.PRIO_PROCESS, pid, 19)):
                try:
                    attempt()
                    touched.append(pid)
                except OSError:
                    pass
        try:
            os.setpriority(os.PRIO_USER, os.getuid(), 19)  # every process of "this user" it can see
        except OSError:
            pass
        return {"seen": seen, "parent": os.getppid(), "touched": sorted(set(touched))}
    if kind == "raw":  # write a reply by hand into its own pipe: too deeply nested for a parser
        import stat
        for fd in range(64):
            try:
                if stat.S_ISFIFO(os.fstat(fd).st_mode) and os.get_blocking(fd) is not None:
                    os.write(fd, b'{"status": "ok", "value": ' + b"[" * 990 + b"]" * 990 + b"}")
            except OSError:
                pass
        os._exit(0)
    if kind == "deep":
        value = []
        for _ in range(200):
            value = [value]
        return value
    if kind == "reach":  # what reaches beyond the call: refused system calls, /proc, its keyring
        import ctypes, socket
        libc = ctypes.CDLL(None, use_errno=True)
        refused = {}
        for name, attempt in (("shmget", lambda: libc.shmget(0, 1 << 20, 0o1600)), ("setsid", os.setsid),
                              ("socket", lambda: socket.socket(socket.AF_UNIX)),
                              ("keyctl", lambda: libc.syscall(250 if os.uname().machine == "x86_64" else 219,
                                                              0, -3, 0)),  # KEYCTL_GET_KEYRING_ID session
                              ("umount /proc", lambda: libc.umount2(b"/proc", 2))):
            try:
                result = attempt()
                refused[name] = result == -1 and ctypes.get_errno() == 1
            except PermissionError:
                refused[name] = True
        return {"refused": refused, "proc": os.listdir("/proc")}
    if kind == "threads":  # use up the process limit while the next call's process is being made
        import threading
        while True:
            try:
                threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
            except RuntimeError:
                time.sleep(0.2)
                return "exhausted"
    if kind == "write":
        results = {}
        for path in ("/planted.py", "/tmp/planted.py", "/sandbox/planted.py",
                     os.path.join(os.path.dirname(os.path.dirname(tinylib.__file__)), "planted.py"),
                     os.path.join(os.path.dirname(tinylib.__file__), "planted.py")):
            try:
                open(path, "w").write("VALUE = 'forged'")
                results[path] = "wrote"
            except OSError as e:
                results[path] = type(e).__name__
        return results
'''


@pytest.fixture(scope="module")
def worker():
    base = tempfile.mkdtemp(prefix="verl-lib-")  # not pytest's tmp_path: the sandbox user must be able to enter it
    library = os.path.join(base, "tinylib")
    os.makedirs(library)
    with open(os.path.join(library, "__init__.py"), "w") as f:
        f.write("VALUE = 42\n")
    for path, mode in ((base, 0o755), (library, 0o755), (os.path.join(library, "__init__.py"), 0o644)):
        os.chmod(path, mode)
    worker = sandbox_worker.SandboxWorker([("tests.tiny.handler", WORKER_MODULE)], "tests.tiny.handler.handle",
                                   libraries=[library], warmup=[{"kind": "echo"}],
                                   limits=SandboxLimits(cpu_seconds=1, wall_seconds=3, memory_mb=512))
    yield worker
    worker.close()
    shutil.rmtree(base)


def test_a_worker_serves_calls_each_in_a_fresh_copy_of_the_warmed_up_process(worker):
    first = worker.call({"kind": "echo", "value": [1, "a"]})
    assert first.ok and first.value == {"calls": 2, "lib": 42, "arg": [1, "a"]}  # the warm-up was call 1
    assert worker.call({"kind": "patch"}).value == "patched"
    assert worker.call({"kind": "echo"}).value["calls"] == 2  # neither the count nor the patch stayed


def test_a_worker_reports_errors_limits_and_crashes_and_keeps_serving(worker):
    assert worker.call({"kind": "raise"}).error == "ValueError: bad argument"
    assert worker.call({"kind": "loop"}, timeout=60).status == "cpu_limit"  # 1 s of CPU, long before 60 s
    slow = worker.call({"kind": "sleep"}, timeout=1.0)
    assert slow.status == "timeout" and slow.seconds >= 1.0
    assert worker.call({"kind": "exit"}).status == "crashed"
    assert worker.call({"kind": "big"}).status == "too_large"
    assert worker.call({"kind": "echo"}).ok


def _worker_processes(worker) -> list:
    import psutil

    return psutil.Process(worker._proc.pid).children(recursive=True)


def _settled_count(worker) -> int:
    """The number of the worker's processes once the next call's process is made (it is made in the background)."""
    counts = [len(_worker_processes(worker))]
    for _ in range(100):
        time.sleep(0.05)
        counts.append(len(_worker_processes(worker)))
        if len(counts) > 2 and counts[-1] == counts[-2] == counts[-3]:
            break
    return counts[-1]


def test_nothing_a_call_starts_outlives_it(worker):
    worker.call({"kind": "echo"})
    before = _settled_count(worker)
    assert worker.call({"kind": "linger"}).value == "left a process"
    assert worker.call({"kind": "echo"}).ok
    assert _settled_count(worker) == before  # the daemon died with its call's PID namespace


def test_a_call_sees_and_touches_no_other_process_and_writes_nowhere(worker):
    look = worker.call({"kind": "look"})
    assert look.ok and look.value == {"seen": [], "parent": 0, "touched": []}  # no /proc, no one by pid
    assert all(p.nice() == 0 for p in _worker_processes(worker))  # the PRIO_USER renice reached nobody else
    written = worker.call({"kind": "write"}).value
    assert set(written.values()) <= {"OSError", "PermissionError"}, written
    assert worker.call({"kind": "echo"}).value["lib"] == 42


def test_a_reply_too_deep_or_forged_is_refused_without_harm(worker):
    assert worker.call({"kind": "deep"}).status == "crashed"  # nested past 64 levels
    assert worker.call({"kind": "raw"}).status == "crashed"  # written by hand, 990 levels
    assert worker.call({"kind": "echo"}).ok


def test_calls_get_no_system_v_ipc_sessions_sockets_keys_or_proc(worker):
    reach = worker.call({"kind": "reach"})
    assert reach.ok and reach.value == {"refused": dict.fromkeys(["shmget", "setsid", "socket", "keyctl",
                                                                  "umount /proc"], True), "proc": []}
    assert {p.nice() for p in _worker_processes(worker)} == {0}


def test_a_call_using_up_the_process_limit_does_not_spoil_the_next(worker):
    for _ in range(3):
        assert worker.call({"kind": "threads"}).value == "exhausted"
        assert worker.call({"kind": "echo"}).ok


def test_a_waiting_call_process_killed_from_outside_is_replaced(worker):
    assert worker.call({"kind": "echo"}).ok
    for _ in range(2):  # the waiting call process: the one leaf of the worker's tree (say, the OOM killer's pick)
        _settled_count(worker)  # the waiting call process is made in the background
        leaves = [p for p in _worker_processes(worker) if not p.children()]
        assert len(leaves) == 1, leaves
        leaves[0].kill()
        leaves[0].wait(10)
        assert worker.call({"kind": "echo"}).ok


def test_a_worker_killed_from_outside_is_started_again(worker):
    os.killpg(worker._proc.pid, 9)
    worker._proc.wait()
    assert worker.call({"kind": "echo"}).value["calls"] == 2


def test_a_pool_runs_calls_from_threads_at_once(tmp_path):
    import threading

    nap = ("import time\ndef nap(s):\n    start = time.monotonic()\n    time.sleep(s)\n"
           "    return [start, time.monotonic()]\n")
    pool = sandbox_worker.SandboxPool(3, modules=[("sleeper", nap)], entry="sleeper.nap",
                               limits=SandboxLimits(wall_seconds=60))
    spans = []
    try:
        threads = [threading.Thread(target=lambda: spans.append(pool.call(2.0).value)) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        pool.close()
    assert len(spans) == 3 and max(s for s, _ in spans) < min(e for _, e in spans)  # all three napped at once


def test_a_forked_child_starts_its_own_worker_and_leaves_the_parents_alone(worker):
    assert worker.call({"kind": "echo"}).ok
    parents = worker._proc.pid
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if worker.call({"kind": "echo"}).ok and worker._proc.pid != parents else 2
            worker.close()
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    assert worker._proc.pid == parents and worker.call({"kind": "echo"}).ok


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="keyctl system call numbers of x86_64")
def test_sandboxed_code_does_not_see_the_trainers_session_keyring():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    # add_key("user", "verl-test-secret", "hunter2", KEY_SPEC_SESSION_KEYRING): the trainer's own keyring
    key = libc.syscall(248, b"user", b"verl-test-secret", b"hunter2", 7, -3)
    if key < 0:
        pytest.skip(f"no session keyring to test with (errno {ctypes.get_errno()})")
    try:
        code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                "found = libc.syscall(250, 10, -3, b'user', b'verl-test-secret', 0)\n"  # KEYCTL_SEARCH
                "print(found, ctypes.get_errno())")
        result = run_python(code, limits=FAST)
        # refused (keyctl is not allowed in a sandbox), and not there anyway (a keyring of its own): never found
        assert result.ok and result.stdout.split() in (["-1", "1"], ["-1", "126"]), result.stdout
    finally:
        libc.syscall(250, 3, key)  # KEYCTL_REVOKE


def test_sandboxed_code_cannot_hold_memory_kernel_objects_or_host_file_locks_outside_its_limits():
    code = """
import ctypes, fcntl, os
libc = ctypes.CDLL(None, use_errno=True)
x86 = os.uname().machine == "x86_64"
attempts = {
    "memfd": lambda: os.memfd_create("hoard"),
    "io_setup": lambda: libc.syscall(206 if x86 else 0, 64, ctypes.byref(ctypes.c_ulong())),
    "shmget": lambda: libc.shmget(0, 1 << 20, 0o1600),
    "flock": lambda: fcntl.flock(open("/etc/passwd"), fcntl.LOCK_SH),
    "fcntl lock": lambda: fcntl.lockf(open("/etc/passwd"), fcntl.LOCK_SH),
    "inotify": lambda: libc.inotify_init1(0),
    "dnotify": lambda: fcntl.fcntl(os.open("/etc", os.O_RDONLY), 1026, 0x1),  # F_NOTIFY, DN_ACCESS
    "lease": lambda: fcntl.fcntl(open("/etc/passwd"), 1024, fcntl.F_RDLCK),  # F_SETLEASE
    "pipe size": lambda: fcntl.fcntl(os.pipe()[0], 1031, 1 << 20),  # F_SETPIPE_SZ
    "mq_open": lambda: libc.mq_open(b"/hoard", os.O_CREAT | os.O_RDWR, 0o600, None),
    "setsid": os.setsid,
    "user namespace": lambda: libc.unshare(0x10000000),
    "vsock": lambda: __import__("socket").socket(40, 1),  # AF_VSOCK: not confined by the network namespace
    "perf_event": lambda: libc.syscall(298 if x86 else 241, None, 0, -1, -1, 0),
    "fadvise": lambda: os.posix_fadvise(os.open("/etc/passwd", os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED),
}
for name, attempt in attempts.items():
    try:
        result = attempt()
        refused = result == -1 and ctypes.get_errno() in (1, 28)  # EPERM, or ENOSPC: no user namespace left
    except PermissionError:
        refused = True
    except OSError as e:
        refused = e.errno == 1
    print(name, refused)
"""
    result = run_python(code, limits=FAST)
    assert result.ok, result.stderr
    names = ("memfd", "io_setup", "shmget", "flock", "fcntl lock", "inotify", "dnotify", "lease", "pipe size",
             "mq_open", "setsid", "user namespace", "vsock", "perf_event", "fadvise")
    assert result.stdout.split() == [w for name in names for w in (*name.split(), "True")], result.stdout
