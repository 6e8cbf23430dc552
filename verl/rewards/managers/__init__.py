"""Reward managers turn a batch of generated responses into token-level reward tensors.

Every manager is called as ``manager(data, return_dict=False)`` on a ``DataProto`` holding
``prompts``, ``responses`` and ``attention_mask``, and puts each sample's score on its last valid
response token.
"""

from verl.rewards.managers.batch import BatchRewardManager
from verl.rewards.managers.dapo import DAPORewardManager
from verl.rewards.managers.naive import NaiveRewardManager
from verl.rewards.managers.prime import PrimeRewardManager
from verl.rewards.managers.registry import get_reward_manager_cls, register, registered_reward_managers

__all__ = ["BatchRewardManager", "DAPORewardManager", "NaiveRewardManager", "PrimeRewardManager",
           "get_reward_manager_cls", "register", "registered_reward_managers"]
