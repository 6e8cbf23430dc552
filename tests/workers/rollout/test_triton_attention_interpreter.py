"""The native engine's fused decode attention on a CPU, through Triton's interpreter (a subprocess: the
interpreter is chosen when the kernels are defined, and must not leak into GPU tests of the same session)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (make test installs it on Linux x86-64)")

ROOT = Path(__file__).resolve().parents[3]


def test_decode_attention_kernel_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    script = Path(__file__).with_name("triton_attention_checks.py")
    done = subprocess.run([sys.executable, "-W", "ignore::RuntimeWarning", str(script)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": ok") == 9, done.stdout
