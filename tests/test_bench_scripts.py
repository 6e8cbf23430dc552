"""The benchmark scripts still run: they live outside the package and its tests, so a renamed function or a
changed signature they use would otherwise go unnoticed until the next GPU session tries to run them. Every
script is imported; the cheap ones also run their CPU dry run (``--quick``) end to end."""

import importlib
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in (REPO / "bench").glob("*.py"))
QUICK_RUNS = ["agent_loop", "lora", "rollout", "train_step"]  # ~5-12 s each on two cores


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_imports(name, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    module = importlib.import_module(f"bench.{name}")
    assert callable(getattr(module, "main", None)), f"bench/{name}.py has no main()"
    sys.modules.pop(f"bench.{name}", None)


@pytest.mark.slow
@pytest.mark.parametrize("name", QUICK_RUNS)
def test_benchmark_quick_run(name, tmp_path):
    assert name in SCRIPTS
    done = subprocess.run([sys.executable, str(REPO / "bench" / f"{name}.py"), "--quick"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"bench/{name}.py --quick failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
