import importlib.util
import json
import logging
import math
import sys
import types

import numpy as np
import pytest
import torch

from verl.utils.tracking import (
    BACKENDS,
    Tracking,
    TrackingBackendUnavailable,
    format_console_line,
    format_value,
    sanitize_mlflow_key,
)


@pytest.fixture(autouse=True)
def _no_logger_env(monkeypatch):
    for var in ("VERL_FILE_LOGGER_PATH", "VERL_FILE_LOGGER_ROOT", "TENSORBOARD_DIR"):
        monkeypatch.delenv(var, raising=False)


def test_format_value():
    assert format_value(3) == "3"
    assert format_value(12345.0) == "12345"
    assert format_value(0.5) == "0.5"
    assert format_value(0.012345) == "0.01235"
    assert format_value(12.3456) == "12.35"
    assert format_value(1.2e-5) == "1.2e-05"
    assert format_value(float("nan")) == "nan"
    assert format_value(True) == "True"
    assert format_value("text") == "text"


def test_console_line_order_and_format(capsys):
    tracker = Tracking("proj", "exp", "console")
    tracker.log({"timing_s/gen": 1.25, "actor/pg_loss": torch.tensor(0.012), "zeta": 2,
                 "critic/score/mean": np.float32(0.5), "alpha": 0.1}, step=3)
    tracker.finish()
    out = capsys.readouterr()
    assert out.out == ("step:3 - critic/score/mean:0.5 - actor/pg_loss:0.012 - alpha:0.1 - "
                       "timing_s/gen:1.25 - zeta:2\n")
    assert out.err == ""  # no progress bar without a total


def test_console_priority_prefix():
    line = format_console_line({"b": 1, "val-core/x/acc/mean@1": 0.5, "training/epoch": 0}, step=0)
    assert line == "step:0 - training/epoch:0 - val-core/x/acc/mean@1:0.5 - b:1"


def test_console_progress_bar_does_not_garble_lines(capsys):
    tracker = Tracking("proj", "exp", ["console"], total_steps=3)
    for step in (1, 2, 3):
        tracker.log({"m": step / 10}, step=step)
    tracker.finish()
    out = capsys.readouterr()
    assert out.out.splitlines() == ["step:1 - m:0.1", "step:2 - m:0.2", "step:3 - m:0.3"]
    assert "Training Progress" in out.err and "3/3" in out.err

    tracker = Tracking("proj", "exp", "console")
    tracker.set_total_steps(4)
    tracker.log({"m": 1}, step=1)
    tracker.finish()
    assert "1/4" in capsys.readouterr().err


def test_file_backend_jsonl_flushed_per_line(tmp_path, capsys):
    tracker = Tracking("proj", "exp", ["file"], output_dir=str(tmp_path))
    path = tmp_path / "proj" / "exp.jsonl"
    assert str(path) in capsys.readouterr().out  # the path is printed once

    tracker.log({"a": 1.5, "t": torch.tensor(2.0), "n": np.int64(7), "bad": float("nan")}, step=1)
    lines = path.read_text().splitlines()  # read while the tracker is still open
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["step"] == 1
    assert record["data"]["a"] == 1.5 and record["data"]["t"] == 2.0 and record["data"]["n"] == 7
    assert math.isnan(record["data"]["bad"])

    tracker.log({"a": 2.5}, step=2)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]
    tracker.finish()
    tracker.finish()  # idempotent

    again = Tracking("proj", "exp", "file", output_dir=str(tmp_path))  # appends on resume
    again.log({"a": 3.0}, step=3)
    again.finish()
    assert len(path.read_text().splitlines()) == 3


def test_resuming_drops_the_lines_of_steps_after_the_checkpoint(tmp_path):
    tracker = Tracking("proj", "exp", ["console", "file"], output_dir=str(tmp_path))
    for step in (1, 2, 3, 4):  # the run checkpointed step 2, then died after logging 3 and 4
        tracker.log({"a": float(step)}, step=step)
    tracker.finish()
    path = tmp_path / "proj" / "exp.jsonl"
    resumed = Tracking("proj", "exp", ["console", "file"], output_dir=str(tmp_path))
    resumed.resumed_at(2)
    resumed.log({"a": 30.0}, step=3)
    resumed.finish()
    records = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(r["step"], r["data"]["a"]) for r in records] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_file_backend_env_paths(tmp_path, monkeypatch):
    target = tmp_path / "exact" / "m.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(target))
    with Tracking("p", "e", "file") as tracker:
        tracker.log({"x": 1}, step=0)
    assert json.loads(target.read_text()) == {"step": 0, "data": {"x": 1}}

    monkeypatch.delenv("VERL_FILE_LOGGER_PATH")
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path / "root"))
    with Tracking("p", "e", "file", output_dir=str(tmp_path / "ignored")) as tracker:
        tracker.log({"x": 1}, step=0)
    assert (tmp_path / "root" / "p" / "e.jsonl").exists()


def test_unknown_backend_is_rejected_before_anything_is_created(tmp_path):
    with pytest.raises(ValueError) as err:
        Tracking("p", "e", ["file", "swanlab"], output_dir=str(tmp_path))
    for name in BACKENDS:
        assert name in str(err.value)
    assert "swanlab" in str(err.value)
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("backend,modules", [
    ("wandb", ["wandb"]),
    ("mlflow", ["mlflow"]),
    ("tensorboard", ["tensorboard", "torch.utils.tensorboard"]),
])
def test_missing_package_error(backend, modules, monkeypatch, tmp_path):
    # None in sys.modules makes the import fail even where the package is installed
    monkeypatch.setitem(sys.modules, modules[0], None)
    for extra in modules[1:]:
        monkeypatch.delitem(sys.modules, extra, raising=False)
    with pytest.raises(TrackingBackendUnavailable) as err:
        Tracking("p", "e", ["file", backend], output_dir=str(tmp_path))
    message = str(err.value)
    assert isinstance(err.value, ImportError)
    assert f"pip install {modules[0]}" in message and "trainer.logger" in message and backend in message


@pytest.mark.parametrize("backend", ["wandb", "mlflow", "tensorboard"])
def test_missing_package_error_real_environment(backend, tmp_path):
    if importlib.util.find_spec(backend) is not None:
        pytest.skip(f"{backend} is installed here")
    with pytest.raises(TrackingBackendUnavailable, match=f"pip install {backend}"):
        Tracking("p", "e", backend, output_dir=str(tmp_path))


def test_wandb_backend_with_a_stub(monkeypatch):
    calls = []
    stub = types.SimpleNamespace(
        init=lambda **kw: calls.append(("init", kw)),
        log=lambda data, step: calls.append(("log", data, step)),
        finish=lambda exit_code: calls.append(("finish", exit_code)),
    )
    monkeypatch.setitem(sys.modules, "wandb", stub)
    tracker = Tracking("proj", "exp", "wandb", config={"lr": 1e-6})
    tracker.log({"x": torch.tensor(1.0)}, step=5)
    tracker.finish()
    assert calls == [("init", {"project": "proj", "name": "exp", "config": {"lr": 1e-6}}),
                     ("log", {"x": 1.0}, 5), ("finish", 0)]


def test_mlflow_key_sanitising():
    assert sanitize_mlflow_key("val-core/gsm8k/acc/mean@4") == "val-core/gsm8k/acc/mean_at_4"
    assert sanitize_mlflow_key("a:b(c)") == "a:b_c_"  # ':' is allowed, brackets are not
    assert sanitize_mlflow_key("timing_s//gen///x") == "timing_s/gen/x"  # repeated slashes: one
    assert sanitize_mlflow_key("acc@k=8, n/a") == "acc_at_k_8_ n/a"
    assert sanitize_mlflow_key("perf/mfu/actor") == "perf/mfu/actor"
    assert sanitize_mlflow_key("μ/loss") == "μ/loss"  # word characters of any script, as MLflow's own check


def test_mlflow_logs_sanitised_names_and_warns_once_per_renamed_key(monkeypatch, caplog):
    calls = []
    stub = types.SimpleNamespace(
        set_tracking_uri=lambda uri: None, set_experiment=lambda name: None,
        start_run=lambda run_name: None, log_params=lambda params: None, end_run=lambda: None,
        log_metrics=lambda metrics, step: calls.append((metrics, step)))
    monkeypatch.setitem(sys.modules, "mlflow", stub)
    tracker = Tracking("proj", "exp", "mlflow")
    with caplog.at_level(logging.WARNING):
        tracker.log({"val//acc@4": 0.5, "loss": 1.0}, step=1)
        tracker.log({"val//acc@4": 0.75}, step=2)
    tracker.finish()
    assert calls == [({"val/acc_at_4": 0.5, "loss": 1.0}, 1), ({"val/acc_at_4": 0.75}, 2)]
    renamed = [r.getMessage() for r in caplog.records if "[MLflow]" in r.getMessage()]
    assert renamed == ["[MLflow] metric 'val//acc@4' is logged as 'val/acc_at_4': MLflow does not accept its "
                       "characters"]
