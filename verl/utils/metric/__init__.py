"""Reducing per-mini-batch and per-rank metric lists to one number each."""

from verl.utils.metric.utils import AggregationType, Metric, reduce_metrics

__all__ = ["AggregationType", "Metric", "reduce_metrics"]
