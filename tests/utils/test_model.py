import numpy as np
import pytest
import torch

from verl.utils.model import compute_position_id_with_mask, create_random_mask


def test_position_ids_from_a_mask():
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]])
    assert compute_position_id_with_mask(mask).tolist() == [[0, 0, 1, 1], [0, 1, 2, 3]]


def test_create_random_mask_follows_numpys_seeded_draws():
    ids = torch.zeros(3, 10, dtype=torch.long)
    np.random.seed(0)
    mask = create_random_mask(ids, max_ratio_of_valid_token=0.6, max_ratio_of_left_padding=0.3,
                              min_ratio_of_valid_token=0.2)
    # Per row: left padding in [0, 3], then valid tokens in [2, 6] (bounds of 10*0.3, 10*0.2, 10*0.6).
    np.random.seed(0)
    for row in mask.tolist():
        left = np.random.randint(0, 4, dtype=np.int64)
        valid = np.random.randint(2, 7, dtype=np.int64)
        assert row == [0] * left + [1] * valid + [0] * (10 - left - valid)
    assert mask.dtype == torch.int64


def test_create_random_mask_rejects_impossible_ratios():
    ids = torch.zeros(1, 10, dtype=torch.long)
    with pytest.raises(ValueError, match="max_ratio_of_valid_token"):
        create_random_mask(ids, 0.0, 0.1)
    with pytest.raises(ValueError, match="do not fit"):
        create_random_mask(ids, 0.8, 0.5)  # 8 valid after up to 5 padding > 10
