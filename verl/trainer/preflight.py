"""Checks of the machine and the files a run needs, after the config is valid and before anything
starts (no Ray, no worker, no model load): data files exist, a GPU is there when ``trainer.device=cuda``
and the run starts its own Ray cluster here, a ``resume_path`` checkpoint is a checkpoint, and a model
given as a Hugging Face id is in the local cache or the hub answers (offline first: a path that is
neither a folder here nor a cached id is reported in seconds, not after the hub client's retries).

:func:`validate_config` checks the config alone (it passes for a command written on another machine);
``main_ppo`` and ``python -m verl.trainer.config_validation`` run both.
"""

from __future__ import annotations

import functools
import os
import threading
import urllib.parse

from omegaconf import OmegaConf

from verl.trainer.config import ConfigError
from verl.trainer.config.spec import joins_ray_cluster

ACTOR_MODEL_KEYS = ("actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path")


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub's endpoint opens within ``timeout`` seconds (name lookup
    included: it runs in a thread that is abandoned when it takes longer)."""
    import socket

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                                       "all_proxy")):
        return True  # the hub is reached through a proxy: a direct connection says nothing, let the loader try
    url = urllib.parse.urlparse(constants.ENDPOINT)
    result = []

    def connect():
        try:  # each resolved address gets half the time (an unroutable IPv6 one must not use it all)
            socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                     timeout=timeout / 2).close()
            result.append(True)
        except OSError:
            pass

    probe = threading.Thread(target=connect, daemon=True)
    probe.start()
    probe.join(timeout)
    return bool(result)


def _model_id_errors(config, joins_cluster: bool) -> list[str]:
    """Model paths that are not folders here: a valid hub id, cached or with the hub reachable. When
    joining a cluster only the tokenizer is checked (the driver loads it; the workers on other nodes may
    have the cache or the network for the models)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from verl.models.loader import looks_local
    from verl.trainer.config.spec import need_critic

    get = functools.partial(OmegaConf.select, config, default=None)
    keys = list(ACTOR_MODEL_KEYS)
    keys += ["critic.model.path", "critic.model.tokenizer_path"] if need_critic(
        get("critic.enable"), get("algorithm.adv_estimator")) else []
    keys += ["reward_model.model.path"] if get("reward_model.enable") else []
    if joins_cluster:  # the driver's own load: the tokenizer (of tokenizer_path, else of the model)
        keys = [ACTOR_MODEL_KEYS[1] if get(ACTOR_MODEL_KEYS[1]) else ACTOR_MODEL_KEYS[0]]
    errors, reachable = [], None
    for key in keys:
        node = get(key)
        if not isinstance(node, str) or not node or looks_local(node):
            continue  # unset, or a local folder (the config check looks inside those)
        here = os.path.abspath(node)
        try:
            validate_repo_id(node)
        except HFValidationError:
            errors.append(f"{key}: {node!r} is no folder here ({here}) and not a Hugging Face id. Give the model's "
                          "folder (with config.json)")
            continue
        marker = "tokenizer_config.json" if key.endswith("tokenizer_path") or joins_cluster else "config.json"
        if isinstance(try_to_load_from_cache(node, marker), str):
            continue
        if reachable is None:
            reachable = _hub_reachable()
        if not reachable:
            errors.append(f"{key}: {node!r} is no folder here ({here}), not in the Hugging Face cache, and the hub "
                          "cannot be reached (offline) to download it. Give a local model folder (`huggingface-cli "
                          "download ID --local-dir DIR` on a machine with network), or fix the path")
    return errors


def preflight_errors(config, cuda_available: bool | None = None) -> list[str]:
    """``<key>: <what is wrong>. <how to fix>`` for every problem found."""
    errors = []
    get = functools.partial(OmegaConf.select, config, default=None)
    for key in ("train_files", "val_files"):
        files = get(f"data.{key}") or []
        for path in [files] if isinstance(files, str) else list(files):
            path = str(path)
            # hdfs://, s3://, ... are read by their own clients
            if "://" not in path and not os.path.exists(os.path.expanduser(path)):
                errors.append(f"data.{key}: {path!r} does not exist. Give the parquet file(s) the preprocessing "
                              "script wrote (e.g. python3 examples/data_preprocess/gsm8k.py --local_dir DIR)")
    joins_cluster = joins_ray_cluster(get)
    errors += _model_id_errors(config, joins_cluster)
    if get("trainer.device") == "cuda" and not joins_cluster:
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available()
        if not cuda_available:
            errors.append("trainer.device: is cuda, but this machine has no visible GPU (torch.cuda.is_available() "
                          "is False). Set trainer.device=cpu to train on the CPU, or check CUDA_VISIBLE_DEVICES and "
                          "the driver")
    if get("trainer.resume_mode") == "resume_path" and get("trainer.resume_from_path"):
        folder = os.path.expanduser(str(get("trainer.resume_from_path")))
        if not os.path.isdir(folder):
            errors.append(f"trainer.resume_from_path: {folder!r} does not exist. Give a checkpoint folder "
                          "(.../global_step_N) or use trainer.resume_mode=auto")
        elif not os.path.isdir(os.path.join(folder, "actor")):
            errors.append(f"trainer.resume_from_path: {folder!r} holds no actor/ checkpoint: it is not a "
                          "global_step_N folder written by this trainer")
    return errors


def preflight(config, cuda_available: bool | None = None) -> None:
    """Raise :class:`ConfigError` listing every problem :func:`preflight_errors` finds."""
    errors = preflight_errors(config, cuda_available)
    if errors:
        raise ConfigError(f"Cannot start ({len(errors)} problem{'s' if len(errors) > 1 else ''}):", errors)
