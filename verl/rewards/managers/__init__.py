"""Reward managers turn a batch of generated responses into token-level reward tensors.

Every manager (an :class:`AbstractRewardManager`) is called as ``manager(data, return_dict=False)`` on a
``DataProto`` holding ``prompts``, ``responses`` and ``attention_mask``, and puts each sample's score on its
last valid response token. ``REWARD_MANAGER_REGISTRY`` maps the names of ``reward_model.reward_manager`` to them.
"""

from verl.rewards.managers.abstract import AbstractRewardManager
from verl.rewards.managers.batch import BatchRewardManager
from verl.rewards.managers.dapo import DAPORewardManager
from verl.rewards.managers.naive import NaiveRewardManager
from verl.rewards.managers.prime import PrimeRewardManager
from verl.rewards.managers.registry import (
    REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register, registered_reward_managers
)

__all__ = ["REWARD_MANAGER_REGISTRY", "AbstractRewardManager", "BatchRewardManager", "DAPORewardManager",
           "NaiveRewardManager", "PrimeRewardManager", "get_reward_manager_cls", "register",
           "registered_reward_managers"]
