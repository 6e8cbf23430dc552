"""``fsdp_config`` of the actor, the reference, the critic and the reward model: how FSDP2 shards a model."""

from __future__ import annotations

from verl.base_config import BaseConfig, section

__all__ = ["FSDPConfig", "FSDPEngineConfig"]


@section("actor_rollout_ref.actor.fsdp_config", shared=True)
class FSDPConfig(BaseConfig):
    """FSDP2 settings. The reference's group has only wrap_policy, the offloads, reshard_after_forward,
    forward_prefetch, the dtypes and two accepted keys of the original; another field set there is reported as
    an unknown key."""

    wrap_policy: dict
    param_offload: bool
    optimizer_offload: bool
    offload_policy: bool
    reshard_after_forward: bool
    fsdp_size: int
    forward_prefetch: bool
    model_dtype: str
    dtype: str | None
    mixed_precision: dict | None
    # The original's keys that have no effect here (unused_keys.py warns when one is set):
    use_orig_params: bool
    ulysses_sequence_parallel_size: int
    entropy_from_logits_with_chunking: bool
    entropy_checkpointing: bool


FSDPEngineConfig = FSDPConfig  # the original's name
