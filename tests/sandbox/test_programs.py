"""The programs that run inside a sandbox, on the host: the seccomp filter's instructions worked out by hand
(and the filter installed in a child process), the worker's checks of a call's reply, and the source text a
sandbox is sent. None of these needs namespaces."""

import builtins
import dis
import json
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest

from verl.sandbox import process
from verl.sandbox.programs import program_source, runner, seccomp, worker

LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
ALLOW, KILL, EPERM = 0x7FFF0000, 0x80000000, 0x00050001
X86_64 = 0xC000003E


def instructions(spec):
    program, filters = seccomp.seccomp_program(spec)
    assert program.len == len(filters)
    return [(f.code, f.jt, f.jf, f.k) for f in filters]


def test_the_filter_for_a_tiny_spec():
    # (code, jump if true, jump if false, k); a jump skips that many instructions
    assert instructions({"arch": X86_64, "denied": [250], "fcntl": 72, "locks": [6]}) == [
        (LD, 0, 0, 4),              # 0: the architecture
        (JEQ, 0, 10, X86_64),       # 1: another one: to 12, kill
        (LD, 0, 0, 0),              # 2: the system call number
        (JGE, 7, 0, 0x40000000),    # 3: x32: to 11, deny
        (JEQ, 6, 0, 250),           # 4: denied: to 11
        (JEQ, 1, 0, 72),            # 5: fcntl: to 7
        (RET, 0, 0, ALLOW),         # 6: anything else
        (LD, 0, 0, 24),             # 7: fcntl's command
        (JEQ, 2, 0, 6),             # 8: F_SETLK: to 11
        (RET, 0, 0, ALLOW),         # 9: another command
        (RET, 0, 0, ALLOW),         # 10: "allow" (no socket rule jumps here)
        (RET, 0, 0, EPERM),         # 11: "deny"
        (RET, 0, 0, KILL),          # 12: "kill"
    ]


def test_the_filter_allows_sockets_only_of_the_listed_families():
    spec = {"arch": X86_64, "denied": [], "fcntl": 72, "locks": [], "socket": 41, "families": [1, 2]}
    assert instructions(spec) == [
        (LD, 0, 0, 4),
        (JEQ, 0, 13, X86_64),       # 1: to 15, kill
        (LD, 0, 0, 0),
        (JGE, 10, 0, 0x40000000),   # 3: to 14, deny
        (JEQ, 2, 0, 72),            # 4: fcntl: to 7
        (JEQ, 3, 0, 41),            # 5: socket: to 9
        (RET, 0, 0, ALLOW),
        (LD, 0, 0, 24),             # 7: fcntl, with no command refused
        (RET, 0, 0, ALLOW),
        (LD, 0, 0, 16),             # 9: socket's address family
        (JEQ, 2, 0, 1),             # 10: AF_UNIX: to 13, allow
        (JEQ, 1, 0, 2),             # 11: AF_INET: to 13
        (RET, 0, 0, EPERM),         # 12: any other family
        (RET, 0, 0, ALLOW),         # 13
        (RET, 0, 0, EPERM),         # 14
        (RET, 0, 0, KILL),          # 15
    ]


def test_a_filter_whose_jumps_do_not_fit_in_a_byte_is_refused():
    with pytest.raises(AssertionError):
        seccomp.seccomp_program({"arch": X86_64, "denied": list(range(1000, 1300)), "fcntl": 72, "locks": []})


# Run as a sandboxed program is: seccomp.py's text, then this, in an isolated interpreter.
FILTERED_CHILD = r'''
import errno, fcntl, json, socket, sys, tempfile
spec = json.loads(sys.argv[1])
if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: an unprivileged process may then add a filter
    raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
lock_file = tempfile.TemporaryFile()
install_seccomp(seccomp_program(spec))
results = {}
for name, attempt in (("flock", lambda: fcntl.flock(lock_file, fcntl.LOCK_EX)),
                      ("lockf", lambda: fcntl.lockf(lock_file, fcntl.LOCK_EX)),
                      ("getfl", lambda: fcntl.fcntl(lock_file, fcntl.F_GETFL)),
                      ("unix", lambda: socket.socket(socket.AF_UNIX).close()),
                      ("inet", lambda: socket.socket(socket.AF_INET).close())):
    try:
        attempt()
        results[name] = "ok"
    except OSError as exc:
        results[name] = errno.errorcode[exc.errno]
print(json.dumps(results))
'''


def run_filtered(spec) -> subprocess.CompletedProcess:
    source = Path(seccomp.__file__).read_text(encoding="utf-8") + FILTERED_CHILD
    return subprocess.run([sys.executable, "-I", "-S", "-c", source, json.dumps(spec)], capture_output=True,
                          text=True, timeout=30)


@pytest.mark.skipif(process._machine() not in process._SECCOMP_ARCH, reason="no seccomp numbers for this machine")
def test_the_installed_filter_refuses_what_it_lists_and_allows_the_rest():
    result = run_filtered(process._seccomp(["flock"], socket_families=[1]))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"flock": "EPERM", "lockf": "EPERM", "getfl": "ok", "unix": "ok",
                                         "inet": "EPERM"}


@pytest.mark.skipif(process._machine() not in process._SECCOMP_ARCH, reason="no seccomp numbers for this machine")
def test_the_installed_filter_kills_a_process_of_another_architecture():
    result = run_filtered({**process._seccomp([]), "arch": 0x40000003})  # i386's: nothing here matches it
    assert result.returncode == -signal.SIGSYS and result.stdout == ""


def nested(levels):
    value = 0
    for _ in range(levels):
        value = [value]
    return value


def test_depth_counts_the_levels_of_a_value():
    assert worker.depth(1) == 1
    assert worker.depth([]) == worker.depth({}) == 1
    assert worker.depth([1, 2]) == 2
    assert worker.depth({"a": [1, {"b": 2}], "c": 3}) == 4  # the dict, its list, the inner dict, 2
    assert worker.depth(nested(5)) == 6


def test_depth_stops_counting_past_its_limit():
    assert worker.depth(nested(5), limit=3) == 4
    assert worker.depth(nested(1000)) == 65


def test_check_remakes_an_ok_or_an_error_reply():
    assert worker.check(b'{"status": "ok", "value": [1, "a"]}') == {"status": "ok", "value": [1, "a"]}
    assert worker.check(b'{"status": "ok", "value": null}') == {"status": "ok", "value": None}
    # only status and value survive: the id is the worker's to set
    assert worker.check(b'{"status": "ok", "value": 3, "id": 99, "x": 1}') == {"status": "ok", "value": 3}
    assert worker.check(b'{"status": "error", "error": "ValueError: no"}') == {"status": "error",
                                                                             "error": "ValueError: no"}
    long = json.dumps({"status": "error", "error": "e" * 3000}).encode()
    assert worker.check(long) == {"status": "error", "error": "e" * 2000}


def test_check_accepts_a_value_64_levels_deep_and_no_deeper():
    ok = json.dumps({"status": "ok", "value": nested(63)}).encode()
    assert worker.check(ok) == {"status": "ok", "value": nested(63)}
    assert worker.check(json.dumps({"status": "ok", "value": nested(64)}).encode()) is None


@pytest.mark.parametrize("data", [
    b'{"status": "ok"}',                          # no value
    b'{"status": "error", "error": 3}',           # an error that is not a message
    b'{"status": "error"}',
    b'{"status": "timeout"}',                     # a status only the worker gives
    b'{"status": "crashed", "error": "x"}',
    b'[{"status": "ok", "value": 1}]',            # not an object
    b'{"status": "ok", "value": 1',               # cut short
    b"",
    b"\xff\xfe",                                  # not text
    b"[" * 100_000 + b"]" * 100_000,              # too deep for the decoder
])
def test_check_rejects_a_malformed_reply(data):
    assert worker.check(data) is None


def test_children_of_finds_a_process_started_here():
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in worker.children_of(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert child.pid not in worker.children_of(os.getpid())


def test_a_program_is_seccomp_py_then_its_own_module():
    for name, module in (("runner", runner), ("worker", worker)):
        source = program_source(name)
        assert source.startswith(Path(seccomp.__file__).read_text(encoding="utf-8"))
        assert source.endswith(Path(module.__file__).read_text(encoding="utf-8"))
    assert process._RUNNER == program_source("runner")


def test_importing_the_programs_does_nothing():
    # the helpers come from .seccomp; the worker's state exists only once its main() runs
    assert runner.install_seccomp is seccomp.install_seccomp and worker.libc is seccomp.libc
    assert not hasattr(worker, "setup") and not hasattr(worker, "me")


@pytest.mark.parametrize("name", ["runner", "worker"])
def test_each_program_defines_every_global_it_reads(name):
    """The sent text runs with nothing of this package: every global its code reads is defined in it (at the top
    or by main's ``global`` statement) or is a builtin."""
    code = compile(program_source(name), f"<{name}>", "exec")
    namespace = {"__name__": "not_main", "__package__": None}  # run as a program, but main() not called
    exec(code, namespace)
    read, assigned = set(), set()

    def walk(code):
        for instruction in dis.get_instructions(code):
            if instruction.opname == "LOAD_GLOBAL":
                read.add(instruction.argval)
            elif instruction.opname == "STORE_GLOBAL":
                assigned.add(instruction.argval)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)

    walk(code)
    assert read, "found no global reads: dis changed?"
    assert read - set(namespace) - assigned - set(dir(builtins)) == set()
