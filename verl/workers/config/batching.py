"""How a role's batch is split on one rank: rows per optimizer step, and micro-batches by rows or by tokens.

Batch sizes in the config count prompts and are global; per rank they become
``ppo_mini_batch_size x rollout.n / world_size`` rows per optimizer step. Micro-batches are
``*_micro_batch_size_per_gpu`` rows (the deprecated global ``*_micro_batch_size`` is divided by the world
size), or, when the role sizes them by tokens (``use_dynamic_bsz``, or unset with packed forwards), as many
rows as fit ``*_max_token_len_per_gpu`` tokens. The workers, the memory estimate, the config checks and the
driver's run spec all derive these numbers here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from verl.workers.config.actor import ActorRolloutRefConfig
from verl.workers.config.critic import CriticConfig
from verl.workers.config.reward_model import RewardModelConfig

__all__ = ["Batching", "CriticBatching", "POLICY_PHASES", "PolicyBatching", "critic_batching", "micro_batching",
           "micro_rows_per_device", "per_rank_mini_batch", "policy_batching", "policy_phase", "reward_model_batching",
           "uses_token_budget"]


class Batching(NamedTuple):
    """The micro-batches of one phase on one rank: ``micro_batch_size`` rows each, or as many rows as fit
    ``max_token_len`` tokens (exactly one of the two is set)."""

    micro_batch_size: int | None
    max_token_len: int | None


@dataclass(frozen=True)
class PolicyBatching:
    """The policy's phases on one rank; a phase the worker's role does not run is None."""

    mini_batch_size: int | None  # rows per optimizer step
    update: Batching | None
    log_prob: Batching | None
    ref_log_prob: Batching | None


@dataclass(frozen=True)
class CriticBatching:
    mini_batch_size: int
    update: Batching
    forward: Batching


def uses_token_budget(use_dynamic_bsz: bool | None, remove_padding: bool) -> bool:
    """Whether a role sizes its micro-batches by a token budget: ``use_dynamic_bsz`` when set, else
    (null, the default) whenever its forwards are packed (``use_remove_padding``), since packed
    memory grows with tokens, not rows."""
    return bool(remove_padding) if use_dynamic_bsz is None else bool(use_dynamic_bsz)


def micro_rows_per_device(per_gpu: int | None, global_value: int | None, world_size: int) -> int | None:
    """Rows per micro-batch on one device: ``*_per_gpu``, else the deprecated global value split over the
    devices (at least 1), else None."""
    if per_gpu is not None:
        return per_gpu
    if global_value is not None:
        return max(int(global_value) // world_size, 1)
    return None


def per_rank_mini_batch(prompts: int, rollout_n: int, world_size: int, where: str) -> int:
    """Rows per optimizer step on one rank: ``<where>.ppo_mini_batch_size`` (prompts) x n / world size."""
    if not isinstance(prompts, int) or prompts <= 0:
        raise ValueError(f"{where}.ppo_mini_batch_size must be a positive number of prompts, got {prompts!r}")
    rows = prompts * rollout_n
    if rows % world_size:
        raise ValueError(f"{where}.ppo_mini_batch_size ({prompts}) x rollout.n ({rollout_n}) = {rows} sequences "
                         f"cannot be split evenly over {world_size} ranks; make it a multiple of {world_size}")
    return rows // world_size


def micro_batching(section, where: str, name: str, world_size: int, *, dynamic_key: str, token_key: str,
                   remove_padding: bool) -> Batching:
    """One phase's micro-batches: a token budget ``<where>.<token_key>`` when the phase is sized by tokens
    (:func:`uses_token_budget` of ``<where>.<dynamic_key>``), else ``<where>.<name>_per_gpu`` rows (or the
    deprecated global ``<where>.<name>`` divided by the world size)."""
    if uses_token_budget(getattr(section, dynamic_key), remove_padding):
        budget = getattr(section, token_key)
        if not isinstance(budget, int) or budget <= 0:
            raise ValueError(f"{where}.{dynamic_key}=true needs {where}.{token_key} > 0 tokens, got {budget!r}")
        return Batching(None, budget)
    per_gpu = micro_rows_per_device(getattr(section, f"{name}_per_gpu"), getattr(section, name), world_size)
    if not isinstance(per_gpu, int) or per_gpu <= 0:
        raise ValueError(f"{where}.{name}_per_gpu is not set (got {per_gpu!r}): set it to the sequences per device "
                         f"per forward pass, e.g. {where}.{name}_per_gpu=4, or set {where}.{dynamic_key}=true")
    return Batching(per_gpu, None)


# A policy phase -> (the section holding its keys, its micro-batch key, its dynamic flag, its token budget).
POLICY_PHASES = {
    "update": ("actor", "ppo_micro_batch_size", "use_dynamic_bsz", "ppo_max_token_len_per_gpu"),
    "log_prob": ("rollout", "log_prob_micro_batch_size", "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu"),
    "ref_log_prob": ("ref", "log_prob_micro_batch_size", "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu"),
}


def policy_phase(config: ActorRolloutRefConfig, phase: str, world_size: int) -> Batching:
    """One of the policy's :data:`POLICY_PHASES` on one of ``world_size`` ranks."""
    where, name, dynamic_key, token_key = POLICY_PHASES[phase]
    return micro_batching(getattr(config, where), f"actor_rollout_ref.{where}", name, world_size,
                          dynamic_key=dynamic_key, token_key=token_key, remove_padding=config.model.use_remove_padding)


def policy_batching(config: ActorRolloutRefConfig, world_size: int, *, actor: bool = True,
                    reference: bool = True) -> PolicyBatching:
    """The policy's batching on one of ``world_size`` ranks (the actor's phases only with ``actor``, the
    reference's only with ``reference``)."""
    mini = per_rank_mini_batch(config.actor.ppo_mini_batch_size, config.rollout.n, world_size,
                               "actor_rollout_ref.actor") if actor else None
    return PolicyBatching(mini_batch_size=mini, update=policy_phase(config, "update", world_size) if actor else None,
                          log_prob=policy_phase(config, "log_prob", world_size) if actor else None,
                          ref_log_prob=policy_phase(config, "ref_log_prob", world_size) if reference else None)


def critic_batching(config: CriticConfig, world_size: int) -> CriticBatching:
    """The critic's batching on one of ``world_size`` ranks (``critic.rollout_n`` samples per prompt)."""
    def phase(name, token_key):
        return micro_batching(config, "critic", name, world_size, dynamic_key="use_dynamic_bsz", token_key=token_key,
                              remove_padding=config.model.use_remove_padding)

    return CriticBatching(
        mini_batch_size=per_rank_mini_batch(config.ppo_mini_batch_size, config.rollout_n, world_size, "critic"),
        update=phase("ppo_micro_batch_size", "ppo_max_token_len_per_gpu"),
        forward=phase("forward_micro_batch_size", "forward_max_token_len_per_gpu"))


def reward_model_batching(config: RewardModelConfig, world_size: int) -> Batching:
    return micro_batching(config, "reward_model", "micro_batch_size", world_size, dynamic_key="use_dynamic_bsz",
                          token_key="forward_max_token_len_per_gpu", remove_padding=config.model.use_remove_padding)
