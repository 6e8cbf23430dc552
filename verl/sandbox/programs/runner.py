"""Runs inside the namespaces as their root (pid 1): builds the new root, chroots, sets the limits and runs the
code as its child, then exits with the child's status (128 + signal when it was killed). Run after seccomp.py's
text as ``python -I -S -c <source> <json config>`` (see :mod:`verl.sandbox.programs`).
"""

import ctypes
import json
import os
import resource
import shutil
import sys

if __package__:  # imported on the host; run as a program, seccomp.py's text comes first
    from .seccomp import install_seccomp, libc, seccomp_program

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18


def mount(source, target, fstype, flags, data=None):
    def enc(s):
        return None if s is None else s.encode()
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


def main():
    cfg = json.loads(sys.argv[1])
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
    with open("/proc/sys/kernel/cap_last_cap") as f:
        CAP_LAST = int(f.read())
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
                             (resource.RLIMIT_FSIZE, (cfg["fsize"],) * 2),
                             (resource.RLIMIT_NOFILE, (cfg["nofile"],) * 2),
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


if __name__ == "__main__":
    main()
