"""Small tensor helpers about models' inputs: random padding masks for tests, position ids from a mask."""

from __future__ import annotations

import numpy as np
import torch


def create_random_mask(input_ids: torch.Tensor, max_ratio_of_valid_token: float, max_ratio_of_left_padding: float,
                       min_ratio_of_valid_token: float = 0) -> torch.Tensor:
    """A random (B, S) int64 attention mask for ``input_ids`` (B, S): per row, first a number of left-padding
    zeros in [0, S·max_ratio_of_left_padding], then a number of ones in [max(1, S·min_ratio_of_valid_token),
    S·max_ratio_of_valid_token], then right-padding zeros (bounds rounded down, both ends included).

    Draws from numpy's global generator, two ``np.random.randint`` calls per row, so ``np.random.seed``
    fixes the masks (the same masks as the original's for the same seed).
    """
    if not 0 < max_ratio_of_valid_token <= 1:
        raise ValueError("create_random_mask: max_ratio_of_valid_token must be in (0, 1], "
                         f"got {max_ratio_of_valid_token}")
    if not 0 <= max_ratio_of_left_padding < 1:
        raise ValueError("create_random_mask: max_ratio_of_left_padding must be in [0, 1), "
                         f"got {max_ratio_of_left_padding}")
    if min_ratio_of_valid_token > max_ratio_of_valid_token:
        raise ValueError("create_random_mask: min_ratio_of_valid_token is above max_ratio_of_valid_token")
    batch_size, length = input_ids.shape
    max_valid = int(length * max_ratio_of_valid_token)
    min_valid = max(1, int(length * min_ratio_of_valid_token))
    max_left = int(length * max_ratio_of_left_padding)
    if max_valid < 1 or max_valid + max_left > length:
        raise ValueError(f"create_random_mask: {max_valid} valid tokens after up to {max_left} padding tokens "
                         f"do not fit a row of {length}")
    mask = torch.zeros_like(input_ids, dtype=torch.int64)
    for row in range(batch_size):
        left = int(np.random.randint(low=0, high=max_left + 1, dtype=np.int64))
        valid = int(np.random.randint(low=min_valid, high=max_valid + 1, dtype=np.int64))
        mask[row, left:left + valid] = 1
    return mask


def compute_position_id_with_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a padded batch: 0, 1, 2, ... over each row's valid tokens, 0 on its left padding and
    the last valid position repeated over its right padding: mask [0, 1, 1, 0] -> [0, 0, 1, 1]."""
    return torch.clamp(torch.cumsum(mask, dim=-1) - 1, min=0)
