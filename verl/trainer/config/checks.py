"""The checks `verl.trainer.config_validation.validate_config` runs on a resolved trainer config.

Each check is a small function ``check_x(run) -> Iterable[Issue]`` listed in
``verl.trainer.config_validation.CHECKS``; an `Issue` is an error or a warning about one dotted key
whose message says what is wrong and how to fix it. Keys nothing reads are checked in
``unused_keys.py``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import os
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl.algorithms import (
    KL_PENALTY_TYPES, LOSS_AGG_MODES, get_adv_estimator_fn, get_policy_loss_fn, registered_adv_estimators,
    registered_policy_losses
)
from verl.base_config import BaseConfig, at, type_hints
from verl.rewards.managers import get_reward_manager_cls, registered_reward_managers
from verl.trainer.config.compose import dotted_keys
from verl.trainer.config.spec import RunSpec, need_critic, need_reference_policy, worker_backend
from verl.utils.tracking import BACKEND_PACKAGES, BACKENDS
from verl.workers.rollout.registry import check_rollout_name

LR_SCHEDULERS = ("constant", "cosine")
# Estimators whose baseline comes from the other samples of the same prompt.
GROUP_ESTIMATORS = ("grpo", "rloo", "grpo_passk", "opo")

AR = "actor_rollout_ref"
ACTOR, REF, ROLLOUT = f"{AR}.actor", f"{AR}.ref", f"{AR}.rollout"

# Keys with a fixed set of values.
CHOICES: dict[str, tuple[str, ...]] = {
    "data.truncation": ("error", "left", "right", "middle"),
    f"{ACTOR}.loss_agg_mode": LOSS_AGG_MODES,
    "critic.loss_agg_mode": LOSS_AGG_MODES,
    f"{ACTOR}.optim.lr_scheduler_type": LR_SCHEDULERS,
    "critic.optim.lr_scheduler_type": LR_SCHEDULERS,
    f"{ROLLOUT}.mode": ("sync", "async"),
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    "algorithm.pf_ppo.reweight_method": ("pow", "max_min", "max_random"),
    "trainer.resume_mode": ("auto", "disable", "resume_path"),
    "trainer.device": ("cuda", "cpu"),
    "trainer.backend": ("auto", "ray", "local"),
    f"{AR}.model.fused_kernel_options.impl_backend": ("torch", "triton"),
}


@dataclass(frozen=True)
class Issue:
    key: str
    message: str  # what is wrong, then how to fix it
    warning: bool = False

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


def error(key: str, message: str) -> Issue:
    return Issue(key, message)


def warn(key: str, message: str) -> Issue:
    return Issue(key, message, warning=True)


def _lookup(tree: Any, key: str, default: Any = None) -> Any:
    try:
        return at(tree, key)
    except (KeyError, TypeError):  # a part missing, or a value where a group was expected
        return default


@dataclass
class Run:
    """The resolved config under check, its defaults, and the facts several checks derive from them."""

    cfg: dict  # resolved values
    defaults: dict  # resolved defaults of ppo_trainer.yaml
    raw: dict = field(default_factory=dict)  # unresolved values: tells which keys follow another via ${...}
    n_devices: int | None = None  # total devices the workers get
    n_devices_source: str = ""  # how n_devices was found, for messages
    bad_keys: set[str] = field(default_factory=set)  # keys with a wrong type: other checks read them as unset

    def get(self, key: str, default: Any = None) -> Any:
        return default if key in self.bad_keys else _lookup(self.cfg, key, default)

    def default(self, key: str) -> Any:
        return _lookup(self.defaults, key)

    def follows(self, key: str) -> bool:
        """Whether `key` is just another key's value (``${other.key}``) rather than set by itself."""
        value = _lookup(self.raw, key)
        return (isinstance(value, str) and value.startswith("${") and value.endswith("}")
                and value.count("${") == 1 and not value.startswith("${oc.env:"))

    @property
    def uses_critic(self) -> bool:
        return need_critic(self.get("critic.enable"), self.get("algorithm.adv_estimator"))

    @property
    def uses_ref(self) -> bool:
        return need_reference_policy(self.get("algorithm.use_kl_in_reward"), self.get(f"{ACTOR}.use_kl_loss"))

    @property
    def uses_reward_model(self) -> bool:
        return bool(self.get("reward_model.enable"))

    def own_pool(self, section: str) -> bool:
        """Whether ``section`` (critic, reward_model) runs on devices of its own."""
        return bool(self.get(f"{section}.enable_resource_pool"))

    def devices_for(self, section: str) -> tuple[int | None, str]:
        """(devices, how they were counted) of the pool the role of ``section`` runs on."""
        if section != ACTOR and self.own_pool(section):
            per_node, nodes = self.get(f"{section}.n_gpus_per_node"), self.get(f"{section}.nnodes")
            if _positive_int(per_node) and _positive_int(nodes):
                return per_node * nodes, f"{section}.n_gpus_per_node={per_node} x {section}.nnodes={nodes}"
            return None, ""
        return self.n_devices, self.n_devices_source


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _format(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(_format(v) for v in value) + "]"
    return str(value)


def _module_available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _not_in(key: str, value: Any, allowed: Sequence[str], what: str = "value") -> Issue:
    guess = difflib.get_close_matches(str(value), list(allowed), n=1, cutoff=0.6)
    hint = f"; did you mean {guess[0]}?" if guess else "."
    return error(key, f"{value!r} is not a known {what}{hint} Choose one of: {', '.join(allowed)}")


# ---- Types -------------------------------------------------------------------------------------------------------

_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               list: "a list, e.g. [a,b]", dict: "a group of keys"}


def _type_of(value: Any) -> type:
    return next((t for t in (bool, int, float, str, list, dict) if isinstance(value, t)), type(value))


@functools.cache
def declared_hint(key: str, root: Any = RunSpec) -> Any:
    """The type hint the typed config sections under ``root`` declare for dotted ``key`` (``root`` itself for
    ``""``), or None for a key they do not type (inside a free-form dict such as override_config)."""
    hint = root
    for part in key.split(".") if key else ():
        options = typing.get_args(hint) or (hint,)
        owner = next((t for t in options if dataclasses.is_dataclass(t)
                      and part in {f.name for f in dataclasses.fields(t)}), None)
        if owner is None:
            return None
        hint = type_hints(owner)[part]
    return hint


def declared_types(key: str, root: Any = RunSpec) -> tuple[tuple[type, ...], bool] | None:
    """``(types, nullable)`` the typed config sections under ``root`` declare for dotted ``key`` (a nested group
    counts as a dict), or None for a key they do not type (inside a free-form dict such as override_config)."""
    hint = declared_hint(key, root)
    if hint is None:
        return None
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    declared = tuple(dict.fromkeys(dict if isinstance(t, type) and issubclass(t, BaseConfig)
                                   else typing.get_origin(t) or t for t in options if t is not type(None)))
    return declared, type(None) in options


def _accepted_types(declared: tuple[type, ...], default: Any) -> tuple[type, ...]:
    accepted = list(declared)
    if float in declared:
        accepted.append(int)  # 1 where 1.0 is expected is fine
    if isinstance(default, str):
        accepted += [int, float]  # a name: Hydra parses experiment_name=2024 as a number
    return tuple(accepted)


def check_types(run: Run, root: Any = RunSpec) -> Iterator[Issue]:
    """Every value has a type the typed config sections under ``root`` declare (:func:`declared_types`), null
    only where they allow it; a key they do not type has its default's type (or any, for a null default).

    Ints are accepted where floats are expected; bool is not an int. Keys added with ``+`` are skipped.
    """
    yield from _check_types_under(run.cfg, run.defaults, "", root)


def _check_types_under(values: Mapping, defaults: Mapping, prefix: str, root: Any) -> Iterator[Issue]:
    for name, value in values.items():
        key = f"{prefix}{name}"
        if name not in defaults:
            continue
        default = defaults[name]
        if isinstance(default, Mapping) and isinstance(value, Mapping):
            yield from _check_types_under(value, default, f"{key}.", root)
            continue
        typed = declared_types(key, root) or (((_type_of(default),), True) if default is not None else None)
        if typed is None:
            continue
        declared, nullable = typed
        words = " or ".join(_TYPE_WORDS.get(t, t.__name__) for t in declared)
        example = f", e.g. {key}={_format(default)}" if default is not None and not isinstance(default, Mapping) else ""
        if value is None and not nullable:
            yield error(key, f"cannot be null: it needs {words}{example}")
        elif value is not None and _type_of(value) not in _accepted_types(declared, default):
            got = _TYPE_WORDS.get(_type_of(value), type(value).__name__)
            yield error(key, f"expected {words}, got {value!r} ({got}). Set a value of that type{example}")


# ---- Allowed values ----------------------------------------------------------------------------------------------


def check_choices(run: Run) -> Iterator[Issue]:
    """Keys with a fixed set of values (CHOICES), and the deprecated optim.warmup_style."""
    for key, allowed in CHOICES.items():
        value = run.get(key)
        if value is not None and value not in allowed:
            yield _not_in(key, value, allowed)
    for prefix in (ACTOR, "critic"):
        key = f"{prefix}.optim.warmup_style"
        value = run.get(key)
        if value is not None and value not in LR_SCHEDULERS:
            yield _not_in(key, value, LR_SCHEDULERS)
        elif value is not None:
            yield warn(key, f"is deprecated. Use {prefix}.optim.lr_scheduler_type={value} instead")


_REGISTERED_KEYS = (
    ("algorithm.adv_estimator", "advantage estimator", get_adv_estimator_fn, registered_adv_estimators),
    (f"{ACTOR}.policy_loss.loss_mode", "policy loss", get_policy_loss_fn, registered_policy_losses),
    ("reward_model.reward_manager", "reward manager", get_reward_manager_cls, registered_reward_managers),
)


def check_registered_names(run: Run) -> Iterator[Issue]:
    """Advantage estimator, policy loss and reward manager name something registered (imported lazily). A reward
    manager may be registered by the custom reward file, which is imported to look for it (as the run will)."""
    from verl.rewards.loading import find_reward_manager_cls

    custom_reward_path = run.get("custom_reward_function.path")
    lookups = {"reward_model.reward_manager": lambda name: find_reward_manager_cls(name, custom_reward_path)}
    for key, what, lookup, names in _REGISTERED_KEYS:
        value = run.get(key)
        if value is None:
            continue
        try:
            lookups.get(key, lookup)(value)
        except (KeyError, ValueError):
            yield _not_in(key, value, tuple(names()), what)
        except (ImportError, OSError) as e:  # a missing file is check_required's error
            if os.path.isfile(str(custom_reward_path)):
                yield error("custom_reward_function.path", f"{key}={value!r} is not a built-in {what}, and the "
                                                           f"file that may register it cannot be imported: {e}")


def check_kl_estimators(run: Run) -> Iterator[Issue]:
    """KL estimator names, optionally with a trailing + (value of the estimator, gradient of k2)."""
    for key in (f"{ACTOR}.kl_loss_type", "algorithm.kl_penalty"):
        value = run.get(key)
        if value is not None and value.removesuffix("+") not in KL_PENALTY_TYPES:
            yield _not_in(key, value, KL_PENALTY_TYPES, "KL estimator (a trailing + is allowed)")


def check_strategies(run: Run) -> Iterator[Issue]:
    """Training strategies are FSDP (fsdp and fsdp2 both mean FSDP2 here); Megatron is not shipped."""
    for key in (f"{ACTOR}.strategy", f"{REF}.strategy", "critic.strategy", "reward_model.strategy"):
        value = run.get(key)
        if value == "megatron":
            yield error(key, "the Megatron backend is not shipped; this verl trains with FSDP2 only. "
                             f"Set {key}=fsdp (or fsdp2; both mean FSDP2)")
        elif value is not None and value not in ("fsdp", "fsdp2"):
            yield _not_in(key, value, ("fsdp", "fsdp2"), "strategy")


def check_rollout_engine(run: Run) -> Iterator[Issue]:
    """rollout.name is a built-in engine; an external engine's name gets a message saying what to use."""
    key = f"{ROLLOUT}.name"
    name = run.get(key)
    if name is None:
        return
    try:
        check_rollout_name(name)
    except ValueError as e:
        yield error(key, str(e))


def check_loggers(run: Run) -> Iterator[Issue]:
    """trainer.logger entries are known backends whose packages are installed."""
    value = run.get("trainer.logger")
    for entry in [value] if isinstance(value, str) else (value or []):
        if entry not in BACKENDS:
            yield _not_in("trainer.logger", entry, BACKENDS, "logger")
        elif entry in BACKEND_PACKAGES and not _module_available(BACKEND_PACKAGES[entry]):
            package = BACKEND_PACKAGES[entry]
            yield error("trainer.logger", f"{entry!r} is listed but the {package} package is not installed. "
                                          f"pip install {package}, or leave it out, e.g. trainer.logger=[console]")


def check_backend(run: Run) -> Iterator[Issue]:
    """The worker backend can start: Ray installed (and a sound CPU count) for backend=ray, one node for local."""
    backend, nnodes = run.get("trainer.backend"), run.get("trainer.nnodes")
    if backend in CHOICES["trainer.backend"] and worker_backend(run.get) == "ray" and not _module_available("ray"):
        chosen = "" if backend == "ray" else " (auto picks Ray for more than one worker)"
        yield error("trainer.backend", f"'ray'{chosen} needs the ray package, which is not installed. Install it (pip "
                                       "install 'ray[default]'), or set trainer.backend=local to run in one process")
    num_cpus = run.get("ray_kwargs.ray_init.num_cpus")
    if num_cpus is not None and not _positive_int(num_cpus):
        yield error("ray_kwargs.ray_init.num_cpus", f"expected a positive integer (the CPUs Ray may use), got "
                                                    f"{num_cpus!r}. Set e.g. ray_kwargs.ray_init.num_cpus=8, or null")
    if backend == "local" and _positive_int(nnodes) and nnodes > 1:
        yield error("trainer.nnodes", "the local backend runs in one process on one node. "
                                      "Set trainer.nnodes=1, or trainer.backend=ray for several nodes")
    per_node = run.get("trainer.n_gpus_per_node")
    if backend == "local" and _positive_int(per_node) and per_node > 1:
        yield error("trainer.n_gpus_per_node", f"is {per_node}, but the local backend runs one worker in this process. "
                                               "Set trainer.n_gpus_per_node=1, or trainer.backend=ray for several")
    for section in ("critic", "reward_model"):
        if backend == "local" and run.own_pool(section):
            yield error(f"{section}.enable_resource_pool", "the local backend has one process and no pools of its "
                                                           f"own. Set {section}.enable_resource_pool=false")
    if run.get(f"{AR}.hybrid_engine") is False:
        yield error(f"{AR}.hybrid_engine", f"only the colocated hybrid engine is shipped. Set {AR}.hybrid_engine=true")


# ---- Required keys, ranges, sampling, combinations ---------------------------------------------------------------


def check_required(run: Run) -> Iterator[Issue]:
    """Data files and model paths that the configured run needs."""
    files = run.get("data.train_files")
    if not files or (isinstance(files, list) and not all(files)):
        yield error("data.train_files", "is required: no training data given. "
                                        "Set data.train_files=path/to/train.parquet (or a list of files)")
    elif isinstance(files, list) and not all(isinstance(f, str) for f in files):
        yield error("data.train_files", "every entry must be a file path, e.g. data.train_files=[a.parquet,b.parquet]")
    if run.get(f"{AR}.model.path") is None:
        yield error(f"{AR}.model.path", f"is required: the policy model to train. "
                                        f"Set {AR}.model.path=<local Hugging Face model folder>")
    if run.uses_critic and run.get("critic.model.path") is None:
        yield error("critic.model.path", "is required because a critic is used (adv_estimator=gae or critic."
                                         "enable=true). Set critic.model.path=<model folder>, usually the policy's")
    if run.uses_reward_model and run.get("reward_model.model.path") is None:
        yield error("reward_model.model.path", "is required because reward_model.enable=true. "
                                               "Set reward_model.model.path=<reward model folder>")
    path = run.get("custom_reward_function.path")
    if path is not None and not os.path.isfile(str(path)):
        yield error("custom_reward_function.path", f"file {path!r} does not exist. "
                                                   "Point it at the Python file that defines your reward function")


_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json", "spiece.model")


def check_model_folders(run: Run) -> Iterator[Issue]:
    """Local model folders hold what loading them needs: config.json, weights and (where a tokenizer is
    read from them) tokenizer files, named in the error instead of a confusing failure in a worker.
    Hub ids ("org/name" that is not a folder here) are left to the loader."""
    from verl.models.loader import looks_local

    wanted = [(f"{AR}.model.path", not run.get(f"{AR}.model.tokenizer_path")),
              (f"{AR}.model.tokenizer_path", True)]
    if run.uses_critic:
        wanted += [("critic.model.path", not run.get("critic.model.tokenizer_path")),
                   ("critic.model.tokenizer_path", True)]
    if run.uses_reward_model:
        wanted += [("reward_model.model.path", False)]
    for key, needs_tokenizer in wanted:
        path = run.get(key)
        if not isinstance(path, str) or not path or not looks_local(path):
            continue
        folder = os.path.expanduser(path)
        if not os.path.isdir(folder):
            yield error(key, f"{path!r}: no such folder. Give the folder of a Hugging Face model (download one "
                             "with `huggingface-cli download ID --local-dir DIR`)")
            continue
        names = os.listdir(folder)
        tokenizer_only = key.endswith("tokenizer_path")
        if not tokenizer_only and "config.json" not in names:
            yield error(key, f"{path!r} holds no config.json: it is not a Hugging Face model folder (an interrupted "
                             "download, or the folder above the model?)")
            continue
        if not tokenizer_only and not any(n.endswith(_WEIGHT_FILES) for n in names):
            yield error(key, f"{path!r} holds no weights (model.safetensors, pytorch_model.bin or shards): the "
                             "download is incomplete, or only the config was saved")
        if needs_tokenizer and not any(n in names for n in _TOKENIZER_FILES):
            yield error(key, f"{path!r} holds no tokenizer files ({', '.join(_TOKENIZER_FILES[:3])}, ...): save the "
                             "tokenizer with the model, or point the tokenizer_path key at a folder that has one")


_POSITIVE = (
    "data.train_batch_size", "data.gen_batch_size", "data.max_prompt_length", "data.max_response_length",
    f"{ACTOR}.ppo_mini_batch_size", f"{ACTOR}.ppo_epochs", f"{ACTOR}.ppo_max_token_len_per_gpu",
    f"{ACTOR}.ulysses_sequence_parallel_size", f"{ACTOR}.optim.lr", f"{ACTOR}.tau_pos", f"{ACTOR}.tau_neg",
    f"{ROLLOUT}.n", f"{ROLLOUT}.val_kwargs.n", f"{ROLLOUT}.log_prob_max_token_len_per_gpu",
    "trainer.nnodes", "trainer.n_gpus_per_node", "trainer.total_epochs", "trainer.total_training_steps",
)
_POSITIVE_WITH_CRITIC = ("critic.ppo_mini_batch_size", "critic.ppo_epochs", "critic.ppo_max_token_len_per_gpu",
                         "critic.ulysses_sequence_parallel_size", "critic.optim.lr")
_NON_NEGATIVE = (f"{ACTOR}.clip_ratio", f"{ACTOR}.clip_ratio_low", f"{ACTOR}.clip_ratio_high", f"{ACTOR}.entropy_coeff",
                 f"{ACTOR}.kl_loss_coef", "algorithm.kl_ctrl.kl_coef", "critic.cliprange_value")
# key -> whether 0 is excluded; the upper bound is 1 (included).
_UNIT_INTERVAL = {f"{ROLLOUT}.gpu_memory_utilization": True, f"{ROLLOUT}.top_p": True,
                  f"{ROLLOUT}.val_kwargs.top_p": True, "algorithm.gamma": False, "algorithm.lam": False}


def check_ranges(run: Run) -> Iterator[Issue]:
    """Sizes, lengths and learning rates > 0; coefficients >= 0; ratios inside their ranges."""
    keys = list(_POSITIVE) + (list(_POSITIVE_WITH_CRITIC) if run.uses_critic else [])
    keys += [k for k in dotted_keys(run.cfg) if k.endswith(("micro_batch_size", "micro_batch_size_per_gpu"))]
    for key in dict.fromkeys(keys):
        value = run.get(key)
        if _number(value) and value <= 0:
            yield error(key, f"must be > 0, got {value}. Set a positive value")
    for key in _NON_NEGATIVE:
        value = run.get(key)
        if _number(value) and value < 0:
            yield error(key, f"must be >= 0, got {value}")
    for key, open_at_zero in _UNIT_INTERVAL.items():
        value = run.get(key)
        if _number(value) and not ((value > 0 if open_at_zero else value >= 0) and value <= 1):
            yield error(key, f"must be in {'(0' if open_at_zero else '[0'}, 1], got {value}")
    value = run.get(f"{ACTOR}.clip_ratio_c")
    if _number(value) and value <= 1:
        yield error(f"{ACTOR}.clip_ratio_c", f"must be > 1 (it bounds the loss of negative advantages), got {value}. "
                                             "The usual value is 3.0")


def check_sampling(run: Run) -> Iterator[Issue]:
    """Sampling needs a temperature > 0; group estimators need several samples per prompt."""
    for prefix in (ROLLOUT, f"{ROLLOUT}.val_kwargs"):
        temperature = run.get(f"{prefix}.temperature")
        if run.get(f"{prefix}.do_sample") and _number(temperature) and temperature <= 0:
            yield error(f"{prefix}.temperature", f"must be > 0 when {prefix}.do_sample=true, got {temperature}. Set "
                                                 f"{prefix}.temperature=1.0, or {prefix}.do_sample=false for greedy")
    estimator, n = run.get("algorithm.adv_estimator"), run.get(f"{ROLLOUT}.n")
    if estimator in GROUP_ESTIMATORS and n == 1:
        yield warn(f"{ROLLOUT}.n", f"is 1, but adv_estimator={estimator} compares the samples of each prompt, so "
                                   f"every advantage will be 0. Set {ROLLOUT}.n=5 (any value >= 2)")


def check_combinations(run: Run) -> Iterator[Issue]:
    """Options that only make sense together with another setting."""
    for section in ("critic", "reward_model"):
        if run.own_pool(section):
            for key in (f"{section}.n_gpus_per_node", f"{section}.nnodes"):
                if not _positive_int(run.get(key)):
                    yield error(key, f"must be a positive integer when {section}.enable_resource_pool=true (it sizes "
                                     f"the {section}'s own devices), got {_format(run.get(key))}")
    if run.get("reward_model.overlong_buffer.enable") and run.get("reward_model.reward_manager") != "dapo":
        yield warn("reward_model.overlong_buffer.enable", "is only read by the dapo reward manager, so no length "
                                                          "penalty is applied. Set reward_model.reward_manager=dapo")
    if run.get("data.val_batch_size") is not None:
        yield warn("data.val_batch_size", "is deprecated and ignored: the whole validation set is sent in one batch")
    if run.get("trainer.resume_mode") == "resume_path":
        path = run.get("trainer.resume_from_path")
        if not path or "global_step_" not in str(path):
            yield error("trainer.resume_from_path", "must name a checkpoint folder like .../global_step_100 when "
                                                    f"trainer.resume_mode=resume_path, got {_format(path)}. "
                                                    "Set it, or use trainer.resume_mode=auto")
