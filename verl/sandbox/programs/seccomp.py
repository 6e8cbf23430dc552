"""Builds and installs a classic-BPF seccomp filter in a sandboxed process: another architecture (i386 through
int 0x80 too) is killed; x32 system calls, the ``denied`` ones and the listed fcntl commands get EPERM; the
rest is allowed. The head of every program a sandbox runs (see :mod:`verl.sandbox.programs`); the host builds
the spec (``_seccomp`` in :mod:`verl.sandbox.process`).
"""

import ctypes

libc = ctypes.CDLL(None, use_errno=True)


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def seccomp_program(spec):
    """The filter for ``spec`` (``arch``, ``denied`` system call numbers, ``fcntl`` and the ``locks`` commands
    it refuses; optionally ``socket`` and the address ``families`` it allows): the program to install and the
    instructions it points to."""
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
