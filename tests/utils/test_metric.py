import math

import numpy as np
import pytest
import torch

from verl.utils.metric import AggregationType, Metric, reduce_metrics


def test_metric_aggregations_by_hand():
    values = [3.0, 1, torch.tensor(2.0), np.float32(6.0)]
    assert Metric("mean", values).aggregate() == 3.0  # (3 + 1 + 2 + 6) / 4
    assert Metric("sum", values).aggregate() == 12.0
    assert Metric(AggregationType.MIN, values).aggregate() == 1.0
    assert Metric(AggregationType.MAX, values).aggregate() == 6.0
    assert Metric("max", 4.0).values == [4.0]
    assert math.isnan(Metric("mean").aggregate()) and Metric("sum").aggregate() == 0.0


def test_metric_append_extend_chain_and_errors():
    m = Metric("sum", 1.0)
    m.append(Metric("sum", [2.0, 3.0]))  # a Metric adds its numbers
    m.extend([4, torch.tensor([5.0])])
    assert m.values == [1.0, 2.0, 3.0, 4, 5.0] and m.aggregate() == 15.0
    chained = Metric.chain([Metric("max", [1.0]), Metric("max", [7.0, 2.0])])
    assert chained.aggregation is AggregationType.MAX and chained.values == [1.0, 7.0, 2.0]
    assert Metric.chain([]).aggregation is AggregationType.MEAN
    assert {k: v.aggregate() for k, v in Metric.from_dict({"a": 1.0, "b": [2.0, 4.0]}, "mean").items()} == \
        {"a": 1.0, "b": 3.0}
    assert m.init_list().aggregation is AggregationType.SUM and m.init_list().values == []
    with pytest.raises(ValueError, match="aggregation"):
        Metric("median")
    with pytest.raises(ValueError, match="mismatch"):
        m.extend(Metric("mean", [1.0]))
    with pytest.raises(ValueError, match="one-element"):
        m.append(torch.ones(2))
    with pytest.raises(ValueError, match="expected"):
        m.append("1.0")


def test_reduce_metrics_with_metrics_and_lists():
    metrics = {"actor/loss": Metric("sum", [1.0, 2.0]), "actor/pg_loss": [1.0, 3.0], "perf/max_memory_gb": [2.0, 5.0],
               "x/min": [4.0, -1.0], "lr": 0.5}
    assert reduce_metrics(metrics) == {"actor/loss": 3.0, "actor/pg_loss": 2.0, "perf/max_memory_gb": 5.0,
                                       "x/min": -1.0, "lr": 0.5}
