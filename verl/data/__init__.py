"""Prompt datasets, batching and resumable sampling for RL training.

Names are imported lazily so that light users of this package (the preprocessing scripts read
``local_files``) do not pay for importing torch.
"""

import importlib

_EXPORTS = {
    "DatasetError": "rl_dataset",
    "RLHFDataset": "rl_dataset",
    "SFTDataset": "sft_dataset",
    "collate_fn": "rl_dataset",
    "ResumableSampler": "sampler",
    "StatefulDataLoader": "sampler",
    "create_rl_sampler": "sampler",
    "make_dataloader": "sampler",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
