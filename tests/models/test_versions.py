"""The transformers floor: one number, declared to pip and enforced when verl.models is imported."""

import pathlib
import re

import pytest

from verl.models.versions import MIN_TRANSFORMERS, require_transformers

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("installed", ["5.17.0", "5.17.1", "5.25.0", "6.0", "5.17"])
def test_releases_from_the_floor_up_are_accepted(installed, monkeypatch):
    monkeypatch.setattr("verl.models.versions.MIN_TRANSFORMERS", "5.17")
    require_transformers(installed)


@pytest.mark.parametrize("installed", ["4.57.6", "5.0.0", "5.16.1", "5.2.0", "5"])
def test_older_releases_stop_with_the_upgrade_command(installed, monkeypatch):
    monkeypatch.setattr("verl.models.versions.MIN_TRANSFORMERS", "5.17")
    with pytest.raises(ImportError, match=rf"transformers {re.escape(installed)} is installed; verl needs "
                                          r"transformers>=5\.17 .*pip install -U 'transformers>=5\.17'"):
        require_transformers(installed)


def test_pyproject_declares_the_same_floor():
    declared = re.findall(r'"transformers>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert declared == [MIN_TRANSFORMERS]


def test_the_installed_release_passes():
    require_transformers()  # this environment runs the suite: it must be one the floor admits
