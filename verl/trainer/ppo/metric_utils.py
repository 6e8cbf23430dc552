"""Per-step metrics the driver computes from a batch: data statistics, timings, throughput, and
validation metrics (mean@N, best@k, maj@k). ``reduce_metrics`` (workers' per-mini-batch lists to one
number) lives in :mod:`verl.utils.metric` and is importable from here too, as in the original.

Batch layout (a ``DataProto``): ``prompts`` (B, P) left-padded, ``responses`` (B, R) right-padded,
``attention_mask`` (B, P + R), ``response_mask`` (B, R) (falls back to the response part of
``attention_mask``), and the (B, R) tensors ``token_level_scores``, ``token_level_rewards``,
``advantages``, ``returns`` and, with a critic, ``values``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from numbers import Number
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.utils.metric import reduce_metrics  # noqa: F401 - the original's import path for it

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
      ``token_level_rewards`` (whole rows: they are zero outside the response): mean, max, min over the
      sequences that have a response (aborted ones, with none, are left out).
    - ``critic/advantages/*``, ``critic/returns/*`` (and ``critic/values/*`` with a critic): mean,
      max, min over all valid response tokens of the batch.
    - ``critic/vf_explained_var`` (with a critic): :func:`explained_variance` over valid tokens.
    - ``response_length/*``, ``prompt_length/*``: mean, max, min of the valid lengths, and
      ``clip_ratio``, the fraction of sequences whose length equals the maximum (R or P), i.e. that
      were cut off by the length limit (or exactly filled it); ``response_length_non_aborted/*`` the
      same over sequences with a response, and ``response/aborted_ratio`` the fraction without.

    Raises ValueError when no sequence has a response.
    """
    tensors = batch.batch
    prompt_mask, response_mask = _masks(batch)
    response_lengths = response_mask.sum(-1).double()
    answered = response_lengths > 0
    if not bool(answered.any()):
        raise ValueError("compute_data_metrics: every sequence of the batch has an empty response (all aborted)")
    metrics: dict[str, float] = {}
    metrics.update(_mean_max_min("critic/score", tensors["token_level_scores"].sum(-1)[answered]))
    metrics.update(_mean_max_min("critic/rewards", tensors["token_level_rewards"].sum(-1)[answered]))
    metrics.update(_mean_max_min("critic/advantages", tensors["advantages"][response_mask]))
    metrics.update(_mean_max_min("critic/returns", tensors["returns"][response_mask]))
    if use_critic:
        if "values" not in tensors:
            raise KeyError("compute_data_metrics(use_critic=True) needs batch['values'] (the critic's "
                           "output of the 'values' stage); pass use_critic=False when there is no critic")
        valid_values = tensors["values"][response_mask]
        metrics.update(_mean_max_min("critic/values", valid_values))
        metrics["critic/vf_explained_var"] = explained_variance(tensors["returns"][response_mask], valid_values)

    response_limit = response_mask.shape[-1]
    for name, lengths, limit in (("response_length", response_lengths, response_limit),
                                 ("response_length_non_aborted", response_lengths[answered], response_limit),
                                 ("prompt_length", prompt_mask.sum(-1).double(), prompt_mask.shape[-1])):
        metrics.update(_mean_max_min(name, lengths))
        metrics[f"{name}/clip_ratio"] = (lengths == limit).double().mean().item()
    metrics["response/aborted_ratio"] = 1.0 - answered.double().mean().item()
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


def compute_throughout_metrics(batch: DataProto, timing_raw: Mapping[str, float], n_gpus: int) -> dict[str, float]:
    """``perf/total_num_tokens`` (Σ ``meta_info["global_token_num"]``, the valid tokens per sequence, or
    Σ attention_mask when the batch lacks it), ``perf/time_per_step`` (``timing_raw["step"]``) and
    ``perf/throughput`` = total tokens / (step time × n_gpus), in tokens per second per device.
    The name is the original's ("throughout")."""
    if "step" not in timing_raw:
        raise KeyError("compute_throughout_metrics needs timing_raw['step'] (time the whole step with "
                       "simple_timer('step', timing_raw))")
    token_counts = batch.meta_info.get("global_token_num")
    if token_counts is None:
        total_tokens = int(batch.batch["attention_mask"].sum().item())
    else:
        total_tokens = int(sum(token_counts))
    step_time = float(timing_raw["step"])
    return {"perf/total_num_tokens": float(total_tokens), "perf/time_per_step": step_time,
            "perf/throughput": total_tokens / (step_time * n_gpus) if step_time > 0 and n_gpus > 0 else math.nan}



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
# Bound on the elements of one bootstrap array (prompts x subsets x k), so memory stays ~100 MB.
_BOOTSTRAP_CHUNK_ELEMENTS = 1 << 22


def bootstrap_indices(n_data: int, subset_size: int, n_bootstrap: int = N_BOOTSTRAP, seed: int = 42) -> np.ndarray:
    """(n_bootstrap, subset_size) indices into ``n_data`` items, drawn with replacement: the draws of
    ``np.random.seed(seed); np.random.choice(n_data, (n_bootstrap, subset_size))``, as the original takes
    them, but from a generator of its own (numpy's global random state is left alone)."""
    return np.random.RandomState(seed).choice(n_data, size=(n_bootstrap, subset_size), replace=True)


def bootstrap_metric(data: Sequence[Any], subset_size: int, reduce_fns: Sequence[Callable[[np.ndarray], float]],
                     n_bootstrap: int = N_BOOTSTRAP, seed: int = 42) -> list[tuple[float, float]]:
    """``[(mean, std) of reduce_fn over n_bootstrap subsets) for reduce_fn in reduce_fns]``: each subset
    holds ``subset_size`` items of ``data`` drawn with replacement (:func:`bootstrap_indices`), passed
    to ``reduce_fn`` as an object array; std is the population std. ValueError when ``data`` is empty."""
    items = np.array(data, dtype=object)
    indices = bootstrap_indices(len(items), subset_size, n_bootstrap, seed)
    results = []
    for reduce_fn in reduce_fns:
        values = np.array([reduce_fn(items[row]) for row in indices], dtype=np.float64)
        results.append((float(values.mean()), float(values.std())))
    return results


def calc_maj_val(data: Sequence[Mapping[str, Any]], vote_key: str, val_key: str) -> Any:
    """The ``val_key`` of the majority answer: the ``vote_key`` value most frequent in ``data``, a tie
    going to the answer that appears first; its value is that of its first appearance."""
    values_by_vote: dict[Any, list[Any]] = {}
    for item in data:
        values_by_vote.setdefault(item[vote_key], []).append(item[val_key])
    return max(values_by_vote.values(), key=len)[0]  # max keeps the first of equal counts


def _all_numbers(values: Sequence[Any]) -> bool:
    """True when every value is a real number (bool, int, float, numpy scalar); checked per type."""
    return all(issubclass(t, (Number, np.number, np.bool_)) and not issubclass(t, (complex, np.complexfloating))
               for t in {type(v) for v in values})


def _subset_sizes(n: int) -> list[int]:
    """k = 2, 4, 8, ... below n, then n itself (empty for n = 1)."""
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return sizes + [n] if n > 1 else []


def _answer_codes(preds: list[list[Any]]) -> np.ndarray:
    """Per prompt, its distinct answers numbered by first appearance: codes of shape (P, n). Answers
    compare as dictionary keys do (1 == 1.0); unhashable ones (lists, dicts) by their text."""
    codes = np.zeros((len(preds), len(preds[0])), dtype=np.int64)
    for p, row in enumerate(preds):
        seen: dict[Any, int] = {}
        for j, pred in enumerate(row):
            try:
                hash(pred)
                key = pred
            except TypeError:
                key = repr(pred)
            codes[p, j] = seen.setdefault(key, len(seen))
    return codes


def _majority_positions(sub_codes: np.ndarray, n: int) -> np.ndarray:
    """For each subset (last axis of ``sub_codes``, codes < n), the position of the first draw of its
    majority answer, a tie going to the answer drawn first (what :func:`calc_maj_val` picks)."""
    *batch_shape, k = sub_codes.shape
    flat = sub_codes.reshape(-1, k)
    ids = np.arange(flat.shape[0])[:, None] * n + flat
    counts = np.bincount(ids.ravel(), minlength=flat.shape[0] * n)[ids]  # count of each draw's answer
    return (counts == counts.max(-1, keepdims=True)).argmax(-1).reshape(batch_shape)


def _group_metrics(columns: dict[str, np.ndarray], codes: np.ndarray | None,
                   seed: int) -> Iterator[tuple[str, str, np.ndarray]]:
    """Metrics of the prompts of one data source that all have n samples: ``columns`` maps each
    variable to its (P, n) values; yields ``(var, metric, per_prompt_values)``.

    Every prompt uses the same bootstrap subsets for a given k (the original reseeds for each prompt)."""
    num_prompts, n = next(iter(columns.values())).shape
    for var, values in columns.items():
        yield var, f"mean@{n}", values.mean(-1)
        if n > 1:
            yield var, f"std@{n}", values.std(-1)

    for k in _subset_sizes(n):
        idx = bootstrap_indices(n, k, N_BOOTSTRAP, seed)  # (N_BOOTSTRAP, k)
        rows_per_chunk = max(1, _BOOTSTRAP_CHUNK_ELEMENTS // (N_BOOTSTRAP * k))
        for start in range(0, num_prompts, rows_per_chunk):
            rows = slice(start, min(start + rows_per_chunk, num_prompts))
            if codes is not None:
                winners = _majority_positions(codes[rows][:, idx], n)[..., None]  # (p, N_BOOTSTRAP, 1)
            for var, values in columns.items():
                subsets = values[rows][:, idx]  # (p, N_BOOTSTRAP, k)
                reduced = {"best": subsets.max(-1), "worst": subsets.min(-1)}
                if codes is not None:
                    reduced["maj"] = np.take_along_axis(subsets, winners, -1)[..., 0]
                for name, per_subset in reduced.items():  # (p, N_BOOTSTRAP)
                    yield var, f"{name}@{k}/mean", per_subset.mean(-1)
                    yield var, f"{name}@{k}/std", per_subset.std(-1)


def process_validation_metrics(data_sources: Sequence[str], sample_uids: Sequence[Any],
                               infos_dict: Mapping[str, Sequence[Any]], seed: int = 42
                               ) -> dict[str, dict[str, dict[str, float]]]:
    """Validation metrics per data source, variable and metric name.

    Samples are grouped by (data source, ``sample_uids``: a prompt id or the prompt text); a prompt
    with n samples gives, for each numeric variable of ``infos_dict`` (e.g. ``reward``, ``acc``):

    - ``mean@n`` and (n > 1) ``std@n``: mean and population std of its n values;
    - for k = 2, 4, 8, ... < n and k = n: ``best@k/{mean,std}`` and ``worst@k/{mean,std}``, the mean
      and population std over 1000 bootstrap subsets (k draws with replacement, :func:`bootstrap_indices`
      with ``seed``, the original's draws) of the subset's max / min; and, when ``infos_dict`` has
      ``pred`` (the extracted answer), ``maj@k/{mean,std}``: the value of the subset's majority answer
      (:func:`calc_maj_val`: ties go to the answer drawn first, whose first draw gives the value).

    Each metric is then averaged over the prompts of the data source. Variables with a non-numeric
    value (``pred`` as text, notes) are skipped. Result: ``{data_source: {var: {metric: value}}}``.
    """
    num_samples = len(data_sources)
    if len(sample_uids) != num_samples:
        raise ValueError(f"process_validation_metrics: {num_samples} data_sources but {len(sample_uids)} sample_uids")
    for var, vals in infos_dict.items():
        if len(vals) != num_samples:
            raise ValueError(f"process_validation_metrics: infos_dict[{var!r}] has {len(vals)} entries, "
                             f"expected one per sample ({num_samples})")

    # data source -> prompt uid -> sample indices, in order of first appearance.
    groups: dict[str, dict[Any, list[int]]] = defaultdict(dict)
    for i, (source, uid) in enumerate(zip(data_sources, sample_uids)):
        groups[source].setdefault(uid, []).append(i)

    preds = infos_dict.get("pred")
    numeric = {v: np.asarray(vals, dtype=np.float64) for v, vals in infos_dict.items() if _all_numbers(vals)}

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
