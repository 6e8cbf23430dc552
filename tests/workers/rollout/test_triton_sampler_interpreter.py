"""The Triton sampler's kernels on a CPU, through Triton's interpreter (subprocesses: the interpreter is
chosen when the kernels are defined, and must not leak into GPU tests of the same session)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (make test installs it on Linux x86-64)")

ROOT = Path(__file__).resolve().parents[3]
# The interpreter runs on one core: two processes of about equal length, side by side, use a second one.
GROUPS = (["random_rows"], ["hand_worked", "signed_zeros", "frequencies_and_seeds"])


def test_sampler_kernels_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    script = Path(__file__).with_name("triton_sampler_checks.py")
    procs = [subprocess.Popen([sys.executable, "-W", "ignore::RuntimeWarning", str(script), *group], env=env,
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for group in GROUPS]
    try:
        for group, proc in zip(GROUPS, procs):
            out, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, out + err
            assert [line.split(":")[0] for line in out.splitlines() if ": ok" in line] == group, out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
