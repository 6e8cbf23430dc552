"""``fsdp_config`` of the actor, the reference, the critic and the reward model: how FSDP2 shards a model."""

from __future__ import annotations

from verl.base_config import BaseConfig, section

__all__ = ["FSDPConfig", "FSDPEngineConfig"]


@section("actor_rollout_ref.actor.fsdp_config", shared=True)
class FSDPConfig(BaseConfig):
    """FSDP2 settings. The reference's group has only wrap_policy, param_offload, reshard_after_forward,
    forward_prefetch and the dtypes; another field set there is reported as an unknown key."""

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


FSDPEngineConfig = FSDPConfig  # the original's name
