"""The transformers floor: one number, declared to pip and enforced when verl.models is imported."""

import pathlib
import re

import pytest

from verl.utils.versions import MIN_TRANSFORMERS, installed_transformers, require_transformers

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("installed", ["5.17.0", "5.17.1", "5.25.0", "6.0", "5.17", "5.20.0+cpu", "5.18.0rc1"])
def test_releases_from_the_floor_up_are_accepted(installed, monkeypatch):
    monkeypatch.setattr("verl.utils.versions.MIN_TRANSFORMERS", "5.17")
    require_transformers(installed)


@pytest.mark.parametrize("installed", ["4.57.6", "5.0.0", "5.16.1", "5.2.0", "5", "5.17.0rc1", "5.17.0.dev0"])
def test_older_releases_stop_with_the_upgrade_command(installed, monkeypatch):
    monkeypatch.setattr("verl.utils.versions.MIN_TRANSFORMERS", "5.17")
    with pytest.raises(ImportError, match=rf"transformers {re.escape(installed)} is installed; verl needs "
                                          r"transformers>=5\.17 .*pip install -U 'transformers>=5\.17'"):
        require_transformers(installed)


def test_pyproject_declares_the_same_floor():
    declared = re.findall(r'"transformers>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert declared == [MIN_TRANSFORMERS]


def test_the_installed_release_passes():
    require_transformers()  # this environment runs the suite: it must be one the floor admits


def test_the_version_is_read_from_the_package_an_import_loads():
    """Not from metadata: a transformers put first on PYTHONPATH without its .dist-info is the one that runs."""
    import transformers

    assert installed_transformers() == transformers.__version__
