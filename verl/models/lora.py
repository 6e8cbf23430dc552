"""LoRA adapters (PEFT) on the Hugging Face models the workers train.

The adapter is injected into the model in place (``peft.inject_adapter_in_model``): the model stays the
transformers class it was (our backbone/lm_head code, FSDP2 sharding per decoder layer and the native
rollout see the same structure), each targeted ``nn.Linear`` becomes a ``peft`` LoRA layer holding the
frozen base weight (``<module>.base_layer.weight``) and the trainable ``lora_A``/``lora_B`` factors. Only
the factors (and a value model's new ``score`` head) require grad, so the optimizer, its state and the
checkpoints hold just those.

- The reference policy is the same model with its adapter switched off (:func:`adapters_disabled`), as
  in the original: no second copy of the base weights.
- Generation merges ``W + scaling · B·A`` into the unsharded weights FSDP gathers for the rollout
  (:func:`merge_into_gathered_weights`); those buffers are freed when the weights are sharded again, so
  no merged copy outlives the call and the fp32 master weights are never touched.
- Export: :func:`peft_state_dict` / :func:`write_adapter_folder` give a folder ``peft.PeftModel.
  from_pretrained`` loads; :func:`merged_state_dict` folds the adapter into base weights with the
  original parameter names (``python -m verl.model_merger merge --merge_lora``).

``peft`` is imported lazily (5-6 s): only runs with ``lora_rank > 0`` pay for it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch

from verl.workers.config.model import ModelConfig

ADAPTER_NAME = "default"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# A value model's head is new (random): trained in full beside the adapter, never given LoRA factors.
VALUE_HEADS = ("score", "classifier")


@dataclass
class LoraSettings:
    """The LoRA keys of one model section (``actor_rollout_ref.model`` or ``critic.model``)."""

    rank: int
    alpha: float = ModelConfig.lora_alpha
    target_modules: str | list[str] = ModelConfig.target_modules
    exclude_modules: list[str] | None = None
    adapter_path: str | None = None
    section: str = "actor_rollout_ref.model"
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_config(cls, model_config, section: str) -> LoraSettings | None:
        """None when ``lora_rank`` is 0 and no adapter is given; errors name ``section``'s keys.
        ``model_config``: a `ModelConfig` (or a dict of its keys)."""
        model_config = ModelConfig.from_config(model_config)
        rank, adapter = model_config.lora_rank, model_config.lora_adapter_path
        if rank < 0:
            raise ValueError(f"{section}.lora_rank={rank}: must be 0 (full fine-tuning) or a positive rank")
        if rank == 0 and not adapter:
            return None
        targets = model_config.target_modules
        if targets is None or (not isinstance(targets, str) and not list(targets)):
            raise ValueError(f"{section}.target_modules is empty: give 'all-linear' or a list of module names "
                             "such as [q_proj,k_proj,v_proj,o_proj]")
        targets = targets if isinstance(targets, str) else [str(t) for t in targets]
        exclude = model_config.exclude_modules
        exclude = None if exclude in (None, "", []) else ([exclude] if isinstance(exclude, str) else
                                                          [str(e) for e in exclude])
        alpha = model_config.lora_alpha
        if alpha is None or float(alpha) <= 0:
            raise ValueError(f"{section}.lora_alpha={alpha}: must be positive (the adapter is scaled by "
                             "lora_alpha / lora_rank)")
        settings = cls(rank=rank, alpha=float(alpha), target_modules=targets, exclude_modules=exclude,
                       adapter_path=os.path.expanduser(str(adapter)) if adapter else None, section=section)
        if settings.adapter_path:
            settings.adopt_saved_adapter()
        return settings

    def adopt_saved_adapter(self) -> None:
        """With ``lora_adapter_path``: check the folder and take rank, alpha and targets from its config
        (the saved factors only fit the shapes they were trained with)."""
        key = f"{self.section}.lora_adapter_path"
        config_file = os.path.join(self.adapter_path, ADAPTER_CONFIG)
        if not os.path.isdir(self.adapter_path):
            raise FileNotFoundError(f"{key}={self.adapter_path!r}: no such folder. Point it at a PEFT adapter folder "
                                    f"(with {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}), e.g. one written by "
                                    "`python -m verl.model_merger merge` from a LoRA checkpoint")
        for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
            if not os.path.isfile(os.path.join(self.adapter_path, name)):
                raise FileNotFoundError(f"{key}={self.adapter_path!r} holds no {name}: it is not a PEFT LoRA adapter "
                                        "folder")
        with open(config_file) as f:
            saved = json.load(f)
        if str(saved.get("peft_type", "LORA")).upper() != "LORA":
            raise ValueError(f"{key}: {config_file} describes a {saved.get('peft_type')} adapter; only LoRA is "
                             "supported")
        if self.rank and int(saved["r"]) != self.rank:
            raise ValueError(f"{key}: the adapter has rank {saved['r']} but {self.section}.lora_rank={self.rank}; "
                             f"set lora_rank={saved['r']} (or 0 to take it from the adapter)")
        self.rank = int(saved["r"])
        self.alpha = float(saved.get("lora_alpha", self.alpha))
        targets = saved.get("target_modules")
        self.target_modules = targets if isinstance(targets, str) else sorted(targets or [])
        self.exclude_modules = saved.get("exclude_modules") or None
        self.extra = {k: saved[k] for k in ("use_rslora", "lora_dropout", "bias") if k in saved}

    def peft_config(self, value_head: bool = False):
        from peft import LoraConfig

        exclude = list(self.exclude_modules or [])
        if value_head:
            exclude += [h for h in VALUE_HEADS if h not in exclude]
        kwargs = {"lora_dropout": 0.0, "bias": "none", **self.extra}
        return LoraConfig(r=self.rank, lora_alpha=self.alpha, target_modules=self.target_modules,
                          exclude_modules=exclude or None, **kwargs)


def apply_lora(model: torch.nn.Module, settings: LoraSettings, *, value_head: bool = False) -> torch.nn.Module:
    """Inject the adapter into ``model`` (in place; also returned): every parameter is frozen except the
    LoRA factors and, for a value model, its head. With ``settings.adapter_path`` the factors are loaded
    from that folder. Errors name the config key to change."""
    _inject(model, settings, value_head)
    if settings.adapter_path:
        load_adapter_folder(model, settings.adapter_path, config_key=f"{settings.section}.lora_adapter_path")
    return model


def meta_model_with_adapter(hf_config, settings: LoraSettings, *, value_head: bool = False) -> torch.nn.Module:
    """The model ``hf_config`` describes, built on the meta device (no memory, no weights read), with
    the adapter injected: raises (naming the key) when it cannot be. For checks and estimates before any
    worker starts; the saved factors of ``settings.adapter_path`` are not read."""
    from transformers import AutoModelForTokenClassification

    from verl.models.vision import causal_lm_class

    with torch.device("meta"):
        if value_head:
            hf_config.num_labels = 1
            model = AutoModelForTokenClassification.from_config(hf_config)
        else:
            model = causal_lm_class(hf_config).from_config(hf_config)
    _inject(model, settings, value_head)
    return model


def _inject(model: torch.nn.Module, settings: LoraSettings, value_head: bool) -> None:
    from peft import inject_adapter_in_model

    try:
        inject_adapter_in_model(settings.peft_config(value_head), model, adapter_name=ADAPTER_NAME)
    except ValueError as err:  # peft's NoMatchingPeftModuleError is a ValueError
        raise ValueError(f"{settings.section}.target_modules={settings.target_modules!r} cannot wrap "
                         f"{type(model).__name__}: {err} Use 'all-linear' or names of its nn.Linear modules "
                         "(e.g. q_proj, v_proj), or set lora_rank=0") from err
    if not any("lora_A" in name for name, _ in model.named_parameters()):
        raise ValueError(f"{settings.section}: no module of {type(model).__name__} took a LoRA adapter "
                         f"(target_modules={settings.target_modules!r}, exclude_modules={settings.exclude_modules!r})")
    _refuse_parameter_adapters(model, settings)
    for name, param in model.named_parameters():
        param.requires_grad = "lora_" in name or (value_head and name.split(".")[0] in VALUE_HEADS)


def _refuse_parameter_adapters(model: torch.nn.Module, settings: LoraSettings) -> None:
    """peft adapts some parameters that are no ``nn.Linear`` weight in place (``ParamWrapper``: with
    'all-linear', Qwen3-MoE's 3-D expert weights and its router). Generation merges and exports only
    ``nn.Linear`` adapters, so those are refused here, before any training."""
    try:
        from peft.tuners.lora import ParamWrapper
    except ImportError:  # a peft without parameter adapters
        return
    wrapped = [name for name, module in model.named_modules() if isinstance(module, ParamWrapper)]
    if wrapped:
        raise ValueError(f"{settings.section}.target_modules={settings.target_modules!r} gives LoRA adapters to "
                         f"parameters that are not nn.Linear weights ({', '.join(wrapped[:3])}, ...: mixture-of-"
                         "experts weights or routers), which this verl cannot merge for generation or export; "
                         "list nn.Linear modules instead, e.g. target_modules=[q_proj,k_proj,v_proj,o_proj]")


def _lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Within the block the model computes with its base weights only (the reference policy)."""
    # Only the flag the LoRA layers' forward reads. peft's enable_adapters(False) also sets requires_grad
    # False on the factors, and FSDP2 reads requires_grad at the model's first forward (which is the
    # reference pass when the rollout does not call the model) to choose what it reduces in fp32: the
    # factors' gradients then came back in bf16 (an error on CUDA). So requires_grad is never touched.
    layers = [layer for layer in _lora_layers(model) if not layer.disable_adapters]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


@torch.no_grad()
def merge_into_gathered_weights(model: torch.nn.Module) -> None:
    """``W += scaling · B·A`` into each LoRA layer's base weight, in the weight's dtype. Only for weights
    that FSDP unsharded into temporary buffers (inside ``FSDPEngine.gathered_params()``): those are
    freed at reshard, so the merge dies with them and the sharded master weights stay as they were."""
    for layer in _lora_layers(model):
        if layer.disable_adapters or ADAPTER_NAME not in layer.lora_A:
            continue
        weight = layer.base_layer.weight
        a, b = layer.lora_A[ADAPTER_NAME].weight, layer.lora_B[ADAPTER_NAME].weight
        delta = (b.float() @ a.float()) * layer.scaling[ADAPTER_NAME]
        weight.add_(delta.to(weight.dtype))


# ------------------------------------------------------------------------------------------------ state dicts
def is_base_weight_name(name: str) -> bool:
    return ".base_layer." in name


def trainable_names(model: torch.nn.Module) -> set[str]:
    """The state-dict names of the parameters a LoRA run trains (and checkpoints)."""
    return {name for name, param in model.named_parameters() if param.requires_grad}


def peft_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our trainable tensors under PEFT's file names (``base_model.model.<module>.lora_A.weight``; a
    value head as ``base_model.model.score.weight``)."""
    out = {}
    for name, tensor in state.items():
        if "lora_" in name:
            name = name.replace(f".{ADAPTER_NAME}.", ".")
        elif is_base_weight_name(name):
            continue
        out[f"base_model.model.{name}"] = tensor
    return out


def write_adapter_folder(folder: str, state: Mapping[str, torch.Tensor], lora_config: Mapping,
                         base_model_path: str | None = None) -> None:
    """``adapter_config.json`` + ``adapter_model.safetensors`` into ``folder`` (each file written under a
    temporary name and renamed)."""
    from safetensors.torch import save

    from verl.utils.fs import atomic_write

    config = dict(lora_config)
    config.setdefault("peft_type", "LORA")
    if base_model_path:
        config["base_model_name_or_path"] = base_model_path
    with atomic_write(os.path.join(folder, ADAPTER_CONFIG), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True, default=list)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in peft_state_dict(state).items()}
    with atomic_write(os.path.join(folder, ADAPTER_WEIGHTS)) as f:
        f.write(save(tensors, metadata={"format": "pt"}))


def load_adapter_folder(model: torch.nn.Module, folder: str, config_key: str) -> None:
    """Copy a PEFT adapter folder's factors into the injected adapter of ``model`` (same rank/targets)."""
    from safetensors.torch import load_file

    saved = load_file(os.path.join(folder, ADAPTER_WEIGHTS))
    params = dict(model.named_parameters())
    expected = {n for n in params if "lora_" in n}
    loaded = set()
    with torch.no_grad():
        for key, tensor in saved.items():
            name = key.removeprefix("base_model.model.")
            for part in ("lora_A", "lora_B"):
                name = name.replace(f".{part}.weight", f".{part}.{ADAPTER_NAME}.weight")
            if name not in params:
                raise ValueError(f"{config_key}={folder!r}: {key} has no place in this model; was the adapter "
                                 "trained on another architecture?")
            if tuple(params[name].shape) != tuple(tensor.shape):
                raise ValueError(f"{config_key}={folder!r}: {key} has shape {tuple(tensor.shape)}, this model "
                                 f"expects {tuple(params[name].shape)}")
            params[name].copy_(tensor)
            loaded.add(name)
    missing = sorted(expected - loaded)
    if missing:
        more = " ..." if len(missing) > 4 else ""
        raise ValueError(f"{config_key}={folder!r} holds no factors for {missing[:4]}{more}; it was trained with "
                         "other target_modules")


def merged_state_dict(state: Mapping[str, torch.Tensor], lora_config: Mapping) -> dict[str, torch.Tensor]:
    """A full state dict with LoRA layers (``<m>.base_layer.weight``, ``<m>.lora_A.default.weight`` ...)
    folded back to plain weights under the original names (``<m>.weight = W + scaling · B·A``)."""
    rank, alpha = int(lora_config["r"]), float(lora_config["lora_alpha"])
    scaling = alpha / (rank ** 0.5 if lora_config.get("use_rslora") else rank)
    out = {}
    for name, tensor in state.items():
        if "lora_" in name:
            continue
        if is_base_weight_name(name):
            module = name.split(".base_layer.")[0]
            plain = name.replace(".base_layer.", ".")
            a = state.get(f"{module}.lora_A.{ADAPTER_NAME}.weight")
            if a is not None and plain.endswith(".weight"):
                b = state[f"{module}.lora_B.{ADAPTER_NAME}.weight"]
                tensor = (tensor.float() + (b.float() @ a.float()) * scaling).to(tensor.dtype)
            out[plain] = tensor
        else:
            out[name] = tensor
    return out


def lora_config_dict(model: torch.nn.Module, base_model_path: str | None = None, value_head: bool = False) -> dict:
    """The injected adapter's PEFT config as a JSON-able dict (what ``adapter_config.json`` holds); a
    value model's head is listed in ``modules_to_save`` (trained in full, saved beside the factors)."""
    config = model.peft_config[ADAPTER_NAME].to_dict()
    if value_head:
        config["modules_to_save"] = [h for h in VALUE_HEADS if hasattr(model, h)]
    for key, value in list(config.items()):
        if isinstance(value, set):
            config[key] = sorted(value)
    config["peft_type"] = "LORA"
    config["task_type"] = config.get("task_type") or None
    if base_model_path:
        config["base_model_name_or_path"] = base_model_path
    return json.loads(json.dumps(config, default=str))
