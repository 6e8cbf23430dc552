"""Rollout engines by name (``actor_rollout_ref.rollout.name``), known without importing them.

The built-in engines are imported when one is asked for (:func:`get_rollout_class`), so checking a config
or listing the names costs no torch or transformers import. A user's engine registers itself with
:func:`register_rollout` when its module is imported.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util

from verl.utils.registry import Registry

__all__ = ["EXTERNAL_ENGINES", "check_rollout_name", "get_rollout_class", "ignored_config_keys",
           "register_rollout", "registered_rollouts"]

# Built-in engines: name -> the module that defines (and registers) it.
BUILTIN = {"hf": "verl.workers.rollout.hf_rollout", "native": "verl.workers.rollout.native.engine"}
# Engines of the original verl that this project does not ship: name -> the package providing it.
EXTERNAL_ENGINES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt_llm"}
# ``actor_rollout_ref.rollout.*`` keys an engine does not read (config validation warns when one is set): the
# external engines' own keys (BaseRollout's list), plus per built-in engine the ones it has no use for. The
# native engine generates in the dtype the actor's weights have inside gathered_params() (FSDP's param_dtype),
# so that no second copy exists: ``rollout.dtype`` is not read.
EXTERNAL_ONLY = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_parallel_size",
                 "enable_chunked_prefill", "enable_prefix_caching", "load_format", "layered_summon",
                 "disable_log_stats", "engine_kwargs")
IGNORED_CONFIG_KEYS = {"hf": EXTERNAL_ONLY + ("gpu_memory_utilization", "free_cache_engine", "enforce_eager",
                                              "max_num_batched_tokens", "max_model_len", "max_num_seqs", "dtype"),
                       "native": EXTERNAL_ONLY + ("dtype",)}

_ROLLOUTS = Registry("rollout engine", "actor_rollout_ref.rollout.name")


def register_rollout(name: str):
    """Class decorator adding a rollout engine under ``actor_rollout_ref.rollout.name=<name>``."""
    if name in BUILTIN and name not in _ROLLOUTS:
        importlib.import_module(BUILTIN[name])  # a built-in name: its own class comes first
    return _ROLLOUTS.register(name)


def registered_rollouts() -> list[str]:
    return sorted(set(BUILTIN) | set(_ROLLOUTS))


def check_rollout_name(name: str) -> None:
    """A ValueError saying what to use instead when ``name`` is no engine of this verl."""
    if name in BUILTIN or name in _ROLLOUTS:
        return
    builtin = registered_rollouts()
    fix = f"the built-in engines are: {', '.join(builtin)}. Set actor_rollout_ref.rollout.name={builtin[0]}"
    if name in EXTERNAL_ENGINES:
        if not _installed(EXTERNAL_ENGINES[name]):
            raise ValueError(f"rollout engine {name!r} is not installed; {fix}")
        raise ValueError(f"rollout engine {name!r} is installed, but this verl ships no adapter for it; {fix}")
    guess = difflib.get_close_matches(str(name), builtin, n=1, cutoff=0.6)
    hint = f" (did you mean {guess[0]}?)" if guess else ""
    raise ValueError(f"unknown rollout engine {name!r}{hint}; {fix}")


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def get_rollout_class(name: str) -> type:
    """The engine class for ``actor_rollout_ref.rollout.name``; a clear error for unknown names."""
    check_rollout_name(name)
    if name not in _ROLLOUTS:
        importlib.import_module(BUILTIN[name])
    return _ROLLOUTS[name]


def ignored_config_keys(name: str) -> tuple[str, ...]:
    """The rollout keys engine ``name`` does not read (a built-in engine's without importing it)."""
    return IGNORED_CONFIG_KEYS[name] if name in IGNORED_CONFIG_KEYS else get_rollout_class(name).ignored_config_keys
