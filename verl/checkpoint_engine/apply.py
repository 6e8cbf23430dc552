"""Copying received weights into the rollout's model, with errors that name the weight at fault."""

from collections.abc import Iterable

import torch

_SAME_MODEL = "the trainer and the rollout must load the same model: check actor_rollout_ref.model.path on both sides"


class WeightLoader:
    """Copies weights into a module as they arrive, bucket by bucket, then checks that none was left out.

    Pass it as ``WeightSyncGroup.receive(on_bucket=loader)`` so each bucket is applied as soon as it lands and the
    rollout never holds a second copy of the model; :meth:`finish` then catches a weight that never came, which
    would otherwise keep its stale value in silence. Targets are the module's state dict (parameters and persistent
    buffers); tied weights count as received under any of their names. Values are cast to the target's dtype, so
    fp32 trainer weights can fill a bf16 rollout model.
    """

    def __init__(self, module: torch.nn.Module):
        self._model = type(module).__name__
        self._targets = module.state_dict(keep_vars=True)
        self._filled: set[int] = set()

    @torch.no_grad()
    def __call__(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:
            target = self._targets.get(name)
            if target is None:
                raise ValueError(f"received weight {name!r} is not a parameter or buffer of the rollout's "
                                 f"{self._model} (its first names: {list(self._targets)[:3]}): {_SAME_MODEL}")
            if target.shape != tensor.shape:
                raise ValueError(f"received weight {name!r} has shape {tuple(tensor.shape)}, the rollout's "
                                 f"{self._model} has {tuple(target.shape)}: {_SAME_MODEL}")
            target.copy_(tensor)
            self._filled.add(id(target))

    def finish(self) -> None:
        missing = [name for name, target in self._targets.items() if id(target) not in self._filled]
        if missing:
            raise ValueError(f"{len(missing)} weight(s) of the rollout's {self._model} were not received, e.g. "
                             f"{missing[:3]}; they would keep stale values. {_SAME_MODEL}, and that the trainer sends "
                             "every parameter and persistent buffer")


def apply_weights(module: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copies every (name, tensor) into the module's parameter or buffer of that name; all of them must come."""
    loader = WeightLoader(module)
    loader(named_tensors)
    loader.finish()
