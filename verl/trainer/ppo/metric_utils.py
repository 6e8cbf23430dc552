"""Per-step metrics the driver computes from a batch: data statistics, timings, throughput, the
reduction of workers' per-mini-batch metrics, and validation metrics (mean@N, best@k, maj@k).

Batch layout (a ``DataProto``): ``prompts`` (B, P) left-padded, ``responses`` (B, R) right-padded,
``attention_mask`` (B, P + R), ``response_mask`` (B, R) (falls back to the response part of
``attention_mask``), and the (B, R) tensors ``token_level_scores``, ``token_level_rewards``,
``advantages``, ``returns`` and, with a critic, ``values``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from numbers import Number
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.utils.torch_functional import masked_sum

# ---------------------------------------------------------------------------- training-step metrics


def _masks(batch: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt_mask (B, P), response_mask (B, R)) as bool tensors."""
    response_len = batch.batch["responses"].shape[-1]
    attention_mask = batch.batch["attention_mask"]
    prompt_mask = attention_mask[:, : attention_mask.shape[-1] - response_len]
    response_mask = batch.batch.get("response_mask")
    if response_mask is None:
        response_mask = attention_mask[:, -response_len:]
    return prompt_mask.bool(), response_mask.bool()


def _mean_max_min(prefix: str, values: torch.Tensor) -> dict[str, float]:
    """``<prefix>/{mean,max,min}`` of a 1-D tensor; NaN when it is empty."""
    if values.numel() == 0:
        return {f"{prefix}/{s}": math.nan for s in ("mean", "max", "min")}
    values = values.double()
    return {f"{prefix}/{s}": getattr(values, s)().item() for s in ("mean", "max", "min")}


def explained_variance(returns: torch.Tensor, values: torch.Tensor) -> float:
    """1 − Var(returns − values) / (Var(returns) + 1e-5), sample variances, as the original computes
    ``critic/vf_explained_var``.

    1 is a perfect critic, 0 one no better than predicting the mean return; it can be negative. The
    1e-5 keeps near-constant returns (e.g. a batch where every response scored the same) from dividing
    by ~0: the value is then about −Var(returns − values)·1e5, not ±1e14. NaN with fewer than 2 tokens.
    """
    returns, values = returns.double().reshape(-1), values.double().reshape(-1)
    if returns.numel() < 2:
        return math.nan
    return (1.0 - (returns - values).var() / (returns.var() + 1e-5)).item()


def compute_data_metrics(batch: DataProto, use_critic: bool = True) -> dict[str, float]:
    """Statistics of a training batch after the ``adv`` stage.

    - ``critic/score/*``, ``critic/rewards/*``: per-sequence sums of ``token_level_scores`` /
      ``token_level_rewards`` (over valid response tokens): mean, max, min over sequences.
    - ``critic/advantages/*``, ``critic/returns/*`` (and ``critic/values/*`` with a critic): mean,
      max, min over all valid response tokens of the batch.
    - ``critic/vf_explained_var`` (with a critic): :func:`explained_variance` over valid tokens.
    - ``response_length/*``, ``prompt_length/*``: mean, max, min of the valid lengths, and
      ``clip_ratio``, the fraction of sequences whose length equals the maximum (R or P), i.e. that
      were cut off by the length limit (or exactly filled it).
    """
    tensors = batch.batch
    prompt_mask, response_mask = _masks(batch)
    metrics: dict[str, float] = {}
    metrics.update(_mean_max_min("critic/score", masked_sum(tensors["token_level_scores"], response_mask, -1)))
    metrics.update(_mean_max_min("critic/rewards", masked_sum(tensors["token_level_rewards"], response_mask, -1)))
    metrics.update(_mean_max_min("critic/advantages", tensors["advantages"][response_mask]))
    metrics.update(_mean_max_min("critic/returns", tensors["returns"][response_mask]))
    if use_critic:
        if "values" not in tensors:
            raise KeyError("compute_data_metrics(use_critic=True) needs batch['values'] (the critic's "
                           "output of the 'values' stage); pass use_critic=False when there is no critic")
        valid_values = tensors["values"][response_mask]
        metrics.update(_mean_max_min("critic/values", valid_values))
        metrics["critic/vf_explained_var"] = explained_variance(tensors["returns"][response_mask], valid_values)

    for name, mask in (("response_length", response_mask), ("prompt_length", prompt_mask)):
        lengths, limit = mask.sum(-1).double(), mask.shape[-1]
        metrics.update(_mean_max_min(name, lengths))
        metrics[f"{name}/clip_ratio"] = (lengths == limit).double().mean().item() if lengths.numel() else math.nan
    metrics.update(agent_loop_metrics(batch))
    return metrics


def agent_loop_metrics(batch: DataProto) -> dict[str, float]:
    """Multi-turn rollouts (their per-sample ``__*__`` columns): ``agent_loop/num_turns/*`` (messages after
    the prompt), ``agent_loop/tool_calls/*``, ``agent_loop/tool_errors/mean``, ``agent_loop/tool_time_s/mean``,
    ``agent_loop/tool_reward/mean``, ``agent_loop/turn_score/mean`` (a simulated user's turn scores, summed
    per episode) and ``agent_loop/response_length_with_tools/mean`` (tool results, user replies and template
    tokens included; ``response_length/*`` counts only the model's own tokens)."""
    columns = batch.non_tensor_batch
    if "__num_turns__" not in columns:
        return {}
    as_tensor = lambda key: torch.as_tensor(np.asarray(columns[key], dtype=np.float64))  # noqa: E731
    metrics = {**_mean_max_min("agent_loop/num_turns", as_tensor("__num_turns__")),
               **_mean_max_min("agent_loop/tool_calls", as_tensor("__tool_calls__"))}
    for key, name in (("__tool_errors__", "tool_errors"), ("__tool_seconds__", "tool_time_s"),
                      ("__tool_reward__", "tool_reward"), ("__turn_score__", "turn_score")):
        if key in columns:
            metrics[f"agent_loop/{name}/mean"] = as_tensor(key).mean().item()
    response_len = batch.batch["responses"].shape[-1]
    with_tools = batch.batch["attention_mask"][:, -response_len:].sum(-1).double()
    metrics["agent_loop/response_length_with_tools/mean"] = with_tools.mean().item()
    return metrics


# Stages whose cost grows with every token of the sequence (prompt + response).
_ALL_TOKEN_STAGES = ("ref", "values", "adv", "update_critic", "update_actor", "old_log_prob", "reward")


def compute_timing_metrics(batch: DataProto, timing_raw: Mapping[str, float]) -> dict[str, float]:
    """``timing_s/<stage>`` for every entry of ``timing_raw``, and ``timing_per_token_ms/<stage>``:
    for ``gen`` per valid response token, for ``ref``, ``values``, ``adv``, ``update_critic``,
    ``update_actor``, ``old_log_prob`` and ``reward`` per valid token (prompt + response)."""
    prompt_mask, response_mask = _masks(batch)
    response_tokens = max(int(response_mask.sum().item()), 1)
    all_tokens = max(int(prompt_mask.sum().item()) + response_tokens, 1)

    metrics = {f"timing_s/{name}": float(seconds) for name, seconds in timing_raw.items()}
    if "gen" in timing_raw:
        metrics["timing_per_token_ms/gen"] = timing_raw["gen"] * 1000.0 / response_tokens
    for name in _ALL_TOKEN_STAGES:
        if name in timing_raw:
            metrics[f"timing_per_token_ms/{name}"] = timing_raw[name] * 1000.0 / all_tokens
    return metrics


def compute_throughput_metrics(batch: DataProto, timing_raw: Mapping[str, float], n_gpus: int) -> dict[str, float]:
    """``perf/total_num_tokens`` (Σ attention_mask), ``perf/time_per_step`` (``timing_raw["step"]``)
    and ``perf/throughput`` = total tokens / (step time × n_gpus), in tokens per second per device."""
    if "step" not in timing_raw:
        raise KeyError("compute_throughput_metrics needs timing_raw['step'] (time the whole step with "
                       "simple_timer('step', timing_raw))")
    total_tokens = int(batch.batch["attention_mask"].sum().item())
    step_time = float(timing_raw["step"])
    return {"perf/total_num_tokens": float(total_tokens), "perf/time_per_step": step_time,
            "perf/throughput": total_tokens / (step_time * n_gpus) if step_time > 0 and n_gpus > 0 else math.nan}


def _reducer(key: str):
    """max for a key whose last part names a maximum (``.../max``, ``max_*``, ``*_max``), min likewise,
    else the mean: a peak over mini-batches or ranks must stay a peak."""
    name = key.rsplit("/", 1)[-1]
    for word, fn in (("max", np.max), ("min", np.min)):
        if name == word or name.startswith(word + "_") or name.endswith("_" + word):
            return fn
    return np.mean


def reduce_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """One number per list (e.g. one entry per mini-batch from ``meta_info["metrics"]``): the mean, or
    the max/min for keys naming a maximum/minimum (``perf/max_memory_allocated_gb``, ``.../max``);
    scalars pass through as floats; an empty list gives NaN."""
    reduced: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().double().cpu().reshape(-1).tolist()
        elif isinstance(value, np.ndarray):
            value = value.astype(np.float64).reshape(-1).tolist()
        if isinstance(value, (list, tuple)):
            arr = np.asarray([float(v) for v in value], dtype=np.float64)
            reduced[key] = float(_reducer(key)(arr)) if arr.size else math.nan
        else:
            reduced[key] = float(value)
    return reduced


def compute_rollout_probs_diff(rollout_log_probs: torch.Tensor, actor_log_probs: torch.Tensor,
                               response_mask: torch.Tensor) -> dict[str, float]:
    """How far the rollout engine's token probabilities are from the actor's, over valid tokens.

    ``training/rollout_probs_diff_{mean,max,std}`` of |exp(rollout) − exp(actor)| (population std),
    ``training/rollout_probs_diff_valid`` (1.0; 0.0 when the mask is empty, the rest NaN), and
    ``training/rollout_actor_probs_pearson_corr`` of the two probabilities (1.0 when both are
    constant and equal, 0.0 when just one side is constant).
    """
    mask = response_mask.bool()
    rollout_probs = rollout_log_probs.detach().double().exp()[mask]
    actor_probs = actor_log_probs.detach().double().exp()[mask]
    prefix = "training/rollout_probs_diff"
    if rollout_probs.numel() == 0:
        return {f"{prefix}_mean": math.nan, f"{prefix}_max": math.nan, f"{prefix}_std": math.nan,
                f"{prefix}_valid": 0.0, "training/rollout_actor_probs_pearson_corr": math.nan}
    diff = (rollout_probs - actor_probs).abs()
    rc, ac = rollout_probs - rollout_probs.mean(), actor_probs - actor_probs.mean()
    denom = (rc.square().sum() * ac.square().sum()).sqrt().item()
    if denom > 0:
        corr = ((rc * ac).sum().item()) / denom
    else:
        corr = 1.0 if torch.equal(rollout_probs, actor_probs) else 0.0
    return {f"{prefix}_mean": diff.mean().item(), f"{prefix}_max": diff.max().item(),
            f"{prefix}_std": diff.std(unbiased=False).item(), f"{prefix}_valid": 1.0,
            "training/rollout_actor_probs_pearson_corr": corr}


# ---------------------------------------------------------------------------- validation metrics

N_BOOTSTRAP = 1000
# Bound on the elements of one bootstrap index array, so memory stays ~100 MB whatever the batch.
_BOOTSTRAP_CHUNK_ELEMENTS = 1 << 22


def _all_numbers(values: Sequence[Any]) -> bool:
    """True when every value is a real number (bool, int, float, numpy scalar); checked per type."""
    return all(issubclass(t, (Number, np.number)) and not issubclass(t, (complex, np.complexfloating))
               for t in {type(v) for v in values})


def _subset_sizes(n: int) -> list[int]:
    """k = 2, 4, 8, ... below n, then n itself (empty for n = 1)."""
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return sizes + [n] if n > 1 else []


def _answer_codes(preds: list[list[Any]]) -> np.ndarray:
    """Per prompt, its distinct answers numbered by first appearance: codes of shape (P, n)."""
    codes = np.zeros((len(preds), len(preds[0])), dtype=np.int64)
    for p, row in enumerate(preds):
        seen: dict[Any, int] = {}
        for j, pred in enumerate(row):
            try:
                hash(pred)
                key = pred
            except TypeError:  # lists, dicts: compare by their text
                key = repr(pred)
            codes[p, j] = seen.setdefault(key, len(seen))
    return codes


def _first_value_per_code(codes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """code_values[p, c] = value of prompt p's first sample with answer code c (unused codes get
    the first sample's value; no subset ever votes for them)."""
    n = codes.shape[1]
    first_sample = (codes[:, :, None] == np.arange(n)).argmax(1)  # (P, n): first j with codes[p, j] == c
    return np.take_along_axis(values, first_sample, axis=1)


def _majority_votes(sub_codes: np.ndarray, n: int) -> np.ndarray:
    """The most frequent code in each subset (last axis of ``sub_codes``); ties go to the lowest code,
    i.e. the answer the prompt produced first."""
    *batch_shape, k = sub_codes.shape
    flat_codes = sub_codes.reshape(-1, k)
    ids = (np.arange(flat_codes.shape[0])[:, None] * n + flat_codes).ravel()
    counts = np.bincount(ids, minlength=flat_codes.shape[0] * n).reshape(-1, n)
    return counts.argmax(-1).reshape(batch_shape)


def _group_metrics(columns: dict[str, np.ndarray], codes: np.ndarray | None,
                   seed: int) -> Iterator[tuple[str, str, np.ndarray]]:
    """Metrics of the prompts of one data source that all have n samples: ``columns`` maps each
    variable to its (P, n) values; yields ``(var, metric, per_prompt_values)``."""
    num_prompts, n = next(iter(columns.values())).shape
    for var, values in columns.items():
        yield var, f"mean@{n}", values.mean(-1)
        if n > 1:
            yield var, f"std@{n}", values.std(-1)
    code_values = {var: _first_value_per_code(codes, v) for var, v in columns.items()} if codes is not None else {}

    for k in _subset_sizes(n):
        # One seeded stream per k: the same subsets for every variable, whatever the other ks are.
        rng = np.random.default_rng(seed)
        rows_per_chunk = max(1, _BOOTSTRAP_CHUNK_ELEMENTS // (N_BOOTSTRAP * k))
        for start in range(0, num_prompts, rows_per_chunk):
            rows = np.arange(start, min(start + rows_per_chunk, num_prompts))
            idx = rng.integers(0, n, size=(rows.shape[0], N_BOOTSTRAP, k))  # (p, N_BOOTSTRAP, k)
            flat_idx = rows[:, None, None] * n + idx
            winners = _majority_votes(codes.ravel()[flat_idx], n) if codes is not None else None
            for var, values in columns.items():
                subsets = values.ravel()[flat_idx]
                reduced = {"best": subsets.max(-1), "worst": subsets.min(-1)}
                if winners is not None:
                    reduced["maj"] = code_values[var][rows[:, None], winners]
                for name, per_subset in reduced.items():  # (p, N_BOOTSTRAP)
                    yield var, f"{name}@{k}/mean", per_subset.mean(-1)
                    yield var, f"{name}@{k}/std", per_subset.std(-1)


def process_validation_metrics(data_sources: Sequence[str], sample_uids: Sequence[Any],
                               infos: Mapping[str, Sequence[Any]], seed: int = 42
                               ) -> dict[str, dict[str, dict[str, float]]]:
    """Validation metrics per data source, variable and metric name.

    Samples are grouped by (data source, ``sample_uids``: a prompt id or the prompt text); a prompt
    with n samples gives, for each numeric variable of ``infos`` (e.g. ``reward``, ``acc``):

    - ``mean@n`` and (n > 1) ``std@n``: mean and population std of its n values;
    - for k = 2, 4, 8, ... < n and k = n: ``best@k/{mean,std}`` and ``worst@k/{mean,std}``, the mean
      and population std over 1000 bootstrap subsets (k draws with replacement, seeded by ``seed``)
      of the subset's max / min; and, when ``infos`` has ``pred`` (the extracted answer),
      ``maj@k/{mean,std}``: the value of the answer most frequent in the subset (ties go to the
      answer the prompt produced first; an answer's value is that of its first sample).

    Each metric is then averaged over the prompts of the data source. Non-numeric variables (and
    ``pred`` itself) are skipped. Result: ``{data_source: {var: {metric: value}}}``.
    """
    num_samples = len(data_sources)
    if len(sample_uids) != num_samples:
        raise ValueError(f"process_validation_metrics: {num_samples} data_sources but {len(sample_uids)} sample_uids")
    for var, vals in infos.items():
        if len(vals) != num_samples:
            raise ValueError(f"process_validation_metrics: infos[{var!r}] has {len(vals)} entries, "
                             f"expected one per sample ({num_samples})")

    # data source -> prompt uid -> sample indices, in order of first appearance.
    groups: dict[str, dict[Any, list[int]]] = defaultdict(dict)
    for i, (source, uid) in enumerate(zip(data_sources, sample_uids)):
        groups[source].setdefault(uid, []).append(i)

    preds = infos.get("pred")
    numeric = {v: np.asarray(vals, dtype=np.float64) for v, vals in infos.items()
               if v != "pred" and _all_numbers(vals)}

    result: dict[str, dict[str, dict[str, float]]] = {}
    for source, prompts in groups.items():
        totals: dict[str, dict[str, list]] = defaultdict(dict)  # var -> metric -> [sum over prompts, prompts]
        by_size: dict[int, list[list[int]]] = defaultdict(list)
        for indices in prompts.values():
            by_size[len(indices)].append(indices)
        for n, members in sorted(by_size.items()):
            index = np.asarray(members, dtype=np.int64)  # (P, n)
            codes = _answer_codes([[preds[i] for i in row] for row in members]) if preds is not None else None
            columns = {var: column[index] for var, column in numeric.items()}
            for var, metric, per_prompt in _group_metrics(columns, codes, seed):
                total = totals[var].setdefault(metric, [0.0, 0])
                total[0] += float(per_prompt.sum())
                total[1] += per_prompt.shape[0]
        result[source] = {var: {m: total / count for m, (total, count) in metrics.items()}
                          for var, metrics in totals.items()}
    return result


def _sample_count(metric: str) -> int:
    """The N of ``mean@N`` / ``best@N/mean``."""
    return int(metric.split("@", 1)[1].split("/", 1)[0])


def flatten_validation_metrics(nested: Mapping[str, Mapping[str, Mapping[str, float]]]) -> dict[str, float]:
    """Flat metric names for :func:`process_validation_metrics`' result.

    ``val-core/<data_source>/<var>/<metric>`` for the headline numbers, as the original sorts them: var
    ``acc`` when the data source has it (else ``reward``), metric ``mean@N``, ``best@N/{mean,std}`` or
    ``maj@N/{mean,std}`` at the largest N. Everything else is ``val-aux/<data_source>/<var>/<metric>``.
    With greedy validation (N = 1) the core metric is ``val-core/<data_source>/reward/mean@1`` (or ``acc``).
    """
    flat: dict[str, float] = {}
    for source, var2metrics in nested.items():
        core_var = "acc" if "acc" in var2metrics else "reward"
        for var, metrics in var2metrics.items():
            largest = max((_sample_count(m) for m in metrics), default=0)
            for metric, value in metrics.items():
                core = metric.startswith(("mean@", "best@", "maj@")) and _sample_count(metric) == largest
                kind = "val-core" if var == core_var and core else "val-aux"
                flat[f"{kind}/{source}/{var}/{metric}"] = value
    return flat
