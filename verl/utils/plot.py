"""PNG figures of a run's key curves, read from the ``file`` logger's JSON Lines: no tracking server needed.

    python -m verl.utils.plot <run dir | metrics.jsonl> [--out DIR] [--title TEXT]

writes ``overview.png`` (a grid with one panel per group of curves) and ``<panel>.png`` for each panel,
so a README can embed a single curve. Panels whose metrics are not in the run are skipped (and named
on stdout). The panels, in order:

- ``reward``: ``critic/score/mean`` with its min/max band, ``critic/rewards/mean``
- ``val_accuracy``: every ``val-core/*`` series but the ``/std`` ones, with markers (validation is sparse)
- ``response_length``: ``response_length/mean`` with its min/max band; ``response_length/clip_ratio``
  on a second y axis
- ``kl``: ``actor/ppo_kl``, ``actor/kl_loss``, ``actor/reward_kl_penalty``
- ``entropy``: ``actor/entropy``
- ``loss``: ``actor/pg_loss``; ``critic/vf_loss`` on a second y axis
- ``throughput``: ``perf/throughput``
- ``timing``: stacked bars of ``timing_s/<stage>`` per step, ``timing_s/step`` as a line over them

Input: a JSONL file of ``{"step": N, "data": {metric: value}}`` lines, or a run directory, searched
(two folder levels deep, e.g. ``logs/<project>/<experiment>.jsonl``) for ``*.jsonl`` files made of such
lines; files of other rows (rollout dumps) are passed over. Records that share a step are merged, the
later value of a metric winning, with files read oldest first: a resumed run's rewrite of a step replaces
the first attempt, and a validation-only record joins the training record of its step.

Figures are drawn with matplotlib's object API on the Agg canvas, so importing this module never
changes the pyplot backend of the caller (a notebook keeps its inline plots).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import numbers
import os
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

Metrics = dict[int, dict[str, float]]

OVERVIEW_NAME = "overview"
PANEL_SIZE_IN = (7.0, 4.0)  # one panel, in the overview grid and on its own
OVERVIEW_COLUMNS = 2
DPI = 100
MARKER_MAX_POINTS = 30  # fewer points than this: draw markers so a short run's points are visible
SEARCH_DEPTH = 2  # folder levels below a run dir searched for metric files


class MetricsFileError(ValueError):
    """A metrics path that holds no usable metric records, or a line that is not one."""


# ------------------------------------------------------------------------------------------------ loading
def _is_step_record(obj: Any) -> bool:
    return (isinstance(obj, dict) and isinstance(obj.get("step"), int) and not isinstance(obj["step"], bool)
            and isinstance(obj.get("data"), dict))


def _looks_like_metrics_file(path: Path) -> bool:
    """Whether the first non-blank line of ``path`` is a step record."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    return _is_step_record(json.loads(line))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return False


def metric_files(path: str | os.PathLike) -> list[Path]:
    """The metric JSONL files at ``path``: the file itself, or those found in a run directory
    (oldest first, then by name). Raises FileNotFoundError or :class:`MetricsFileError`."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"metrics path {str(path)!r} does not exist")
    if path.is_file():
        return [path]
    candidates = sorted(p for depth in range(SEARCH_DEPTH + 1)
                        for p in path.glob("/".join(["*"] * depth + ["*.jsonl"])) if p.is_file())
    found = [p for p in candidates if _looks_like_metrics_file(p)]
    if not found:
        seen = f" (passed over {len(candidates)} .jsonl file(s) of other rows)" if candidates else ""
        raise MetricsFileError(
            f"no metric records found in {str(path)!r}{seen}: expected *.jsonl files of "
            f'{{"step": N, "data": {{...}}}} lines in it or up to {SEARCH_DEPTH} folders below, as the file '
            f"logger writes with trainer.logger=[console,file]. Pass the .jsonl path directly if it is elsewhere.")
    return sorted(found, key=lambda p: (p.stat().st_mtime, str(p)))


def _numeric(data: Mapping[str, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in data.items() if isinstance(v, numbers.Number) and not isinstance(v, bool)}


def merge_records(records: Iterable[Mapping[str, Any]]) -> Metrics:
    """``{"step": N, "data": {...}}`` records -> ``{step: {metric: value}}`` sorted by step; records of
    one step are merged with later values winning; non-numeric values are dropped."""
    merged: Metrics = {}
    for record in records:
        merged.setdefault(int(record["step"]), {}).update(_numeric(record["data"]))
    return dict(sorted(merged.items()))


def _read_records(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    # The file logger ends every line with "\n"; a last line without one was cut off mid-write
    # (the run was killed), so it is dropped rather than failing the whole plot.
    torn = lines.pop() if lines else ""
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise MetricsFileError(f"{path}:{lineno}: not valid JSON ({e}): {line[:120]!r}") from None
        if not _is_step_record(obj):
            raise MetricsFileError(f'{path}:{lineno}: expected an object {{"step": <int>, "data": {{...}}}}, '
                                   f"got {line[:120]!r}")
        records.append(obj)
    if torn.strip():
        try:
            obj = json.loads(torn)
        except ValueError:
            obj = None
        if _is_step_record(obj):
            records.append(obj)
        else:
            print(f"[verl] plot: ignoring the incomplete last line {len(lines) + 1} of {path} "
                  f"(the run was probably stopped mid-write)", file=sys.stderr)
    return records


def load_metrics(path: str | os.PathLike) -> Metrics:
    """``{step: {metric: value}}`` (sorted by step) from a metrics JSONL file or a run directory;
    see the module docstring for how files are found and records merged."""
    records = [r for f in metric_files(path) for r in _read_records(f)]
    if not records:
        raise MetricsFileError(f"no metric records in {str(path)!r}: the file(s) hold no step lines yet")
    return merge_records(records)


# ------------------------------------------------------------------------------------------------- panels
class _Table:
    """Per-metric series of the run: only the steps where the metric was logged, non-finite as NaN."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        self._keys = {k for data in metrics.values() for k in data}
        self.keys = sorted(self._keys)

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def with_prefix(self, prefix: str) -> list[str]:
        return [k for k in self.keys if k.startswith(prefix)]

    def series(self, key: str, steps: Iterable[int] | None = None) -> tuple[list[int], list[float]]:
        steps = [s for s in self.metrics if key in self.metrics[s]] if steps is None else list(steps)
        values = [self.metrics[s].get(key, math.nan) for s in steps]
        return steps, [v if math.isfinite(v) else math.nan for v in values]


def _line(ax: Axes, table: _Table, key: str, markers: bool = False, **kwargs) -> list[str]:
    if key not in table:
        return []
    x, y = table.series(key)
    if markers or len(x) < MARKER_MAX_POINTS:
        kwargs.setdefault("marker", "o")
        kwargs.setdefault("markersize", 4 if markers else 3)
    ax.plot(x, y, label=key, **kwargs)
    return [key]


def _line_with_band(ax: Axes, table: _Table, key: str, low: str, high: str) -> list[str]:
    plotted = _line(ax, table, key)
    if plotted and low in table and high in table:
        x, _ = table.series(key)
        ax.fill_between(x, table.series(low, x)[1], table.series(high, x)[1], alpha=0.2,
                        color=ax.lines[-1].get_color(), linewidth=0, label=f"{low} .. {high.rsplit('/', 1)[-1]}")
        plotted[-1] += " (min-max band)"
    return plotted


def _second_axis(ax: Axes, table: _Table, key: str, ylabel: str) -> list[str]:
    """``key`` on a twin y axis when ``ax`` already has a curve (different scale), else on ``ax``."""
    if key not in table:
        return []
    if not ax.lines:
        ax.set_ylabel(ylabel)
        return _line(ax, table, key)
    twin = ax.twinx()
    twin.set_label(f"{ax.get_label()}/twin")
    twin.set_ylabel(ylabel)
    return _line(twin, table, key, color=f"C{len(ax.lines) + 2}", linestyle="--")


def _draw_reward(ax: Axes, table: _Table) -> list[str]:
    ax.set_ylabel("score / reward")
    return (_line_with_band(ax, table, "critic/score/mean", "critic/score/min", "critic/score/max")
            + _line(ax, table, "critic/rewards/mean"))


def _draw_lines(ylabel: str, *keys: str) -> Callable[[Axes, _Table], list[str]]:
    def draw(ax: Axes, table: _Table) -> list[str]:
        ax.set_ylabel(ylabel)
        return [k for key in keys for k in _line(ax, table, key)]
    return draw


def _draw_val_accuracy(ax: Axes, table: _Table) -> list[str]:
    ax.set_ylabel("accuracy")
    keys = [key for key in table.with_prefix("val-core/") if not key.endswith("/std")]  # spreads are not scores
    return [k for key in keys for k in _line(ax, table, key, markers=True)]


def _draw_response_length(ax: Axes, table: _Table) -> list[str]:
    ax.set_ylabel("tokens")
    return (_line_with_band(ax, table, "response_length/mean", "response_length/min", "response_length/max")
            + _second_axis(ax, table, "response_length/clip_ratio", "clip ratio"))


def _draw_loss(ax: Axes, table: _Table) -> list[str]:
    ax.set_ylabel("policy loss")
    return _line(ax, table, "actor/pg_loss") + _second_axis(ax, table, "critic/vf_loss", "value loss")


# Pipeline order of the trainer's stages (bottom of the stack first); other stages follow by name.
_STAGE_ORDER = ("gen", "gen_max", "reward", "old_log_prob", "ref", "values", "adv", "update_critic",
                "update_actor", "update_weights", "testing", "save_checkpoint")


def _timing_stages(table: _Table) -> list[str]:
    # Only top-level stages: nested entries (``timing_s/agent_loop/...``) are parts of a stage already stacked.
    stages = [k.removeprefix("timing_s/") for k in table.with_prefix("timing_s/")]
    stages = [s for s in stages if "/" not in s and s != "step"]
    rank = {name: i for i, name in enumerate(_STAGE_ORDER)}
    return sorted(stages, key=lambda s: (rank.get(s, len(rank)), s))


def _draw_timing(ax: Axes, table: _Table) -> list[str]:
    ax.set_ylabel("seconds")
    keys = [f"timing_s/{s}" for s in _timing_stages(table)]
    steps = [s for s, data in table.metrics.items() if any(k in data for k in keys)]
    gap = min((b - a for a, b in itertools.pairwise(steps)), default=1)
    half = (0.4 if len(steps) <= 50 else 0.5) * gap  # dense runs: touching bars read as an area
    bottom = [0.0] * len(steps)
    top = 0.0
    for i, key in enumerate(keys):
        height = [0.0 if math.isnan(v) else v for v in table.series(key, steps)[1]]
        # One collection of rectangles per stage: thousands of Rectangle artists (ax.bar) are slow.
        boxes = [[(s - half, b), (s - half, b + h), (s + half, b + h), (s + half, b)]
                 for s, b, h in zip(steps, bottom, height) if h > 0]
        ax.add_collection(PolyCollection(boxes, facecolor=f"C{i % 10}", hatch="//" if i >= 10 else None,
                                         linewidth=0, label=key))
        bottom = [b + h for b, h in zip(bottom, height)]
        top = max([top, *bottom])
    if steps:
        ax.update_datalim([(steps[0] - half, 0.0), (steps[-1] + half, top)])
        ax.autoscale_view()
    plotted = keys + _line(ax, table, "timing_s/step", color="black")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high + 0.35 * (high - low))  # headroom for the legend above the stack
    return plotted


@dataclass(frozen=True)
class Panel:
    name: str  # file stem of its own PNG
    title: str
    metrics: tuple[str, ...]  # it is drawn when one of these is logged; an entry ending in "/" is a prefix
    draw: Callable[[Axes, _Table], list[str]]  # draws; returns the plotted metrics, named for the title


PANELS = (
    Panel("reward", "Reward", ("critic/score/mean", "critic/rewards/mean"), _draw_reward),
    Panel("val_accuracy", "Validation accuracy", ("val-core/",), _draw_val_accuracy),
    Panel("response_length", "Response length", ("response_length/mean", "response_length/clip_ratio"),
          _draw_response_length),
    Panel("kl", "KL", _KL := ("actor/ppo_kl", "actor/kl_loss", "actor/reward_kl_penalty"), _draw_lines("KL", *_KL)),
    Panel("entropy", "Entropy", ("actor/entropy",), _draw_lines("entropy", "actor/entropy")),
    Panel("loss", "Loss", ("actor/pg_loss", "critic/vf_loss"), _draw_loss),
    Panel("throughput", "Throughput", ("perf/throughput",), _draw_lines("tokens / s / GPU", "perf/throughput")),
    Panel("timing", "Time per stage", ("timing_s/",), _draw_timing),
)
PANEL_NAMES = tuple(p.name for p in PANELS)


def _has_any(table: _Table, wanted: tuple[str, ...]) -> bool:
    return any(table.with_prefix(w) if w.endswith("/") else w in table for w in wanted)


def plan_panels(metrics: Metrics) -> tuple[list[Panel], dict[str, str]]:
    """The panels drawn for ``metrics``, and for each skipped panel the metrics it looked for."""
    table = _Table(metrics)
    drawn = [p for p in PANELS if _has_any(table, p.metrics)]
    skipped = {p.name: ", ".join(w + "*" if w.endswith("/") else w for w in p.metrics)
               for p in PANELS if p not in drawn}
    return drawn, skipped


def _title(panel: Panel, plotted: list[str]) -> str:
    names = plotted if len(plotted) <= 4 else plotted[:3] + [f"... (+{len(plotted) - 3} more)"]
    return panel.title + "\n" + textwrap.fill(", ".join(names), width=90)


def _draw_panel(ax: Axes, panel: Panel, table: _Table) -> None:
    ax.set_label(panel.name)
    plotted = panel.draw(ax, table)
    ax.set_title(_title(panel, plotted), fontsize=10)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    for twin in (a for a in ax.figure.axes if a.get_label() == f"{panel.name}/twin"):
        h, lab = twin.get_legend_handles_labels()
        handles += h
        labels += lab
        # The legend lives on ``ax``: raise it above the twin, with a see-through background.
        ax.set_zorder(twin.get_zorder() + 1)
        ax.patch.set_visible(False)
    ax.legend(handles, labels, fontsize="small", loc="best", framealpha=0.8,
              ncol=2 if len(labels) > 6 else 1)


def overview_figure(metrics: Metrics, title: str | None = None) -> Figure:
    """A grid of every panel that has data; each panel's main axes is labelled with its name."""
    panels, _ = plan_panels(metrics)
    if not panels:
        raise MetricsFileError(_no_panel_message(metrics))
    table = _Table(metrics)
    cols = min(OVERVIEW_COLUMNS, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(PANEL_SIZE_IN[0] * cols, PANEL_SIZE_IN[1] * rows + 0.5), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(rows, cols)
    for i, panel in enumerate(panels):
        _draw_panel(fig.add_subplot(grid[i // cols, i % cols]), panel, table)
    steps = list(metrics)
    fig.suptitle(f"{title or 'verl run'}: steps {steps[0]}-{steps[-1]}", fontsize=13)
    return fig


def _panel_figure(panel: Panel, table: _Table, title: str | None) -> Figure:
    fig = Figure(figsize=PANEL_SIZE_IN, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    _draw_panel(fig.add_subplot(), panel, table)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def _no_panel_message(metrics: Metrics) -> str:
    keys = sorted({k for data in metrics.values() for k in data})
    shown = ", ".join(keys[:10]) + (f", ... ({len(keys)} in all)" if len(keys) > 10 else "")
    return f"none of the plotted metrics were logged (the run has: {shown or 'no numeric metrics'})"


def _as_metrics(records_or_path: Any) -> Metrics:
    if isinstance(records_or_path, (str, os.PathLike)):
        return load_metrics(records_or_path)
    if isinstance(records_or_path, Mapping):
        return {int(step): _numeric(data) for step, data in sorted(records_or_path.items())}
    return merge_records(records_or_path)


def plot_metrics(records_or_path: Any, out_dir: str | os.PathLike, title: str | None = None) -> list[str]:
    """Write ``overview.png`` and one ``<panel>.png`` per panel with data into ``out_dir``.

    ``records_or_path``: a metrics JSONL file or run directory, ``{step: {metric: value}}`` (as
    :func:`load_metrics` returns), or an iterable of ``{"step": N, "data": {...}}`` records.
    Returns the written paths: the overview first, then the panels in :data:`PANELS` order (a panel's
    file stem is its name; :func:`plan_panels` says which were skipped and why).
    """
    metrics = _as_metrics(records_or_path)
    if not metrics:
        raise MetricsFileError("no metric records to plot")
    if title is None and isinstance(records_or_path, (str, os.PathLike)):
        path = Path(records_or_path).resolve()
        title = path.name if path.is_dir() else path.stem
    panels, _ = plan_panels(metrics)
    os.makedirs(out_dir, exist_ok=True)
    figures = [(OVERVIEW_NAME, overview_figure(metrics, title))]
    table = _Table(metrics)
    figures += [(panel.name, _panel_figure(panel, table, title)) for panel in panels]
    paths = [os.path.join(out_dir, f"{name}.png") for name, _ in figures]
    for path, (_, fig) in zip(paths, figures):
        fig.savefig(path, dpi=DPI)
    return paths


# ------------------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl.utils.plot",
        description="Write PNG figures (overview.png and one per panel) of a run's metrics, "
                    "read from the file logger's JSON Lines.")
    parser.add_argument("path", help="a run directory (searched for metric *.jsonl files) or a metrics .jsonl file")
    parser.add_argument("--out", help="output folder (default: <run dir>/plots, or <file stem>_plots next to "
                                      "the .jsonl file)")
    parser.add_argument("--title", help="figure title (default: the run directory's or file's name)")
    args = parser.parse_args(argv)

    path = Path(args.path)
    try:
        files = metric_files(path)
        metrics = load_metrics(path)
        _, skipped = plan_panels(metrics)
        print(f"[verl] plot: {len(metrics)} steps ({min(metrics)}-{max(metrics)}) from "
              + ", ".join(str(f) for f in files))
        if skipped:
            print("[verl] plot: skipped panels without data: "
                  + "; ".join(f"{name} (no {wanted})" for name, wanted in skipped.items()))
        out = args.out or (path / "plots" if path.is_dir() else path.with_name(f"{path.stem}_plots"))
        paths = plot_metrics(metrics, out, title=args.title or (path.resolve().name if path.is_dir() else path.stem))
    except (OSError, MetricsFileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
