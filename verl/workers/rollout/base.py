"""The rollout contract: left-padded prompts in, ``n`` sampled responses per prompt out.

Every engine subclasses :class:`BaseRollout` and implements ``generate_sequences``. The parts that
do not depend on the engine live here so that all engines agree on them: reading the sampling
settings (config, then per-call ``meta_info``), checking the prompt padding, and assembling the
output batch (masks after eos, position ids, interleaved repetition) with
:func:`build_rollout_output`. An engine only has to produce, for each of the ``B*n`` rows, the
sampled token ids and their log-probs.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from verl.protocol import DataProto, left_padded
from verl.workers.config.rollout import RolloutConfig
from verl.workers.rollout.registry import EXTERNAL_ONLY

logger = logging.getLogger(__name__)

__all__ = ["BaseRollout", "EpisodeTokens", "SamplingParams", "TurnHandler", "build_rollout_output",
           "check_left_padded", "left_padded", "resolve_sampling_params", "wait_for_continuations"]


@dataclass(frozen=True)
class SamplingParams:
    """The settings of one ``generate_sequences`` call, after defaults and overrides.

    ``greedy`` rows take the argmax; otherwise tokens are drawn from
    softmax(filter(logits / temperature)) with top-k then top-p filtering. ``top_k == 0`` and
    ``top_p == 1.0`` mean no filtering. ``temperature`` is the one that ``rollout_log_probs`` use
    (1.0 when greedy). An empty ``eos_token_ids`` (``ignore_eos``) means no row ever stops early.
    """

    n: int
    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    response_length: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int


def resolve_sampling_params(config: RolloutConfig, meta_info: dict, default_eos_token_ids,
                            default_pad_token_id) -> SamplingParams:
    """Sampling settings for one call.

    Precedence, per key: ``meta_info`` > (``config.val_kwargs`` when ``meta_info['validate']``, else
    the training keys of ``config``). ``do_sample=False`` or ``temperature == 0`` means greedy.
    ``top_k <= 0`` or None disables top-k.
    """
    config = RolloutConfig.from_config(config)
    validate = bool(meta_info.get("validate", False))
    source = config.val_kwargs if validate else config
    where = "actor_rollout_ref.rollout" + (".val_kwargs" if validate else "")

    def pick(key):
        value = meta_info.get(key)
        value = getattr(source, key) if value is None else value
        if value is None and key != "top_k":
            raise ValueError(f"{where}.{key} is null; set it (its default is in ppo_trainer.yaml)")
        return value

    temperature = float(pick("temperature"))
    if temperature < 0:
        raise ValueError(f"{where}.temperature must be >= 0 (0 means greedy), got {temperature}")
    top_p = float(pick("top_p"))
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"{where}.top_p must be in (0, 1], got {top_p}")
    n = int(pick("n"))
    if n < 1:
        raise ValueError(f"{where}.n must be >= 1, got {n}")
    response_length = meta_info.get("response_length") or config.response_length
    if not response_length or int(response_length) <= 0:
        raise ValueError("actor_rollout_ref.rollout.response_length is not set (it normally comes from "
                         f"data.max_response_length); got {response_length!r}")

    greedy = not bool(pick("do_sample")) or temperature == 0
    eos = meta_info.get("eos_token_id")
    eos = default_eos_token_ids if eos is None else eos
    eos = [eos] if isinstance(eos, (int, np.integer)) else list(eos or [])
    pad = meta_info.get("pad_token_id")
    pad = default_pad_token_id if pad is None else pad
    if pad is None:
        pad = eos[0] if eos else None
    if pad is None:
        raise ValueError("no pad token id: the tokenizer has neither a pad nor an eos token; pass "
                         "meta_info['pad_token_id'] to generate_sequences")
    if config.ignore_eos:
        eos = []
    return SamplingParams(n=n, greedy=greedy, temperature=1.0 if greedy else temperature,
                          top_k=max(int(pick("top_k") or 0), 0), top_p=top_p, response_length=int(response_length),
                          eos_token_ids=tuple(int(e) for e in eos), pad_token_id=int(pad))


class BaseRollout(ABC):
    """A generation engine.

    Args:
        config: the ``actor_rollout_ref.rollout`` section (a `RolloutConfig`, or a dict of its keys).
        module: the Hugging Face causal LM whose weights generate. The caller makes the full
            weights available for the duration of the call (e.g. unsharding FSDP around it).
        tokenizer: supplies the default eos and pad token ids.

    ``ignored_config_keys`` names the ``actor_rollout_ref.rollout.*`` keys the engine does not read;
    config validation warns when one of them is set to a non-default value.
    """

    ignored_config_keys: tuple[str, ...] = EXTERNAL_ONLY

    def __init__(self, config: RolloutConfig, module: torch.nn.Module, tokenizer):
        self.config = RolloutConfig.from_config(config)
        self.module = module
        self.tokenizer = tokenizer
        eos: list[int] = []
        generation_config = getattr(module, "generation_config", None)
        for candidate in (getattr(generation_config, "eos_token_id", None),
                          getattr(tokenizer, "eos_token_id", None)):
            for token in [candidate] if isinstance(candidate, int) else list(candidate or []):
                if token not in eos:
                    eos.append(int(token))
        # Rows stop at any eos of the model's generation_config or the tokenizer (Qwen2.5-Instruct
        # lists two there, and the tokenizer names one of them).
        self.default_eos_token_ids = eos
        self.default_pad_token_id = getattr(tokenizer, "pad_token_id", None)

    def sampling_params(self, meta_info: dict) -> SamplingParams:
        return resolve_sampling_params(self.config, meta_info, self.default_eos_token_ids, self.default_pad_token_id)

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample responses for left-padded prompts; the output is described in
        :func:`build_rollout_output`."""

    def generate_episodes(self, prompts: DataProto, on_turn: TurnHandler) -> EpisodeTokens:
        """Multi-turn generation: ``n`` episodes per left-padded prompt (rows ``i*n + j``), each a response
        of at most ``response_length`` tokens made of turns the model generates and continuations the
        caller supplies.

        A turn ends at an eos or when the response budget is used up. Then
        ``on_turn(row, turn_ids, turn_log_probs, used)`` (``used``: the row's response tokens so far) returns
        a future; its result is the continuation (e.g. a tool result and the next assistant prompt, as
        token ids) to append before the model's next turn, or None/[] to end the episode. An episode
        also ends when the continuation leaves no room for a generated token.

        This default runs rounds over :meth:`generate_sequences`, which keeps nothing between calls: each
        round generates the next turn of every episode whose continuation is ready, re-reading its whole
        context, in one call per group of episodes that have used similar parts of the budget. Engines
        that can keep an episode's cache between turns override it (the native engine does)."""
        params = self.sampling_params(prompts.meta_info)
        check_left_padded(prompts.batch["attention_mask"])
        n, budget, pad = params.n, params.response_length, params.pad_token_id
        contexts = [ids[mask.bool()].tolist() for ids, mask in zip(prompts.batch["input_ids"].cpu(),
                                                                    prompts.batch["attention_mask"].cpu())]
        rows = len(contexts) * n
        tokens: list[list[int]] = [[] for _ in range(rows)]
        generated: list[list[int]] = [[] for _ in range(rows)]
        log_probs: list[list[float]] = [[] for _ in range(rows)]
        active, round_index = list(range(rows)), 0
        while active:
            futures = {}
            for group_index, group in enumerate(budget_groups(active, [len(t) for t in tokens], budget)):
                meta = {**prompts.meta_info, "n": 1, "response_length": max(budget - len(tokens[r]) for r in group)}
                if prompts.meta_info.get("seed") is not None:  # each call its own draws
                    meta["seed"] = int(prompts.meta_info["seed"]) + 1_000_003 * round_index + group_index
                out = self.generate_sequences(left_padded([contexts[r // n] + tokens[r] for r in group], pad, meta))
                for i, r in enumerate(group):
                    room = budget - len(tokens[r])
                    valid = min(int(out.batch["response_mask"][i].sum()), room)
                    ids = out.batch["responses"][i, :valid].tolist()
                    lps = out.batch["rollout_log_probs"][i, :valid].tolist()
                    tokens[r] += ids
                    generated[r] += [1] * len(ids)
                    log_probs[r] += lps
                    futures[r] = on_turn(r, ids, lps, len(tokens[r]))
            round_index += 1
            wait_for_continuations(list(futures.values()), concurrent.futures.FIRST_EXCEPTION)
            active = []
            for r, future in futures.items():
                more = list(future.result() or [])
                if more and len(tokens[r]) + len(more) < budget:
                    tokens[r] += more
                    generated[r] += [0] * len(more)
                    log_probs[r] += [0.0] * len(more)
                    active.append(r)
        return EpisodeTokens.from_lists(tokens, generated, log_probs, budget, pad)


def wait_for_continuations(futures: list, return_when=concurrent.futures.FIRST_COMPLETED) -> float:
    """``concurrent.futures.wait`` that raises the first failure at once (not after the slowest tool) and
    says every minute how many episodes still wait (a tool that never returns would otherwise hang the
    rollout silently). Returns the seconds waited."""
    tic = time.perf_counter()
    while futures:
        done, not_done = concurrent.futures.wait(futures, timeout=60.0, return_when=return_when)
        for future in done:
            if not future.cancelled() and future.exception() is not None:
                raise future.exception()
        if done if return_when == concurrent.futures.FIRST_COMPLETED else not not_done:
            return time.perf_counter() - tic
        logger.warning("rollout: %d episode(s) have waited %.0f s for their tool results or user replies "
                       "(a tool without a timeout?)", len(not_done), time.perf_counter() - tic)
    return 0.0


# on_turn(row, turn_ids, turn_log_probs, used) -> future of the continuation ids (None/[]: the episode ends)
TurnHandler = Callable[[int, list, list, int], "concurrent.futures.Future"]


@dataclass
class EpisodeTokens:
    """What :meth:`BaseRollout.generate_episodes` returns, ``(rows, response_length)`` each:
    ``responses`` (pad after ``lengths``), ``generated`` (1 on the model's own tokens, 0 on
    continuations and padding), ``log_probs`` (float32, 0 where ``generated`` is 0), and ``lengths``
    ``(rows,)``."""

    responses: torch.Tensor
    generated: torch.Tensor
    log_probs: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def from_lists(cls, tokens, generated, log_probs, length: int, pad: int) -> EpisodeTokens:
        rows = len(tokens)
        out = cls(torch.full((rows, length), pad, dtype=torch.long), torch.zeros((rows, length), dtype=torch.long),
                  torch.zeros((rows, length), dtype=torch.float32), torch.tensor([len(t) for t in tokens]))
        for r in range(rows):
            if tokens[r]:
                out.responses[r, :len(tokens[r])] = torch.tensor(tokens[r])
                out.generated[r, :len(tokens[r])] = torch.tensor(generated[r])
                out.log_probs[r, :len(tokens[r])] = torch.tensor(log_probs[r], dtype=torch.float32)
        return out


def budget_groups(rows: list[int], used: list[int], budget: int) -> list[list[int]]:
    """``rows`` in engine calls whose members have used similar parts of the response budget (within a
    quarter of it): a call runs ``longest context + largest room left`` tokens, so mixing an episode near
    its end with a fresh one would size it near prompt + 2x the response budget."""
    spread = max(1, budget // 4)
    groups: list[list[int]] = []
    for r in sorted(rows, key=lambda r: used[r]):
        if groups and used[r] - used[groups[-1][0]] <= spread:
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups


def check_left_padded(attention_mask: torch.Tensor) -> None:
    """Raise unless every row is padding (0s) followed by prompt tokens (1s), with at least one token."""
    mask = attention_mask.bool()
    bad = (mask[:, :-1] & ~mask[:, 1:]).any(dim=1)
    if bad.any():
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"prompts must be left-padded, but row {row} of attention_mask has padding after "
                         "prompt tokens. Pad prompts on the left (the RL dataset does, up to "
                         "data.max_prompt_length; set tokenizer.padding_side='left' if you tokenize yourself).")
    empty = ~mask.any(dim=1)
    if empty.any():
        raise ValueError(f"row {int(empty.nonzero()[0, 0])} of the prompts has no token (attention_mask is all 0)")


def build_rollout_output(prompts: DataProto, responses: torch.Tensor, log_probs: torch.Tensor,
                         params: SamplingParams) -> DataProto:
    """Assemble the rollout output from the sampled tokens.

    ``responses`` and ``log_probs`` are ``(B*n, L)``: row ``i*n + j`` is sample ``j`` of prompt ``i``,
    each token followed by whatever the engine wrote after it stopped. They are cut or padded to
    ``R = params.response_length``; everything after a row's first eos becomes ``pad_token_id``
    (log-prob 0), the eos itself is kept.

    Returns ``B*n`` rows with batch keys ``prompts`` (B*n, P), ``responses`` (B*n, R),
    ``input_ids`` (B*n, P+R), ``attention_mask`` (B*n, P+R), ``position_ids`` (B*n, P+R),
    ``response_mask`` (B*n, R) and ``rollout_log_probs`` (B*n, R, float32); the non-tensor columns
    repeated interleaved; ``meta_info`` copied.
    """
    n, length = params.n, params.response_length
    prompt_ids = prompts.batch["input_ids"]
    device = prompt_ids.device
    responses = responses.to(device)
    log_probs = log_probs.to(device=device, dtype=torch.float32)
    if responses.shape[1] < length:
        extra = length - responses.shape[1]
        responses = torch.nn.functional.pad(responses, (0, extra), value=params.pad_token_id)
        log_probs = torch.nn.functional.pad(log_probs, (0, extra), value=0.0)
    responses, log_probs = responses[:, :length], log_probs[:, :length]

    is_eos = torch.isin(responses, torch.tensor(params.eos_token_ids, dtype=responses.dtype, device=device))
    after_eos = (torch.cumsum(is_eos.int(), dim=1) - is_eos.int()) > 0
    response_mask = (~after_eos).to(prompts.batch["attention_mask"].dtype)
    responses = responses.masked_fill(after_eos, params.pad_token_id)
    log_probs = log_probs.masked_fill(after_eos, 0.0)

    def rep(t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(n, dim=0)

    prompt_ids = rep(prompt_ids)
    prompt_positions = rep(prompts.batch["position_ids"])
    # Positions keep counting over the padding after eos (those tokens are masked out anyway).
    steps = torch.arange(1, length + 1, device=device, dtype=prompt_positions.dtype)
    response_positions = prompt_positions[..., -1:] + steps
    return DataProto(
        batch={"prompts": prompt_ids, "responses": responses, "input_ids": torch.cat([prompt_ids, responses], dim=1),
               "attention_mask": torch.cat([rep(prompts.batch["attention_mask"]), response_mask], dim=1),
               "position_ids": torch.cat([prompt_positions, response_positions], dim=-1),
               "response_mask": response_mask, "rollout_log_probs": log_probs},
        non_tensor_batch={k: np.repeat(v, n, axis=0) for k, v in prompts.non_tensor_batch.items()},
        meta_info=dict(prompts.meta_info))
