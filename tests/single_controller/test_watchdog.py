"""The watchdog stops the processes a driver started when the driver is killed without cleaning up
(kill -9): plain helper processes, and the Ray helpers a local ray.init() starts."""

import os
import signal
import subprocess
import sys
import time

import pytest

from verl.single_controller.watchdog import _stat

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc (Linux)")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def alive(pids):
    return [pid for pid, start in pids if (stat := _stat(pid)) is not None and stat[1] == start]


def start_driver(code: str):
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": REPO}, cwd=REPO)
    line = driver.stdout.readline()
    assert line.startswith("PIDS "), line
    return driver, [tuple(map(int, p.split(":"))) for p in line.split()[1:]]


def wait_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


def test_helpers_of_a_killed_driver_are_stopped():
    # The helpers run in sessions of their own, as daemons do: the driver's death alone leaves them running.
    driver, helpers = start_driver(
        "import subprocess, sys, time\n"
        "from verl.single_controller.watchdog import descendants, guard\n"
        "kids = [subprocess.Popen(['sleep', '600'], start_new_session=True) for _ in range(2)]\n"
        "watchdog = guard()\n"
        "print('PIDS', *[f'{p}:{s}' for p, s in descendants(__import__('os').getpid()) "
        "if p != watchdog.pid], flush=True)\n"
        "time.sleep(600)\n")
    assert len(helpers) == 2 and alive(helpers) == [p for p, _ in helpers]
    time.sleep(0.5)
    assert alive(helpers)  # the watchdog waits while the driver lives
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert wait_gone(helpers, 10) == []


def test_a_pid_reused_by_another_process_is_left_alone():
    from verl.single_controller.watchdog import _stop

    other = subprocess.Popen(["sleep", "600"])
    try:
        start = _stat(other.pid)[1]
        _stop([(other.pid, start + 1)], grace_s=0.2)  # same pid, another start time: not ours
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_ray_helpers_of_a_killed_driver_are_stopped():
    pytest.importorskip("ray")
    driver, helpers = start_driver(
        "import os, time\n"
        "from verl.single_controller.ray import init_ray, _WATCHDOGS\n"
        "from verl.single_controller.watchdog import descendants\n"
        "init_ray({'ray_init': {'num_cpus': 1}}, device='cpu')\n"
        "skip = {w.pid for w in _WATCHDOGS if w}\n"
        "print('PIDS', *[f'{p}:{s}' for p, s in descendants(os.getpid()) if p not in skip], flush=True)\n"
        "time.sleep(600)\n")
    assert len(helpers) >= 3  # gcs, raylet, agents, ...
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    # Without the watchdog Ray 2.60's dashboard and runtime-env agents were still running a minute later.
    assert wait_gone(helpers, 30) == []
