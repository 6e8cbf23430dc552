"""Score generated responses and report pass@1 and pass@k per data source, as the original's ``main_eval``.

    python3 -m verl.trainer.main_eval data.path=out/gen.parquet

Reads ``verl/trainer/config/evaluation.yaml``. Every response of every row (``data.response_key``: a
list of strings, as ``main_generation`` writes) is scored against the row's
``<reward_model_key>.ground_truth`` with the rule scorer of its ``data_source`` (the one training
uses) or with ``custom_reward_function``. Per data source it reports ``test_score/<source>`` (the
mean score over rows of each row's mean, the original's metric), ``pass@1/<source>`` and
``pass@k/<source>`` with k the number of responses per row: the unbiased estimator
1 - C(n-c, k) / C(n, k) of Chen et al. (2021), where c of the row's n responses score at least
``metrics.pass_threshold``. Every row is checked before any scoring: a missing column, an empty
response list or a row without a ground truth stops the run, naming the row.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import sys
from collections import defaultdict

from verl.trainer.config_validation import ConfigError
from verl.utils.fs import atomic_write

EVALUATION_CONFIG = "evaluation"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k responses drawn without replacement from n, c of which pass,
    passes: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _rows(config) -> list[tuple[str, list[str], object, dict]]:
    """(data_source, responses, ground_truth, extra_info) of every row, checked up front."""
    import pandas as pd

    path = os.path.expanduser(str(config.data.path))
    if not os.path.isfile(path):
        raise ConfigError("Invalid evaluation config:", [f"data.path: {path!r} is not a file; pass the parquet "
                                                         "that main_generation wrote (data.output_path)"])
    frame = pd.read_parquet(path)
    keys = {k: config.data[k] for k in ("response_key", "data_source_key", "reward_model_key")}
    missing = [f"data.{name}: column {column!r} is not in {path} (columns: {list(frame.columns)})"
               for name, column in keys.items() if column not in frame.columns]
    if missing:
        raise ConfigError("Invalid evaluation config:", missing)
    rows, bad = [], []
    for i, record in enumerate(frame.to_dict("records")):
        responses = record[keys["response_key"]]
        responses = [] if responses is None else list(responses)
        reward_model = record[keys["reward_model_key"]]
        truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
        if not responses or not all(isinstance(r, str) for r in responses):
            bad.append(f"row {i}: '{keys['response_key']}' must be a non-empty list of strings, got {responses!r:.80}")
        elif truth is None:
            bad.append(f"row {i}: '{keys['reward_model_key']}' has no ground_truth")
        else:
            extra = record.get("extra_info")
            extra = extra if isinstance(extra, dict) else {}
            rows.append((str(record[keys["data_source_key"]]), responses, truth, extra))
    if bad:
        raise ValueError(f"{path}: {len(bad)} row(s) cannot be scored:\n  " + "\n  ".join(bad[:10]))
    return rows


def evaluate(config) -> dict[str, float]:
    from verl.rewards.loading import get_custom_reward_fn
    from verl.rewards.scorers import default_compute_score

    score = get_custom_reward_fn(config) or default_compute_score
    threshold = float(config.metrics.pass_threshold)
    by_source: dict[str, list[tuple[float, int, int]]] = defaultdict(list)  # (mean score, n, passed)
    ks = {}
    for index, (source, responses, truth, extra) in enumerate(_rows(config)):
        scores = []
        for response in responses:
            value = score(source, response, truth, extra)
            value = value["score"] if isinstance(value, dict) else value
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"row {index} ({source}): the reward function returned {value!r}; it must return a "
                                 "finite number (or a dict with a numeric 'score')")
            scores.append(float(value))
        by_source[source].append((sum(scores) / len(scores), len(scores), sum(s >= threshold for s in scores)))
        ks[source] = min(ks.get(source, len(scores)), len(scores))
    metrics = {}
    for source, rows in sorted(by_source.items()):
        k = ks[source]
        metrics[f"test_score/{source}"] = sum(r[0] for r in rows) / len(rows)
        metrics[f"pass@1/{source}"] = sum(pass_at_k(n, c, 1) for _, n, c in rows) / len(rows)
        metrics[f"pass@{k}/{source}"] = sum(pass_at_k(n, c, k) for _, n, c in rows) / len(rows)
    return metrics


def main(argv: list[str] | None = None) -> int:
    from verl.trainer.config.compose import compose_config

    try:
        config = compose_config(sys.argv[1:] if argv is None else argv, default_config_name=EVALUATION_CONFIG)
        metrics = evaluate(config)
    except (ValueError, AttributeError, FileNotFoundError) as err:  # a ConfigError is printed as it is
        print(err if isinstance(err, ConfigError) else f"main_eval stopped: {err}", file=sys.stderr)
        return 1
    for key, value in metrics.items():
        print(f"{key}: {value:.4f}")
    output = config.metrics.output_path
    if output:
        with atomic_write(os.path.expanduser(str(output)), "w") as f:
            json.dump(metrics, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
