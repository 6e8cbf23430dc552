"""verl: reinforcement-learning post-training for large language models (HybridFlow design)."""

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

# Import paths of the original verl (users' code imports these) -> where the code lives here. A module
# imported under an old path is the same module object as under its new one (one registry, one state).
MOVED = {
    "verl.trainer.ppo.core_algos": "verl.algorithms",
    "verl.trainer.ppo.reward": "verl.rewards.loading",
    "verl.trainer.ppo.rollout_corr_helper": "verl.algorithms.rollout_correction",
    "verl.utils.reward_score": "verl.rewards.scorers",
    "verl.utils.dataset": "verl.data",
    "verl.workers.reward_manager": "verl.rewards.managers",
    "verl.single_controller.base": "verl.single_controller",
    "verl.single_controller.ray.base": "verl.single_controller.ray",
}

__all__ = ["DataProto", "__version__"]


def __getattr__(name):
    # ``from verl import DataProto`` as in the original, without making ``import verl`` load torch.
    if name == "DataProto":
        from verl.protocol import DataProto

        return DataProto
    raise AttributeError(f"module 'verl' has no attribute {name!r}")


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``<old path>[.sub]`` for every entry of :data:`MOVED` and hands back the module imported from
    its new path."""

    def __init__(self):
        self._real_specs = {}

    def find_spec(self, name, path=None, target=None):
        for old, new in MOVED.items():
            if name == old or name.startswith(old + "."):
                module = importlib.import_module(new + name[len(old):])
                return importlib.util.spec_from_loader(name, self, is_package=hasattr(module, "__path__"))
        return None

    def create_module(self, spec):
        old = next(o for o in MOVED if spec.name == o or spec.name.startswith(o + "."))
        module = sys.modules[MOVED[old] + spec.name[len(old):]]
        self._real_specs[spec.name] = module.__spec__  # the import machinery now puts this finder's on it
        return module

    def exec_module(self, module):
        # Executed already, under its new name: give it back its own spec (reload, importlib.resources).
        real = self._real_specs.pop(module.__spec__.name)
        module.__spec__, module.__loader__ = real, real.loader


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())  # before the path finder, which would load the files again
