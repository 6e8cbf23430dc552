"""Prompt datasets, batching and resumable sampling for RL training.

Names are imported lazily so that light users of this package (the preprocessing scripts read
``local_files``) do not pay for importing torch.
"""

from verl.utils.lazy import lazy_exports

_EXPORTS = {
    "DatasetError": ".rl_dataset",
    "RLHFDataset": ".rl_dataset",
    "SFTDataset": ".sft_dataset",
    "collate_fn": ".rl_dataset",
    "ResumableSampler": ".sampler",
    "StatefulDataLoader": ".sampler",
    "create_rl_sampler": ".sampler",
    "make_dataloader": ".sampler",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
