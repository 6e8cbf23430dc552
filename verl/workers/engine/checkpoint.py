"""Checkpoint I/O of an :class:`~verl.workers.engine.fsdp.FSDPEngine`, in verl's layout.

One folder per role and step, e.g. ``checkpoints/p/e/global_step_N/actor/``::

    model_world_size_{W}_rank_{r}.pt        # "model": this rank's parameter shards (below)
    optim_world_size_{W}_rank_{r}.pt        # "optimizer": this rank's AdamW state
    extra_state_world_size_{W}_rank_{r}.pt  # "extra": LR scheduler state and RNG states
    fsdp_config.json                        # {"FSDP_version": 2, "world_size": W} (rank 0)
    huggingface/                            # config.json, generation_config.json, tokenizer, a vision-language
                                            #   model's processor files (rank 0);
                                            #   with "hf_model" also the full model as safetensors
                                            #   (a LoRA run: the PEFT adapter folder files instead)

With a LoRA adapter (:mod:`verl.models.lora`) the model and optimizer files hold the trainable tensors
only (the factors; a critic's value head too), and ``fsdp_config.json`` holds the adapter's PEFT config
under ``"lora"``: the base weights are those of ``model.path``.

Every file is written under a temporary name and renamed into place. All ``.pt`` files load with
``torch.load(..., weights_only=True)``.

A model file holds ``{"state_dict": {name: local shard (CPU)}, "shard_dims": {name: dim or None},
"global_shapes": {name: [sizes]}, "world_size": W, "rank": r}``. FSDP2 splits dim ``shard_dims[name]``
(always 0) in rank order like ``torch.chunk`` (the last ranks may hold fewer rows, or none), so the full
tensor is ``torch.cat([rank_0, ..., rank_W-1], dim)``; a ``None`` dim is a full copy on every rank.
:func:`load_full_model_state_dict` does exactly that, without a process group (for the model merger).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterable

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from verl.models.vision import copy_processor_files
from verl.utils.fs import atomic_torch_save, atomic_write

logger = logging.getLogger(__name__)

CONTENTS = ("model", "optimizer", "extra", "hf_model")
FSDP_CONFIG_FILE = "fsdp_config.json"
HF_DIR = "huggingface"
_SHARD_PREFIX = {"model": "model", "optimizer": "optim", "extra": "extra_state"}


def shard_file(part: str, world_size: int, rank: int) -> str:
    """This rank's file of ``part`` (model, optimizer or extra)."""
    return f"{_SHARD_PREFIX[part]}_world_size_{world_size}_rank_{rank}.pt"


def _check_contents(contents: Iterable[str]) -> set[str]:
    chosen = set(contents)
    unknown = chosen - set(CONTENTS)
    if unknown:
        raise ValueError(f"checkpoint contents {sorted(unknown)} are unknown; choose from {list(CONTENTS)}.")
    return chosen


def _checkpointed_state(engine) -> dict:
    """The state-dict entries a checkpoint holds: all of them, or with a LoRA adapter only what trains."""
    state = engine.module.state_dict(keep_vars=True)
    names = getattr(engine, "checkpointed_names", None)
    return state if names is None else {name: state[name] for name in names}


def _model_payload(engine) -> dict:
    tensors, shard_dims, shapes, copies = {}, {}, {}, {}
    for name, param in _checkpointed_state(engine).items():
        value, dim = param.detach(), None
        if isinstance(value, DTensor):
            dims = [p.dim for p in value.placements if p.is_shard()]
            dim = dims[0] if dims else None
            value = value.to_local()
        if id(param) not in copies:  # tied weights: save the shared tensor once
            copies[id(param)] = value.to("cpu", copy=True)
        tensors[name], shard_dims[name], shapes[name] = copies[id(param)], dim, list(param.shape)
    return {"state_dict": tensors, "shard_dims": shard_dims, "global_shapes": shapes,
            "world_size": engine.world_size, "rank": engine.rank}


def _load_model_payload(engine, payload: dict, path: str) -> None:
    saved = payload["state_dict"]
    current = _checkpointed_state(engine)
    if set(saved) != set(current):
        missing, extra = sorted(set(current) - set(saved)), sorted(set(saved) - set(current))
        raise ValueError(f"{path} does not match this model: missing {missing[:5]}, unexpected {extra[:5]}.")
    with torch.no_grad():
        for name, value in current.items():
            local = value.to_local() if isinstance(value, DTensor) else value
            if tuple(local.shape) != tuple(saved[name].shape):
                raise ValueError(f"{path}: {name} has shard shape {tuple(saved[name].shape)}, "
                                 f"this model expects {tuple(local.shape)}.")
            local.copy_(saved[name])


def _optim_payload(optimizer: torch.optim.Optimizer) -> dict:
    sd = optimizer.state_dict()
    state, dtensor_keys = {}, []
    for idx, param_state in sd["state"].items():
        state[idx] = {}
        for key, value in param_state.items():
            if isinstance(value, DTensor):
                dtensor_keys.append([idx, key])
                value = value.to_local()
            state[idx][key] = value.to("cpu", copy=True) if isinstance(value, torch.Tensor) else value
    return {"state": state, "param_groups": sd["param_groups"], "dtensor_keys": dtensor_keys}


def _load_optim_payload(optimizer: torch.optim.Optimizer, payload: dict) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {idx: dict(param_state) for idx, param_state in payload["state"].items()}
    for idx, key in payload["dtensor_keys"]:
        param = params[idx]
        local = state[idx][key].to(param.to_local().device)
        state[idx][key] = DTensor.from_local(local, param.device_mesh, param.placements, run_check=False,
                                             shape=param.shape, stride=param.stride())
    optimizer.load_state_dict({"state": state, "param_groups": payload["param_groups"]})


def _rng_state() -> dict:
    kind, key, pos, has_gauss, cached = np.random.get_state()
    # numpy's state as plain lists, so the file loads with weights_only=True.
    return {"python": random.getstate(), "numpy": [kind, key.tolist(), pos, has_gauss, cached],
            "torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    kind, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _write_hf_folder(engine, local_path: str, tokenizer, full_state: dict | None) -> None:
    """Rank 0: config, generation config, tokenizer, a vision-language model's processor files and (if given) the
    full weights into huggingface/."""
    target = os.path.join(local_path, HF_DIR)
    os.makedirs(target, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".huggingface.", dir=local_path)
    try:
        # The model's own transformers class (FSDP2 swaps in a subclass named ``FSDP<cls>``).
        model_cls = next(c for c in type(engine.module).__mro__ if not issubclass(c, FSDPModule))
        config = copy.deepcopy(engine.module.config)
        config.architectures = [model_cls.__name__]
        if hasattr(config, "use_cache"):
            config.use_cache = True  # training turned it off; the exported model is for inference
        if full_state is not None:
            with torch.device("meta"):
                shell = model_cls(config)
            shell.save_pretrained(staging, state_dict=full_state)  # also writes config + generation config
        else:
            config.save_pretrained(staging)
            generation_config = getattr(engine.module, "generation_config", None)
            if generation_config is not None:
                generation_config.save_pretrained(staging)
        if tokenizer is not None:
            if isinstance(tokenizer, (str, os.PathLike)):
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(tokenizer)
            tokenizer.save_pretrained(staging)
        source = config.name_or_path  # the folder the weights were loaded from
        if source and os.path.isdir(source):  # a vision-language model's processor, for AutoProcessor
            copy_processor_files(source, staging)
        for name in os.listdir(staging):
            os.replace(os.path.join(staging, name), os.path.join(target, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def save_checkpoint(engine, local_path: str, *, contents: Iterable[str] = ("model", "optimizer", "extra"),
                    tokenizer=None) -> None:
    """Write the chosen ``contents`` of ``engine`` into ``local_path``. Collective over all ranks."""
    chosen = _check_contents(contents)
    if "optimizer" in chosen and engine.optimizer is None:
        raise ValueError("checkpoint contents include 'optimizer' but this engine has none.")
    world_size, rank = engine.world_size, engine.rank
    paths = {part: os.path.join(local_path, shard_file(part, world_size, rank)) for part in _SHARD_PREFIX}
    os.makedirs(local_path, exist_ok=True)
    if "model" in chosen:
        atomic_torch_save(_model_payload(engine), paths["model"])
    if "optimizer" in chosen:
        atomic_torch_save(_optim_payload(engine.optimizer), paths["optimizer"])
    if "extra" in chosen:
        scheduler = engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None
        atomic_torch_save({"lr_scheduler": scheduler, "rng": _rng_state()}, paths["extra"])
    full_state = engine.full_state_dict() if "hf_model" in chosen else None
    lora_config = getattr(engine, "lora_config", None)
    if rank == 0:
        with atomic_write(os.path.join(local_path, FSDP_CONFIG_FILE), "w") as f:
            json.dump({"FSDP_version": 2, "world_size": world_size,
                       **({"lora": lora_config} if lora_config else {})}, f)
        if full_state is not None and lora_config:  # the adapter, as PEFT loads it, instead of full weights
            from verl.models.lora import write_adapter_folder

            write_adapter_folder(os.path.join(local_path, HF_DIR), {
                name: full_state[name] for name in engine.checkpointed_names}, lora_config)
            full_state = None
        _write_hf_folder(engine, local_path, tokenizer, full_state)
    dist.barrier(device_ids=[engine.device.index] if engine.device.type == "cuda" else None)
    logger.info("saved %s to %s", sorted(chosen), local_path)


def read_fsdp_config(local_path: str) -> dict:
    path = os.path.join(local_path, FSDP_CONFIG_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: {local_path} is not an FSDP checkpoint folder written by verl.")
    with open(path) as f:
        return json.load(f)


def load_checkpoint(engine, local_path: str, *, contents: Iterable[str] = ("model", "optimizer", "extra")) -> None:
    """Restore the chosen ``contents`` ("hf_model" is export only and ignored) from ``local_path``."""
    chosen = _check_contents(contents) - {"hf_model"}
    saved_world = read_fsdp_config(local_path).get("world_size")
    if saved_world != engine.world_size:
        raise ValueError(f"{local_path} was saved by {saved_world} ranks but {engine.world_size} are loading it. "
                         "Resume with the same number of GPUs (trainer.nnodes x trainer.n_gpus_per_node = "
                         f"{saved_world}), or export it with `python -m verl.model_merger merge --backend fsdp "
                         "--local_dir ...` and start from that model.")
    world_size, rank = engine.world_size, engine.rank
    files = {part: shard_file(part, world_size, rank) for part in _SHARD_PREFIX}
    absent = sorted(part for part in chosen if not os.path.isfile(os.path.join(local_path, files[part])))
    if absent:
        raise FileNotFoundError(
            f"{local_path} holds no {[files[part] for part in absent]}: the checkpoint was saved without {absent} "
            "(checkpoint.save_contents); drop them from checkpoint.load_contents.")
    if "model" in chosen:
        path = os.path.join(local_path, files["model"])
        _load_model_payload(engine, _read(path), path)
    if "optimizer" in chosen:
        if engine.optimizer is None:
            raise ValueError("checkpoint contents include 'optimizer' but this engine has none.")
        _load_optim_payload(engine.optimizer, _read(os.path.join(local_path, files["optimizer"])))
    if "extra" in chosen:
        extra = _read(os.path.join(local_path, files["extra"]))
        if engine.lr_scheduler is not None and extra["lr_scheduler"] is not None:
            engine.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        _set_rng_state(extra["rng"])
    logger.info("loaded %s from %s", sorted(chosen), local_path)


def _read(path: str):
    """``torch.load`` of one checkpoint file; a truncated or corrupt file is named as such."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError) as err:
        raise ValueError(f"{path} cannot be read ({str(err).splitlines()[0]}): the file is truncated or corrupt "
                         "(a crash or a full disk while it was written by hand or copied?)") from err


def load_full_model_state_dict(local_path: str) -> dict[str, torch.Tensor]:
    """The full model state dict, rebuilt on the CPU from every rank's model file (no process group needed)."""
    world_size = read_fsdp_config(local_path)["world_size"]
    shards = [torch.load(os.path.join(local_path, shard_file("model", world_size, r)), map_location="cpu",
                         weights_only=True) for r in range(world_size)]
    full = {}
    for name, shape in shards[0]["global_shapes"].items():
        dim = shards[0]["shard_dims"][name]
        tensor = shards[0]["state_dict"][name] if dim is None else \
            torch.cat([s["state_dict"][name] for s in shards], dim=dim)
        if list(tensor.shape) != list(shape):
            raise ValueError(f"{local_path}: {name} rebuilds to {list(tensor.shape)}, expected {shape}.")
        full[name] = tensor
    return full
