"""Load Hugging Face causal LMs (actor, reference) and value models (critic) from a model folder.

Models are local folders here (a folder with ``config.json`` and weights); a Hugging Face id works
too where a hub is reachable. Errors name the config key the path came from, so a user knows which
line of the command to fix.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch

from verl.models.moe import take_aux_loss_request
from verl.models.vision import is_vision_language, vision_tower

logger = logging.getLogger(__name__)

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "float": torch.float32, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16, "half": torch.float16}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.bfloat16`` or one of the config spellings ("bf16", "bfloat16", "fp32", ...) as a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).lower().removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}.")
    return _DTYPES[name]


def looks_local(path: str) -> bool:
    # A hub id is "name" or "org/name"; anything else is meant as a folder on this machine.
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or os.path.exists(path)


def _check_model_path(path: str | None, config_key: str) -> str:
    if not path:
        raise ValueError(f"{config_key} is not set: give the folder of a Hugging Face model (with config.json).")
    path = os.path.expanduser(str(path))
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"{config_key}={path!r} is a folder but holds no config.json; point it at the "
                                    "folder that save_pretrained (or `huggingface-cli download ID --local-dir DIR`) "
                                    "wrote.")
        return path
    if looks_local(path):
        raise FileNotFoundError(f"{config_key}={path!r}: no such folder. Models must be local folders here (download "
                                "one with `huggingface-cli download ID --local-dir DIR` and pass DIR), or Hugging Face "
                                "ids when a hub is reachable.")
    return path  # a hub id such as "Qwen/Qwen2.5-0.5B-Instruct"


def apply_override_config(config, override: Mapping[str, Any] | None) -> None:
    """Set ``override`` (``model.override_config``) on a transformers config; nested dicts update sub-configs."""
    for key, value in (override or {}).items():
        current = getattr(config, key, None)
        if isinstance(value, Mapping) and hasattr(current, "to_dict"):
            apply_override_config(current, value)
        else:
            setattr(config, key, dict(value) if isinstance(value, Mapping) else value)


def load_hf_config(path: str, *, trust_remote_code: bool = False, override_config: Mapping | None = None,
                   config_key: str = "actor_rollout_ref.model.path"):
    """The transformers config of the model at ``path`` with ``override_config`` applied."""
    from transformers import AutoConfig

    path = _check_model_path(path, config_key)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except OSError as err:
        raise FileNotFoundError(f"{config_key}={path!r} is neither a local model folder nor a Hugging Face id that "
                                f"could be fetched ({err}). Models must be local folders here, or Hugging Face ids "
                                "when a hub is reachable.") from err
    except (ValueError, KeyError) as err:
        import transformers

        raise ValueError(f"{config_key}={path!r}: transformers {transformers.__version__} does not recognise this "
                         f"model ({err}). Use an architecture transformers supports, or set trust_remote_code=True if "
                         "the folder ships its own modelling code.") from err
    apply_override_config(config, override_config)
    return config


def enable_gradient_checkpointing(model) -> None:
    """Recompute each decoder layer in backward (non-reentrant, composes with FSDP2); turns the KV cache off."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


def _softcapped(config) -> bool:
    """Attention scores soft-capped (Gemma 2): neither SDPA nor the packed kernels apply the cap."""
    return bool(getattr(config, "attn_logit_softcapping", None)) and config.model_type == "gemma2"


def check_packable(config, config_key: str) -> None:
    """Refuse packed forwards for models with sliding-window or soft-capped attention (the packed kernel attends
    to the whole of each sequence, uncapped), naming the key to turn them off."""
    layer_types = getattr(config, "layer_types", None)
    sliding = ("sliding_attention" in layer_types) if layer_types else bool(getattr(config, "sliding_window", None))
    if sliding or _softcapped(config):
        flag = config_key.rsplit(".", 1)[0] + ".use_remove_padding"
        what = "sliding-window" if sliding else "soft-capped"
        raise ValueError(f"{config_key}: this model uses {what} attention, which packed (padding-free) "
                         f"forwards do not support; set {flag}=false")


def attention_implementation(remove_padding: bool, config=None) -> str:
    """The ``attn_implementation`` to load a model with: packed-capable (:mod:`verl.models.packed`), SDPA, or
    transformers' eager attention for soft-capped scores (Gemma 2), which SDPA cannot compute."""
    if not remove_padding:
        return "eager" if config is not None and _softcapped(config) else "sdpa"
    from verl.models.packed import register

    return register()


def load_pretrained(auto_class: str, path: str, *, dtype: torch.dtype | str, trust_remote_code: bool,
                    override_config: Mapping | None, remove_padding: bool, config_key: str, one_label: bool = False,
                    **kwargs):
    """``transformers.<auto_class>.from_pretrained(path)`` after the checks every loader makes, each error naming
    ``config_key``: the config (with ``override_config``), a class of ``auto_class`` for its model type, and packed
    forwards possible when ``remove_padding``. ``one_label``: one output per position, dropout off."""
    import transformers
    from transformers.models.auto import modeling_auto

    config = load_hf_config(path, trust_remote_code=trust_remote_code, override_config=override_config,
                            config_key=config_key)
    if is_vision_language(config):
        if auto_class != "AutoModelForCausalLM":
            raise ValueError(f"{config_key}={path!r} is a vision-language model ({config.model_type}); a reward model "
                             "must be a text model here. Use a text reward model, or a rule reward "
                             "(custom_reward_function) that reads the response.")
        auto_class = "AutoModelForImageTextToText"  # the causal LM of a vision-language model, vision tower included
    mapping = getattr(modeling_auto, _MAPPING_NAMES[auto_class])
    remote = trust_remote_code and auto_class in (getattr(config, "auto_map", None) or {})
    if config.model_type not in mapping and not remote:
        raise ValueError(f"{config_key}={path!r}: model type {config.model_type!r} has no {auto_class} in "
                         "transformers, so it cannot be loaded for this role. Supported types include: "
                         f"{', '.join(sorted(mapping)[:12])}, ...")
    if remove_padding:
        check_packable(config, config_key)
    if one_label:  # values and scores must be deterministic
        config.num_labels = 1
        config.classifier_dropout = 0.0
    model = getattr(transformers, auto_class).from_pretrained(
        os.path.expanduser(path), config=config, dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code,
        attn_implementation=attention_implementation(remove_padding, config), **kwargs)
    if remove_padding and is_vision_language(config):
        from verl.models.packed import use_varlen_in_vision_tower

        use_varlen_in_vision_tower(vision_tower(model))
    return model


_MAPPING_NAMES = {"AutoModelForCausalLM": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
                  "AutoModelForTokenClassification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
                  "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
                  "AutoModelForImageTextToText": "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"}


def load_causal_lm(path: str, *, dtype: torch.dtype | str = torch.float32, trust_remote_code: bool = False,
                   override_config: Mapping | None = None, remove_padding: bool = False,
                   use_gradient_checkpointing: bool = False, config_key: str = "actor_rollout_ref.model.path"):
    """A ``AutoModelForCausalLM`` (for a vision-language model: ``AutoModelForImageTextToText``) from ``path`` in ``dtype`` (fp32 master weights for training by default).

    ``config_key`` is the config key the path came from; it is named in every error. ``remove_padding``
    loads it with the packed attention of :mod:`verl.models.packed` (SDPA otherwise; both take padded
    batches, only the former also takes packed ones). A config's ``output_router_logits`` (mixture of
    experts) moves onto the model, see :func:`verl.models.moe.take_aux_loss_request`.
    """
    model = load_pretrained("AutoModelForCausalLM", path, dtype=dtype, trust_remote_code=trust_remote_code,
                            override_config=override_config, remove_padding=remove_padding, config_key=config_key)
    take_aux_loss_request(model)  # a mixture of experts' router loss: computed in the actor's updates only
    if use_gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model


def load_value_model(path: str, *, dtype: torch.dtype | str = torch.float32, trust_remote_code: bool = False,
                     override_config: Mapping | None = None, remove_padding: bool = False,
                     config_key: str = "critic.model.path"):
    """A value model: ``AutoModelForTokenClassification`` with one label, one scalar per token.

    The backbone comes from the checkpoint at ``path`` (normally a causal LM). Its ``score`` head is new
    unless the checkpoint already is a value model: then it is drawn from N(0, ``config.initializer_range``²)
    with a generator seeded with 0, so every rank builds the same head, and its bias is zero. Dropout in the
    head is off (values must be deterministic).
    """
    config = load_hf_config(path, trust_remote_code=trust_remote_code, override_config=override_config,
                            config_key=config_key)
    if is_vision_language(config):
        return _vision_language_value_model(path, dtype=dtype, trust_remote_code=trust_remote_code,
                                            override_config=override_config, remove_padding=remove_padding,
                                            config_key=config_key)
    model, info = load_pretrained("AutoModelForTokenClassification", path, dtype=dtype,
                                  trust_remote_code=trust_remote_code, override_config=override_config,
                                  remove_padding=remove_padding, config_key=config_key, one_label=True,
                                  output_loading_info=True)
    head_name = "score" if hasattr(model, "score") else "classifier"
    head = getattr(model, head_name)
    if any(key.split(".")[0] == head_name for key in info["missing_keys"]):
        _init_value_head(head, model.config.initializer_range, path, head_name)
    model.config.architectures = [type(model).__name__]
    return model


def _init_value_head(head: torch.nn.Linear, std: float, path: str, head_name: str) -> None:
    """N(0, std^2) from a generator seeded with 0 (every rank draws the same head), bias zero."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator, dtype=torch.float32) * std)
        if head.bias is not None:
            head.bias.zero_()
    logger.info("value model %s: new %s head, N(0, %g^2)", path, head_name, std)


VALUE_HEAD = "score"


def _vision_language_value_model(path: str, *, dtype, trust_remote_code: bool, override_config, remove_padding: bool,
                                 config_key: str):
    """A vision-language model as a value model: the whole model (vision tower and language model, read the same
    way as the policy's, with its M-RoPE positions and image inputs) and a ``score`` head of one output on its final
    hidden states. transformers has no token-classification class for these models, so the head is added to the
    image-text-to-text model; its ``lm_head`` stays (unused: frozen unless it is the tied input embedding). A
    folder that is a saved value model of this kind (its weights hold ``score.weight``) gives its head back."""
    model = load_pretrained("AutoModelForCausalLM", path, dtype=dtype, trust_remote_code=trust_remote_code,
                            override_config=override_config, remove_padding=remove_padding, config_key=config_key)
    text = model.config.get_text_config()
    weight = next(model.parameters())
    head = torch.nn.Linear(text.hidden_size, 1, bias=False, dtype=weight.dtype, device=weight.device)
    saved = _saved_tensor(path, f"{VALUE_HEAD}.weight")
    if saved is None:
        _init_value_head(head, getattr(text, "initializer_range", 0.02), path, VALUE_HEAD)
    elif tuple(saved.shape) != tuple(head.weight.shape):
        raise ValueError(f"{config_key}={path!r}: its {VALUE_HEAD}.weight has shape {tuple(saved.shape)}, not the "
                         f"{tuple(head.weight.shape)} of a value head on hidden size {text.hidden_size}")
    else:
        with torch.no_grad():
            head.weight.copy_(saved)
    model.add_module(VALUE_HEAD, head)
    output = model.get_output_embeddings()
    if output is not None and output.weight is not model.get_input_embeddings().weight:
        output.requires_grad_(False)
    return model


def _saved_tensor(path: str, name: str) -> torch.Tensor | None:
    """The tensor ``name`` from the safetensors files of the model folder ``path``, or None."""
    from safetensors import safe_open

    folder = os.path.expanduser(path)
    if not os.path.isdir(folder):
        return None
    for file in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
        with safe_open(os.path.join(folder, file), framework="pt") as reader:
            if name in reader.keys():
                return reader.get_tensor(name)
    return None


def load_tokenizer(path: str | None, *, config_key: str = "actor_rollout_ref.model.path",
                   trust_remote_code: bool = False, chat_template: str | None = None):
    """The tokenizer saved with a model (``config_key`` names the setting in errors), optionally with
    its chat template replaced (``model.custom_chat_template``)."""
    from transformers import AutoTokenizer

    if not path:
        raise ValueError(f"{config_key} is not set: give the folder of a Hugging Face model (with config.json and a "
                         "tokenizer)")
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if chat_template:
        tokenizer.chat_template = chat_template
    return tokenizer
