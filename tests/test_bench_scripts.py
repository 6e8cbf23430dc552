"""The benchmark scripts still import: they live outside the package and its tests, so a renamed or removed
function they use would otherwise go unnoticed until the next GPU session tries to run them."""

import importlib
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in (REPO / "bench").glob("*.py"))


def test_every_benchmark_is_listed():
    assert "rollout" in SCRIPTS and len(SCRIPTS) >= 10


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_imports(name, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    module = importlib.import_module(f"bench.{name}")
    assert callable(getattr(module, "main", None)), f"bench/{name}.py has no main()"
    sys.modules.pop(f"bench.{name}", None)
