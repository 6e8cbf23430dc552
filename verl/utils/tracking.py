"""Experiment tracking: one ``Tracking`` object fans each step's metrics out to the chosen backends.

Backends (``trainer.logger``):

- ``console``: one line per step on stdout, ``step:3 - critic/score/mean:0.5 - actor/pg_loss:0.012 - ...``
  (important keys first, then the rest alphabetically), plus a tqdm progress bar with ETA on stderr
  when the total number of steps is known. Lines go through ``tqdm.write`` so they never tear the bar.
  ``TQDM_DISABLE=1`` hides the bar.
- ``file``: JSON Lines, one object per ``log`` call: ``{"step": 3, "data": {"actor/pg_loss": 0.012, ...}}``.
  The file is opened for appending (a resumed run continues it) and flushed after every line.
  Non-finite numbers are written as the bare tokens ``NaN``/``Infinity``: Python's ``json`` and
  pandas read them back, strict JSON parsers do not.
- ``tensorboard``: ``torch.utils.tensorboard.SummaryWriter`` (needs the ``tensorboard`` package).
- ``wandb``: ``wandb.init(project, name=experiment, config)``; ``WANDB_*`` variables apply as usual.
- ``mlflow``: tracking URI from ``MLFLOW_TRACKING_URI`` (default ``sqlite:////tmp/mlruns.db``);
  metric names are sanitised to what MLflow accepts (``@`` becomes ``_at_``).

The optional backends import their package when the Tracking object is built; a missing package
raises :class:`TrackingBackendUnavailable` (an ImportError) that says what to install or drop.
"""

from __future__ import annotations

import importlib
import json
import math
import numbers
import os
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from verl.utils.fs import atomic_write
from verl.utils.logging_utils import get_logger

logger = get_logger(__name__)

BACKENDS = ("console", "file", "tensorboard", "wandb", "mlflow")
BACKEND_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}

# Console keys shown first, in this order; an entry ending in "/" matches every key it prefixes.
CONSOLE_KEY_PRIORITY = (
    "training/epoch", "val-core/", "critic/score/mean", "critic/rewards/mean", "actor/pg_loss", "actor/entropy",
    "actor/ppo_kl", "actor/kl_loss", "actor/pg_clipfrac", "actor/grad_norm", "critic/vf_loss",
    "critic/vf_explained_var", "response_length/mean", "perf/throughput", "perf/mfu/actor", "timing_s/step",
)


class TrackingBackendUnavailable(ImportError):
    """A logger backend listed in ``trainer.logger`` needs a package that is not installed."""


def _import_backend_package(backend: str, module: str):
    package = BACKEND_PACKAGES[backend]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise TrackingBackendUnavailable(
            f"trainer.logger includes {backend!r}, but the {package!r} package is not installed "
            f"({e}). Install it with `pip install {package}`, or drop {backend!r} from trainer.logger, "
            f"e.g. trainer.logger=[console,file]."
        ) from e


def _to_python(value: Any) -> Any:
    """Plain Python numbers for tensors and numpy scalars; other values are left as they are."""
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.size == 1):
        return value.item()
    numel = getattr(value, "numel", None)  # a torch tensor, without importing torch here
    if callable(numel) and numel() == 1:
        return value.item()
    return value


def format_value(value: Any) -> str:
    """Compact text for the console: integers (and integral floats) whole, other floats with four
    significant digits (``0.01234``, ``12.35``, ``1.2e-05``), anything else via ``str``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    value = float(value)
    if math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def _console_sort_key(key: str) -> tuple[int, str]:
    for rank, entry in enumerate(CONSOLE_KEY_PRIORITY):
        if key == entry or (entry.endswith("/") and key.startswith(entry)):
            return rank, key
    return len(CONSOLE_KEY_PRIORITY), key


def format_console_line(data: Mapping[str, Any], step: int) -> str:
    """``step:<step> - key:value - ...`` with the priority keys first, the rest sorted by name."""
    items = [f"step:{step}"] + [f"{k}:{format_value(data[k])}" for k in sorted(data, key=_console_sort_key)]
    return " - ".join(items)


class ConsoleLogger:
    def __init__(self, total_steps: int | None = None):
        self.total_steps = total_steps
        self._bar = None

    def set_total_steps(self, total_steps: int | None) -> None:
        self.total_steps = total_steps
        if self._bar is not None:
            self._bar.total = total_steps
            self._bar.refresh()

    def log(self, data: Mapping[str, Any], step: int) -> None:
        from tqdm import tqdm

        tqdm.write(format_console_line(data, step), file=sys.stdout)
        if self.total_steps:
            if self._bar is None:
                # Start at the first logged step, so a resumed run's ETA counts only new steps.
                self._bar = tqdm(total=self.total_steps, initial=step, desc="Training Progress", unit="step",
                                 file=sys.stderr, dynamic_ncols=True)
            elif step > self._bar.n:
                self._bar.update(step - self._bar.n)
        sys.stdout.flush()

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _json_default(value: Any) -> Any:
    converted = _to_python(value)
    return converted if converted is not value else str(value)


class FileLogger:
    """JSON Lines at ``VERL_FILE_LOGGER_PATH``, else
    ``<VERL_FILE_LOGGER_ROOT or output_dir or ./logs>/<project>/<experiment>.jsonl``."""

    def __init__(self, project_name: str, experiment_name: str, output_dir: str | None = None):
        path = os.environ.get("VERL_FILE_LOGGER_PATH")
        if not path:
            root = os.environ.get("VERL_FILE_LOGGER_ROOT") or output_dir or "logs"
            path = os.path.join(root, str(project_name), f"{experiment_name}.jsonl")
        self.path = os.path.abspath(path)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        # Held open for the logger's lifetime; closed by finish().
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        print(f"[verl] file logger: appending metrics to {self.path}", flush=True)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self._file.write(json.dumps({"step": step, "data": dict(data)}, default=_json_default) + "\n")
        self._file.flush()

    def resumed_at(self, step: int) -> None:
        """A run resumed from the checkpoint of ``step``: drop the lines of later steps (the run that
        wrote them stopped before their checkpoint; they are about to be logged again), so the file
        holds each step once. The file is rewritten under a temporary name and renamed."""
        self._file.close()
        with open(self.path, encoding="utf-8") as f:
            lines = f.readlines()
        kept = [line for line in lines if not line.strip() or _step_of(line) <= step]
        if len(kept) != len(lines):
            with atomic_write(self.path, "w") as f:
                f.writelines(kept)
            print(f"[verl] file logger: dropped {len(lines) - len(kept)} line(s) after step {step} from {self.path} "
                  "(the run resumes from that step)", flush=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def finish(self) -> None:
        if not self._file.closed:
            self._file.close()


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return 0  # not a record of ours: kept


def _numeric_items(data: Mapping[str, Any]) -> Iterable[tuple[str, float]]:
    for key, value in data.items():
        if isinstance(value, numbers.Number) and not isinstance(value, bool):
            yield key, float(value)


class TensorBoardLogger:
    """Scalars under ``TENSORBOARD_DIR``, else ``<output_dir or .>/tensorboard_log/<project>/<experiment>``."""

    def __init__(self, project_name: str, experiment_name: str, output_dir: str | None = None):
        module = _import_backend_package("tensorboard", "torch.utils.tensorboard")
        log_dir = os.environ.get("TENSORBOARD_DIR") or os.path.join(
            output_dir or ".", "tensorboard_log", str(project_name), str(experiment_name))
        os.makedirs(log_dir, exist_ok=True)
        print(f"[verl] tensorboard logger: writing to {os.path.abspath(log_dir)}", flush=True)
        self.writer = module.SummaryWriter(log_dir=log_dir)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        for key, value in _numeric_items(data):
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class WandbLogger:
    def __init__(self, project_name: str, experiment_name: str, config: dict | None, output_dir: str | None):
        self.wandb = _import_backend_package("wandb", "wandb")
        kwargs = {"dir": output_dir} if output_dir else {}
        self.wandb.init(project=project_name, name=experiment_name, config=config, **kwargs)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.wandb.log(dict(data), step=step)

    def finish(self) -> None:
        self.wandb.finish(exit_code=0)


_MLFLOW_INVALID = re.compile(r"[^/\w.\- :]")  # MLflow's metric names: word characters, / . - : and space
_REPEATED_SLASHES = re.compile(r"/{2,}")


def sanitize_mlflow_key(key: str) -> str:
    """The metric name MLflow accepts for ``key``: ``@`` becomes ``_at_``, repeated slashes one slash (MLflow
    stores names as file paths), and any character other than a word character, ``/ . - :`` or space ``_``."""
    return _MLFLOW_INVALID.sub("_", _REPEATED_SLASHES.sub("/", key.replace("@", "_at_")))


def _flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten_params(value, f"{name}."))
        else:
            flat[sanitize_mlflow_key(name)] = str(value)[:500]  # MLflow's limit for a param value
    return flat


class MlflowLogger:
    def __init__(self, project_name: str, experiment_name: str, config: dict | None):
        self.mlflow = _import_backend_package("mlflow", "mlflow")
        self.mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", "sqlite:////tmp/mlruns.db"))
        self.mlflow.set_experiment(project_name)
        self.mlflow.start_run(run_name=experiment_name)
        self._names: dict[str, str] = {}  # metric key -> the name MLflow gets
        if config:
            self.mlflow.log_params(_flatten_params(config))

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.mlflow.log_metrics({self._metric_name(k): v for k, v in _numeric_items(data)}, step=step)

    def _metric_name(self, key: str) -> str:
        """`sanitize_mlflow_key`, with a warning the first time a key is renamed."""
        if key not in self._names:
            self._names[key] = sanitize_mlflow_key(key)
            if self._names[key] != key:
                logger.warning("[MLflow] metric %r is logged as %r: MLflow does not accept its characters",
                                key, self._names[key])
        return self._names[key]

    def finish(self) -> None:
        self.mlflow.end_run()


def _backend_names(default_backend: str | Iterable[str] | None) -> list[str]:
    names = [default_backend] if isinstance(default_backend, str) else [str(b) for b in default_backend or ()]
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise ValueError(f"trainer.logger: unknown backend(s) {unknown}; valid backends are {list(BACKENDS)}")
    return list(dict.fromkeys(names))


class Tracking:
    """Log each step's metrics to every backend in ``default_backend`` (a name or a list of names).

    ``config`` (a plain dict, e.g. ``OmegaConf.to_container(cfg, resolve=True)``) is recorded by
    wandb and mlflow. ``output_dir`` is where the file and tensorboard backends write when their
    environment variables are unset. ``total_steps`` (or :meth:`set_total_steps`) turns on the
    console progress bar.
    """

    def __init__(self, project_name: str, experiment_name: str,
                 default_backend: str | Iterable[str] | None = "console", config: dict | None = None,
                 output_dir: str | None = None, total_steps: int | None = None):
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.backends: dict[str, Any] = {}
        try:
            for name in _backend_names(default_backend):
                self.backends[name] = self._make_backend(name, config, output_dir, total_steps)
        except BaseException:
            self.finish()
            raise

    def _make_backend(self, name: str, config: dict | None, output_dir: str | None, total_steps: int | None):
        if name == "console":
            return ConsoleLogger(total_steps)
        if name == "file":
            return FileLogger(self.project_name, self.experiment_name, output_dir)
        if name == "tensorboard":
            return TensorBoardLogger(self.project_name, self.experiment_name, output_dir)
        if name == "wandb":
            return WandbLogger(self.project_name, self.experiment_name, config, output_dir)
        return MlflowLogger(self.project_name, self.experiment_name, config)

    def resumed_at(self, step: int) -> None:
        """Tell the backends that can forget later steps (the file logger) that the run resumes at ``step``."""
        for backend in self.backends.values():
            if hasattr(backend, "resumed_at"):
                backend.resumed_at(step)

    def set_total_steps(self, total_steps: int | None) -> None:
        """Set the number of steps the console progress bar counts to."""
        console = self.backends.get("console")
        if console is not None:
            console.set_total_steps(total_steps)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """Send ``data`` (metric name -> number; tensors and numpy scalars are converted) for ``step``."""
        clean = {str(k): _to_python(v) for k, v in data.items()}
        for backend in self.backends.values():
            backend.log(clean, step)

    def finish(self) -> None:
        """Close every backend (flush files, end runs). Safe to call more than once."""
        backends, self.backends = self.backends, {}
        for backend in backends.values():
            backend.finish()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.finish()
