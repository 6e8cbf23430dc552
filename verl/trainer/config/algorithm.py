"""``algorithm``: advantage estimation and KL regularisation."""

from __future__ import annotations

from dataclasses import InitVar, replace
from typing import ClassVar

from verl.base_config import BaseConfig, section

__all__ = ["AlgoConfig", "FilterGroupsConfig", "KLControlConfig", "PPOAlgorithmConfig", "RolloutCorrectionConfig"]


@section("algorithm.kl_ctrl")
class KLControlConfig(BaseConfig):
    """The coefficient of the KL penalty in the reward: fixed, or adaptive towards `target_kl`."""

    type: str
    kl_coef: float
    horizon: int
    target_kl: float


@section("algorithm.filter_groups")
class FilterGroupsConfig(BaseConfig):
    """DAPO's dynamic sampling: drop prompt groups whose samples all have the same `metric`."""

    enable: bool
    metric: str | None
    max_num_gen_batches: int


@section("algorithm.rollout_correction")
class RolloutCorrectionConfig(BaseConfig):
    """Importance weights and rejection for samples another policy version (or the rollout's numerics) generated:
    see :mod:`verl.algorithms.rollout_correction`."""

    rollout_is: str | None
    rollout_is_threshold: float
    rollout_is_batch_normalize: bool
    rollout_rs: str | None
    rollout_rs_threshold: str | float | None
    bypass_mode: bool
    loss_type: str

    @property
    def enabled(self) -> bool:
        """Whether anything is computed from the rollout's log-probs (weights, rejection, or bypass mode)."""
        return self.rollout_is is not None or self.rollout_rs is not None or self.bypass_mode


@section("algorithm")
class PPOAlgorithmConfig(BaseConfig):
    """Advantage estimation and KL regularisation.

    `kl_coef` is a shorthand for ``kl_ctrl.kl_coef`` (the in-reward KL coefficient, applied when
    `use_kl_in_reward` is true); giving both with different values is an error.
    """

    ALIASES: ClassVar[dict[str, str]] = {"kl_coef": "kl_ctrl.kl_coef"}

    adv_estimator: str
    gamma: float
    lam: float
    norm_adv_by_std_in_grpo: bool
    use_kl_in_reward: bool
    kl_penalty: str
    kl_ctrl: KLControlConfig
    use_pf_ppo: bool
    pf_ppo: dict
    filter_groups: FilterGroupsConfig
    rollout_correction: RolloutCorrectionConfig
    kl_coef: InitVar[float | None] = None

    def __post_init__(self, extra: dict | None = None, kl_coef: float | None = None) -> None:
        super().__post_init__(extra)  # a kl_coef that disagrees with kl_ctrl.kl_coef is reported here
        if "kl_coef" in self._given:
            object.__setattr__(self, "kl_ctrl", replace(self.kl_ctrl, kl_coef=kl_coef))


AlgoConfig = PPOAlgorithmConfig  # the original's name
