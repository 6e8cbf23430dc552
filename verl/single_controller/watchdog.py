"""Clean-up of the helper processes a driver started, when the driver dies without cleaning up.

``ray.init()`` of a local instance starts Ray's processes as children of the driver. ``ray.shutdown()``
(at exit, Ctrl-C included) stops them, but a driver killed with ``kill -9`` (or by the OOM killer) never
runs it, and some of them (the dashboard and runtime-env agents of Ray 2.60, seen alive minutes later)
keep running, holding ports and memory. :func:`guard` starts a small watchdog process that holds the
read end of a pipe whose write end only the driver has: when the driver is gone, however it ended, the
read returns, and the watchdog stops the processes that were the driver's descendants when it was
guarded (and their descendants now), after checking each is still the same process (its start time),
so a reused pid is never touched. Linux only (``/proc``); elsewhere it does nothing.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

logger = logging.getLogger(__name__)

__all__ = ["descendants", "guard"]

_WATCHDOG_PIDS: set[int] = set()


def _stat(pid: int) -> tuple[int, int] | None:
    """``(parent pid, start time)`` of a process, or None when it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else (int(fields[1]), int(fields[19]))


def _parents() -> dict[int, int]:
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            table[int(name)] = stat[0]
    return table


def descendants(pid: int) -> list[tuple[int, int]]:
    """``(pid, start time)`` of every process below ``pid`` in the process tree."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, stack = [], list(children.get(pid, []))
    while stack:
        child = stack.pop()
        if (stat := _stat(child)) is not None:
            found.append((child, stat[1]))
            stack.extend(children.get(child, []))
    return found


def guard(pids: list[tuple[int, int]] | None = None) -> subprocess.Popen | None:
    """Start the watchdog of this process: ``pids`` (default: this process's descendants now) are
    stopped once this process has ended. Returns the watchdog process (None where there is no /proc)."""
    if not os.path.isdir("/proc"):
        return None
    pids = descendants(os.getpid()) if pids is None else pids
    pids = [(pid, start) for pid, start in pids if pid not in _WATCHDOG_PIDS]  # earlier watchdogs are not helpers
    if not pids:
        return None
    # Run as a plain script (standard library only): no package import, no torch, nothing to fail to import.
    watchdog = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                start_new_session=True, close_fds=True)
    _WATCHDOG_PIDS.add(watchdog.pid)
    watchdog.stdin.write((json.dumps(pids) + "\n").encode())
    watchdog.stdin.flush()  # the pipe stays open: its end-of-file is the driver's death
    return watchdog


def _stop(pids: list[tuple[int, int]], grace_s: float = 3.0) -> None:
    targets = []
    for pid, start in pids:
        stat = _stat(pid)
        if stat is not None and stat[1] == start:
            targets.append((pid, start))
            targets.extend(descendants(pid))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid, start in targets:
            stat = _stat(pid)
            if stat is not None and stat[1] == start:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(
                (stat := _stat(pid)) is not None and stat[1] == start for pid, start in targets):
            time.sleep(0.1)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the driver is not for the watchdog
    pids = [tuple(p) for p in json.loads(sys.stdin.readline() or "[]")]
    sys.stdin.read()  # returns when the driver has ended, whichever way
    _stop(pids)


if __name__ == "__main__":
    main()
