"""The interface every reward manager follows (the original's ``AbstractRewardManager``): subclass it to write
your own and register it with ``@register("<name>")``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

import torch

__all__ = ["AbstractRewardManager", "RawRewardFn"]

RawRewardFn = Callable[..., Any]


class AbstractRewardManager(ABC):
    """Built as ``cls(tokenizer=..., num_examine=..., compute_score=..., reward_fn_key=..., **reward_kwargs)``
    (``compute_score``: the user's ``custom_reward_function``, else the rule rewards) and called as
    ``manager(data, return_dict=False)`` on a ``DataProto`` of generated responses. It returns the (batch,
    response_length) reward tensor, or with ``return_dict`` ``{"reward_tensor": ..., "reward_extra_info": {key:
    one value per sample}}``."""

    @abstractmethod
    def __init__(self, tokenizer: Any, num_examine: int, compute_score: RawRewardFn | None,
                 reward_fn_key: str = "data_source", **kwargs: Any) -> None: ...

    @abstractmethod
    def __call__(self, data, return_dict: bool = False) -> torch.Tensor | dict[str, Any]: ...
