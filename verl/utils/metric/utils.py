"""``reduce_metrics`` and the ``Metric`` accumulator (a list of numbers with its own reduction)."""

from __future__ import annotations

import math
from collections.abc import Iterable, MutableMapping
from enum import Enum
from typing import Any

import numpy as np
import torch


class AggregationType(Enum):
    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


_REDUCERS = {AggregationType.MEAN: np.mean, AggregationType.SUM: np.sum, AggregationType.MIN: np.min,
             AggregationType.MAX: np.max}


class Metric:
    """Numbers collected for one metric (one per micro-batch, mini-batch or rank) and how to reduce them.

    ``aggregation`` is an :class:`AggregationType` or its value (``"mean"``, ``"sum"``, ``"min"``,
    ``"max"``); ``value`` is an optional first number or list of numbers. Numbers are ints, floats or
    one-element tensors (read with ``.item()``)::

        m = Metric("max", [1.0, 3.0]); m.append(torch.tensor(2.0)); m.aggregate()  # 3.0
    """

    def __init__(self, aggregation: str | AggregationType, value: Any = None) -> None:
        try:
            self.aggregation = AggregationType(aggregation)
        except ValueError:
            raise ValueError(f"Metric: unsupported aggregation {aggregation!r}; use one of "
                             f"{', '.join(a.value for a in AggregationType)}") from None
        self.values: list[int | float] = []
        if isinstance(value, (list, tuple, Metric)):
            self.extend(value)
        elif value is not None:
            self.append(value)

    def append(self, value: Any) -> None:
        """Add one number; a :class:`Metric` adds all of its numbers (same aggregation only)."""
        if isinstance(value, Metric):
            self.extend(value)
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"Metric.append: only one-element tensors are numbers, got shape {tuple(value.shape)}")
            value = value.detach().item()
        elif isinstance(value, np.generic):
            value = value.item()
        if not isinstance(value, (int, float)):
            raise ValueError(f"Metric.append: expected an int, a float or a one-element tensor, got {type(value)}")
        self.values.append(value)

    def extend(self, values: Metric | Iterable[Any]) -> None:
        if isinstance(values, Metric):
            if values.aggregation != self.aggregation:
                raise ValueError(f"Metric.extend: aggregation mismatch ({self.aggregation} != {values.aggregation})")
            values = values.values
        for value in values:
            self.append(value)

    def aggregate(self) -> float:
        """The reduction of the numbers; NaN when there are none (0 for a sum)."""
        if not self.values:
            return 0.0 if self.aggregation is AggregationType.SUM else math.nan
        return float(_REDUCERS[self.aggregation](self.values))

    @classmethod
    def chain(cls, metrics: list[Metric]) -> Metric:
        """One metric holding the numbers of all of ``metrics`` (which share one aggregation); an empty
        list gives an empty mean."""
        if not metrics:
            return cls(AggregationType.MEAN)
        chained = cls(metrics[0].aggregation)
        for metric in metrics:
            chained.extend(metric)
        return chained

    @classmethod
    def from_dict(cls, data: dict[str, Any], aggregation: str | AggregationType) -> dict[str, Metric]:
        """``{key: Metric(aggregation, value)}`` for every item of ``data``."""
        return {key: cls(aggregation, value) for key, value in data.items()}

    def init_list(self) -> Metric:
        """An empty metric with the same aggregation."""
        return Metric(self.aggregation)

    def __repr__(self) -> str:
        return f"Metric({self.aggregation.value!r}, {self.values})"


def _reduction(key: str):
    """max for a key whose last path part names a maximum (``.../max``, ``max_*``, ``*_max``), min
    likewise, else the mean: a peak over mini-batches or ranks stays a peak."""
    name = key.rsplit("/", 1)[-1]
    for word, fn in (("max", np.max), ("min", np.min)):
        if name == word or name.startswith(word + "_") or name.endswith("_" + word):
            return fn
    return np.mean


def _numbers(value: Any) -> list[float] | None:
    """The numbers of a list, tuple, tensor or array (None for a scalar)."""
    if isinstance(value, torch.Tensor):
        return value.detach().double().cpu().reshape(-1).tolist()
    if isinstance(value, np.ndarray):
        return value.astype(np.float64).reshape(-1).tolist()
    if isinstance(value, (list, tuple)):
        return [float(v.item()) if isinstance(v, torch.Tensor) else float(v) for v in value]
    return None


def reduce_metrics(metrics: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Each value of ``metrics`` becomes one float, in place; returns ``metrics``.

    - a :class:`Metric`: its own :meth:`~Metric.aggregate`;
    - a list, tuple, tensor or array (e.g. one entry per mini-batch from ``meta_info["metrics"]``):
      the max for a key whose last part names a maximum (``perf/max_memory_allocated_gb``, ``.../max``,
      ``*_max``), the min likewise, else the mean; NaN when empty;
    - a scalar: itself, as a float.
    """
    for key, value in metrics.items():
        if isinstance(value, Metric):
            metrics[key] = value.aggregate()
            continue
        numbers = _numbers(value)
        if numbers is None:
            metrics[key] = float(value)
        else:
            metrics[key] = float(_reduction(key)(numbers)) if numbers else math.nan
    return metrics
