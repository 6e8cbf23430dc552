"""The rollout engine a run generates with, decided once in the driver before any worker starts.

``actor_rollout_ref.rollout.name=native`` (the default) runs the decoder families the native engine implements,
vision-language Qwen2-VL / Qwen2.5-VL included. For any other model (a family it lacks, a length-dependent RoPE)
the run generates with transformers' ``generate`` (``rollout.name=hf``) instead, and says so once, with the
reason: the same answer the native engine would give at its first call, found by building the model on the meta
device (no weights read, no memory) and asking the engine's own checks. A hub name (no local folder) is not
fetched for this: the engine refuses an unsupported one when it loads, saying to set ``rollout.name=hf``. The
asynchronous trainer modes need the native engine (they suspend and resume generations); there the run stops
with the fix instead.
"""

from __future__ import annotations

import dataclasses
import os

from verl.trainer.config.spec import RunSpec

__all__ = ["EngineChoiceError", "choose_rollout_engine", "native_problem"]

ENGINE_KEY = "actor_rollout_ref.rollout.name"


class EngineChoiceError(ValueError):
    """The run needs an engine that cannot generate with its model; the message names the keys to change."""


def native_problem(path: str, *, trust_remote_code: bool = False, override_config=None) -> str | None:
    """Why the native engine cannot generate with the model in folder ``path`` (its message), or None when it can
    (or when ``path`` is a hub name, not read here)."""
    import torch

    from verl.models.loader import load_hf_config
    from verl.models.vision import causal_lm_class
    from verl.workers.rollout.native.weights import DecoderWeights, UnsupportedModelError

    if not path or not os.path.isdir(os.path.expanduser(path)):  # a hub name is not downloaded here; the engine
        return None  # checks it when it loads (and a missing folder is the loader's error to report)
    config = load_hf_config(path, trust_remote_code=trust_remote_code, override_config=override_config,
                            config_key="actor_rollout_ref.model.path")
    try:
        with torch.device("meta"):
            module = causal_lm_class(config).from_config(config, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 -- a config transformers cannot build: loading the actor reports it, in context
        return None
    try:
        DecoderWeights(module)
    except UnsupportedModelError as e:
        return f"it does not support {e.what}"
    return None


def choose_rollout_engine(spec: RunSpec, log=print) -> RunSpec:
    """``spec`` with ``rollout.name=hf`` where ``native`` was asked for and cannot run the model (reported through
    ``log``); an EngineChoiceError naming the keys when the trainer mode needs the native engine."""
    policy = spec.actor_rollout_ref
    if policy.rollout.name != "native":
        return spec
    model = policy.model
    problem = native_problem(model.path, trust_remote_code=model.trust_remote_code,
                             override_config=model.override_config)
    if problem is None:
        return spec
    if spec.trainer.v1.asynchronous:
        raise EngineChoiceError(f"{ENGINE_KEY}=native cannot generate with {model.path!r}: {problem}; and "
                         f"trainer.v1.trainer_mode={spec.trainer.v1.trainer_mode} needs the native engine (it suspends "
                         "and resumes generations). Use trainer.v1.trainer_mode=sync (with "
                         f"{ENGINE_KEY}=hf where the native engine cannot run the model at all), or a model family "
                         "the native engine runs (see the README's support table)")
    log(f"[rollout] {ENGINE_KEY}=native cannot generate with {model.path!r}: {problem}. Generating with "
        f"transformers' generate ({ENGINE_KEY}=hf) instead, which is several times slower; set {ENGINE_KEY}=hf "
        "to choose it and silence this note")
    rollout = dataclasses.replace(policy.rollout, name="hf")
    return dataclasses.replace(spec, actor_rollout_ref=dataclasses.replace(policy, rollout=rollout))
