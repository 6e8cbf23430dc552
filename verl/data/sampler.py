"""A resumable sampler and data loader: a checkpoint taken mid-epoch resumes at the very next batch."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from verl.data.rl_dataset import collate_fn
from verl.trainer.config.config import DataConfig


class ResumableSampler(Sampler[int]):
    """Sequential or seeded-shuffled indices that remember where they are.

    With ``shuffle``, epoch ``e`` is ``torch.randperm(n)`` under seed ``seed + e``, so the order of
    every epoch is fixed by the seed alone. The state is (epoch, position): ``position`` indices of
    the current epoch have been handed out, and iteration continues from there. Finishing an epoch
    moves to the next one at position 0.
    """

    def __init__(self, num_samples: int, shuffle: bool = True, seed: int = 1):
        self.num_samples = num_samples
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.position = 0

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_samples))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_samples, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        order = self._order()
        while self.position < self.num_samples:
            # Advance before yielding: once the consumer holds an index, the state already points past it.
            self.position += 1
            yield order[self.position - 1]
        self.epoch += 1
        self.position = 0

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning; the current epoch is left as is, so resuming is safe."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.position = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.seed = int(state["seed"])


def create_rl_sampler(data_config, dataset: Dataset) -> ResumableSampler:
    """The training sampler: shuffled per epoch when ``data.shuffle``, with seed ``data.seed`` (``data_config``:
    a `DataConfig`, or a dict of its keys). Epoch 0's order is the original's (``RandomSampler`` over a generator
    seeded with ``data.seed``). The original's own sampler classes (``data.sampler.class_path``) are not
    implemented: setting one raises NotImplementedError."""
    data_config = DataConfig.from_config(data_config)
    class_path = (data_config.sampler or {}).get("class_path")
    if class_path:
        raise NotImplementedError(f"data.sampler.class_path={class_path!r}: custom samplers are not implemented in "
                                  "this verl; remove data.sampler.class_path (data.shuffle and data.seed choose the "
                                  "built-in sampler's order)")
    return ResumableSampler(len(dataset), shuffle=data_config.shuffle, seed=int(data_config.seed))


class StatefulDataLoader(DataLoader):
    """A DataLoader over a :class:`ResumableSampler` whose ``state_dict`` records consumed batches.

    The state counts batches handed to the caller, not indices the sampler has produced, so it is
    exact even when worker processes fetch batches ahead. A new pass over the loader starts from
    that state, so a pass abandoned with ``break`` resumes at its next unconsumed batch.
    """

    def __init__(self, dataset: Dataset, batch_size: int, sampler: ResumableSampler, **kwargs):
        # Its own generator: a plain DataLoader draws a seed from the global torch RNG at every pass,
        # which would shift the sampling of everything else in the process after a resume.
        kwargs.setdefault("generator", torch.Generator().manual_seed(sampler.seed))
        kwargs.setdefault("drop_last", True)
        kwargs.setdefault("collate_fn", collate_fn)
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, **kwargs)
        self._pass_start: dict | None = None
        self._batches_consumed = 0

    def __iter__(self):
        self.sampler.load_state_dict(self.state_dict())
        self._pass_start = self.sampler.state_dict()
        self._batches_consumed = 0
        for batch in super().__iter__():
            self._batches_consumed += 1
            yield batch
        self._pass_start = None

    def state_dict(self) -> dict:
        if self._pass_start is None:
            return self.sampler.state_dict()
        position = self._pass_start["position"] + self._batches_consumed * self.batch_size
        return {**self._pass_start, "position": min(position, self.sampler.num_samples)}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)
        self._pass_start = None


# The name the trainers use; the loader drops the last partial batch and collates with ``collate_fn`` by default.
make_dataloader = StatefulDataLoader
