"""main.py of a worker sandbox. The first stdin line sets it up (library paths, module sources, the entry
function, trusted warm-up arguments); then each line is one call, answered by one stdout line.

Every call runs in a fork of the warmed-up process that first enters new user, PID, mount, IPC and UTS
namespaces: it is pid 1 of a PID namespace of its own, with no /proc and no capability left, so it cannot
see (signal, renice, prlimit, open /proc/N of) this process, the next call's process or anything else, nor
share System V memory or queues with them; when it ends, the kernel kills everything it started. Its file
descriptors are only its two pipes; the file system is read-only (a worker has no writable folder), so
nothing can be planted for a later call; a seccomp filter (the sandbox's and the calls' own, see
seccomp.py) refuses what would outlive it; this process is not dumpable. The next call's process is made
while a call runs and says when it is ready (a failed one is made again after the call). The reply is
checked here (shape, nesting) and its id set here. So a call decides its own reply, and nothing else.
(Sent after seccomp.py's text: see :mod:`verl.sandbox.programs`.)
"""

import ctypes
import gc
import json
import os
import resource
import select
import signal
import sys
import time
import types

if __package__:  # imported on the host; run as a program, seccomp.py's text comes first
    from .seccomp import install_seccomp, libc, seccomp_program

# user, PID, mount, IPC, UTS. Not network: the sandbox's has no interface, a call has no capability in it, and
# a worker runs one call at a time (a namespace of its own would cost ~1 ms a call).
NAMESPACES = 0x10000000 | 0x20000000 | 0x00020000 | 0x08000000 | 0x04000000


def send(obj):
    stdout.write(json.dumps(obj).encode() + b"\n")
    stdout.flush()


def read_all(fd):
    chunks = []
    while data := os.read(fd, 1 << 16):
        chunks.append(data)
    return b"".join(chunks)


def exit_like(status):
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


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
                # or make a user namespace: its uid is not mapped), and the host's _DENIED_CALLS refused.
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


def main():
    global stdout, setup, function, null, nofile, cap_last, seccomp_call, me
    sys.path[:] = [p for p in sys.path if p.startswith("/usr")]
    os.chdir("/")
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    setup = json.loads(stdin.readline())
    sys.path += setup["paths"]  # after the standard library
    for name, source in setup["modules"]:
        parts = name.split(".")
        for level in range(1, len(parts) + 1):
            prefix = ".".join(parts[:level])
            if prefix not in sys.modules:
                module = types.ModuleType(prefix)
                if level < len(parts):
                    module.__path__ = []
                sys.modules[prefix] = module
                if level > 1:
                    setattr(sys.modules[".".join(parts[:level - 1])], parts[level - 1], module)
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
    me = os.getpid()
    spare = spawn()
    send({"ready": True})
    while line := stdin.readline():
        request = json.loads(line)
        reply, spare = run(request, spare)
        send({**reply, "id": request["id"]})


if __name__ == "__main__":
    main()
