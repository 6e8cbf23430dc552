import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.image import imread

from verl.utils.plot import (
    PANEL_NAMES,
    MetricsFileError,
    load_metrics,
    main,
    overview_figure,
    plan_panels,
    plot_metrics,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _train_data(step: int) -> dict:
    return {
        "critic/score/mean": 0.1 * step, "critic/score/min": 0.0, "critic/score/max": 1.0,
        "critic/rewards/mean": 0.1 * step - 0.01,
        "response_length/mean": 50.0 + step, "response_length/min": 10.0, "response_length/max": 128.0,
        "response_length/clip_ratio": 0.01 * step,
        "actor/ppo_kl": 1e-3, "actor/kl_loss": 1e-3 * step, "actor/entropy": 1.0 - 0.05 * step,
        "actor/pg_loss": 0.01, "critic/vf_loss": 1.0 / step, "perf/throughput": 1000.0 + step,
        "timing_s/gen": 1.0, "timing_s/update_actor": 0.5, "timing_s/agent_loop/generate": 0.7,
        "timing_s/step": 2.0, "training/epoch": 0,
    }


def _write_jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def run_dir(tmp_path):
    """A run dir as the file logger leaves it: a validation-only record at step 0, val at step 2 and 4,
    a NaN entropy, and a resume that rewrote step 3."""
    lines = [json.dumps({"step": 0, "data": {"val-core/gsm8k/acc/mean@1": 0.1}})]
    for step in (1, 2, 3):
        lines.append(json.dumps({"step": step, "data": _train_data(step)}))
    lines.append(json.dumps({"step": 2, "data": {"val-core/gsm8k/acc/mean@1": 0.3}}))
    # Resumed from the step-2 checkpoint: step 3 again, then 4.
    resumed = dict(_train_data(3), **{"critic/score/mean": 0.99, "actor/entropy": math.nan})
    lines.append(json.dumps({"step": 3, "data": resumed}))
    lines.append(json.dumps({"step": 4, "data": dict(_train_data(4), **{"val-core/gsm8k/acc/mean@1": 0.5})}))
    log_dir = tmp_path / "run" / "logs" / "proj"
    log_dir.mkdir(parents=True)
    _write_jsonl(log_dir / "exp.jsonl", lines)
    # A rollout dump in the same run: not metric records, passed over.
    _write_jsonl(tmp_path / "run" / "1.jsonl", [json.dumps({"prompt": "p", "response": "r", "step": 1})])
    return tmp_path / "run"


def test_load_metrics_merges_and_deduplicates(run_dir):
    metrics = load_metrics(run_dir)
    assert list(metrics) == [0, 1, 2, 3, 4]
    assert metrics[0] == {"val-core/gsm8k/acc/mean@1": 0.1}
    assert metrics[2]["val-core/gsm8k/acc/mean@1"] == 0.3  # validation record joined the train record
    assert metrics[2]["critic/score/mean"] == pytest.approx(0.2)
    assert metrics[3]["critic/score/mean"] == 0.99  # the resumed run's rewrite wins
    assert math.isnan(metrics[3]["actor/entropy"])
    assert load_metrics(run_dir / "logs" / "proj" / "exp.jsonl") == metrics


def test_later_files_win(tmp_path):
    old = _write_jsonl(tmp_path / "a.jsonl", [json.dumps({"step": 1, "data": {"m": 1.0, "n": 5.0}})])
    new = _write_jsonl(tmp_path / "b.jsonl", [json.dumps({"step": 1, "data": {"m": 2.0}}),
                                              json.dumps({"step": 2, "data": {"m": 3.0}})])
    os.utime(old, (1_000_000, 1_000_000))
    os.utime(new, (2_000_000, 2_000_000))
    assert load_metrics(tmp_path) == {1: {"m": 2.0, "n": 5.0}, 2: {"m": 3.0}}


def test_plot_run_dir_writes_every_panel(run_dir, tmp_path, capsys):
    out = tmp_path / "plots"
    assert main([str(run_dir), "--out", str(out), "--title", "demo"]) == 0
    stdout = capsys.readouterr().out
    assert "skipped" not in stdout
    expected = ["overview", *PANEL_NAMES]
    assert sorted(os.listdir(out)) == sorted(f"{name}.png" for name in expected)
    for name in expected:
        path = out / f"{name}.png"
        assert str(path) in stdout
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        height, width, _ = imread(path).shape
        assert width >= 600 and height >= 350
    _, overview_width, _ = imread(out / "overview.png").shape
    assert overview_width > imread(out / "reward.png").shape[1]  # a two-column grid


def test_overview_panels_and_twin_axes(run_dir):
    fig = overview_figure(load_metrics(run_dir))
    labels = [ax.get_label() for ax in fig.axes]
    assert [label for label in labels if label in PANEL_NAMES] == list(PANEL_NAMES)
    assert sorted(label for label in labels if label.endswith("/twin")) == ["loss/twin", "response_length/twin"]
    timing = fig.axes[labels.index("timing")]
    legend = [t.get_text() for t in timing.get_legend().get_texts()]
    # Nested stages (agent_loop/*) are part of a stacked stage, and the step time is the line.
    assert legend == ["timing_s/gen", "timing_s/update_actor", "timing_s/step"]


def test_missing_metrics_skip_panels(tmp_path, capsys):
    path = _write_jsonl(tmp_path / "m.jsonl", [
        json.dumps({"step": s, "data": {"critic/score/mean": 0.1 * s, "actor/entropy": 1.0}}) for s in (1, 2, 3)])
    drawn, skipped = plan_panels(load_metrics(path))
    assert [p.name for p in drawn] == ["reward", "entropy"]
    assert set(skipped) == set(PANEL_NAMES) - {"reward", "entropy"}

    assert main([str(path)]) == 0
    stdout = capsys.readouterr().out
    assert "skipped panels without data: val_accuracy (no val-core/*); response_length" in stdout
    assert sorted(os.listdir(tmp_path / "m_plots")) == ["entropy.png", "overview.png", "reward.png"]
    labels = [ax.get_label() for ax in overview_figure(load_metrics(path)).axes]
    assert labels == ["reward", "entropy"]


def test_plot_metrics_in_process_is_deterministic(tmp_path):
    records = [{"step": s, "data": {"critic/score/mean": 0.1 * s, "timing_s/gen": 1.0, "label": "x"}}
               for s in (1, 2, 3)]
    first = plot_metrics(records, tmp_path / "a", title="t")
    second = plot_metrics({r["step"]: r["data"] for r in records}, tmp_path / "b", title="t")
    assert [os.path.basename(p) for p in first] == ["overview.png", "reward.png", "timing.png"]
    for a, b in zip(first, second):
        assert Path(a).read_bytes() == Path(b).read_bytes()


def test_no_plottable_metrics(tmp_path):
    with pytest.raises(MetricsFileError, match="none of the plotted metrics.*custom/metric"):
        plot_metrics({1: {"custom/metric": 1.0}}, tmp_path / "out")


def test_errors(tmp_path, capsys):
    bad = _write_jsonl(tmp_path / "bad.jsonl", [json.dumps({"step": 1, "data": {"m": 1.0}}), "{not json"])
    assert main([str(bad)]) == 1
    assert f"{bad}:2: not valid JSON" in capsys.readouterr().err

    shape = _write_jsonl(tmp_path / "shape.jsonl", [json.dumps({"step": "one", "data": {}})])
    with pytest.raises(MetricsFileError, match=r"shape.jsonl:1: expected an object"):
        load_metrics(shape)

    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    assert main([str(empty_dir)]) == 1
    assert "no metric records found" in capsys.readouterr().err

    empty = _write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(MetricsFileError, match="no metric records"):
        load_metrics(empty)


def test_missing_path_message(tmp_path, capsys):
    assert main([str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: metrics path") and "does not exist" in err


def test_torn_last_line_is_ignored(tmp_path, capsys):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"step": 1, "data": {"m": 1.0}}) + '\n{"step": 2, "da', encoding="utf-8")
    assert load_metrics(path) == {1: {"m": 1.0}}
    assert "incomplete last line 2" in capsys.readouterr().err


def test_module_entry_point(tmp_path):
    path = _write_jsonl(tmp_path / "m.jsonl", [json.dumps({"step": 1, "data": {"actor/entropy": 1.0}})])
    out = tmp_path / "cli"
    result = subprocess.run([sys.executable, "-m", "verl.utils.plot", str(path), "--out", str(out)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert (out / "overview.png").read_bytes()[:8] == PNG_SIGNATURE
    result = subprocess.run([sys.executable, "-m", "verl.utils.plot", str(tmp_path / "nope")],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1 and "does not exist" in result.stderr
