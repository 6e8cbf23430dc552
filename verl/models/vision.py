"""Vision-language models (Qwen2-VL, Qwen2.5-VL): their image inputs, M-RoPE positions and vision tower.

A prompt with images becomes, as in the original verl:

- ``input_ids`` in which each image's single ``<|image_pad|>`` of the chat template is expanded to one token
  per merged patch (``prod(image_grid_thw) / merge_size²``), where the vision encoder's outputs go;
- ``multi_modal_inputs``: ``{"pixel_values": (patches, C·t·p·p), "image_grid_thw": (images, 3)}`` per row;
- ``position_ids`` (3, T): M-RoPE's temporal/height/width positions, computed by the model class's own
  ``get_rope_index`` (text tokens count up on all three rows; an image's tokens take their grid coordinates).

The processor here is the model's tokenizer (chat template) plus its image processor, loaded on their own:
transformers builds the combined ``Qwen2_5_VLProcessor`` only with torchvision installed (for its video
processor), which this project does not require. An HF processor object is accepted too.
"""

from __future__ import annotations

import os
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from verl.models.logprob import call_as_forward, encoded_images

__all__ = ["VisionProcessor", "copy_processor_files", "encode_images", "is_vision_language", "load_processor",
           "multi_modal_batch", "pixels_in_row_order", "rope_index", "vision_tower"]

IMAGE_PLACEHOLDER = "<image>"

# What AutoProcessor reads besides the tokenizer's files; preprocessor_config.json marks a folder that has a processor.
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json",
                   "chat_template.json", "chat_template.jinja")


def is_vision_language(config) -> bool:
    """Whether a transformers config is a vision-language model's (it has a vision tower)."""
    return getattr(config, "vision_config", None) is not None


def placeholder_token_ids(config) -> list[int]:
    """The tokens that only the processor may write (a vision-language model's image/video placeholders and the
    vision-start mark): a response that held one would make the model look for image features it has not got
    (transformers raises "Image features and image tokens do not match"), so generation never samples them.
    Empty for a text model."""
    if not is_vision_language(config):
        return []
    names = ("image_token_id", "video_token_id", "vision_start_token_id")
    return sorted({int(v) for v in (getattr(config, n, None) for n in names) if v is not None})


def causal_lm_class(config):
    """The transformers auto class that builds the generating model of ``config``: ``AutoModelForImageTextToText``
    for a vision-language model (its language model with the vision tower), else ``AutoModelForCausalLM``."""
    import transformers

    return transformers.AutoModelForImageTextToText if is_vision_language(config) else transformers.AutoModelForCausalLM


@dataclass
class VisionProcessor:
    """What turns a chat with images into model inputs: ``tokenizer`` (with the model's chat template),
    ``image_processor`` (a Qwen2-VL image processor: ``pixel_values`` and ``image_grid_thw``) and the model
    ``config`` (image token id, M-RoPE settings)."""

    tokenizer: Any
    image_processor: Any
    config: Any

    @property
    def image_token_id(self) -> int:
        return int(self.config.image_token_id)

    def __call__(self, text: str, images: Sequence) -> tuple[list[int], dict[str, torch.Tensor]]:
        """Token ids of ``text`` (a chat-templated prompt holding one image token per image) with each image token
        expanded to the image's length, and the image inputs (empty without images)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        placeholders = sum(1 for t in ids if t == self.image_token_id)
        if placeholders != len(images):
            raise ValueError(f"the chat-templated prompt holds {placeholders} image token(s) but the row has "
                             f"{len(images)} image(s)")
        if not images:
            return ids, {}
        inputs = self.image_processor(images=list(images), return_tensors="pt")
        grid = inputs["image_grid_thw"]
        lengths = iter((grid.prod(-1) // self.image_processor.merge_size**2).tolist())
        expanded = []
        for token in ids:
            expanded.extend([token] * next(lengths) if token == self.image_token_id else [token])
        return expanded, {"pixel_values": inputs["pixel_values"], "image_grid_thw": grid}


def load_processor(path: str, *, config_key: str = "actor_rollout_ref.model.path", trust_remote_code: bool = False,
                   tokenizer=None) -> VisionProcessor | None:
    """The :class:`VisionProcessor` of the model at ``path``, or None for a text-only model. ``tokenizer``: the one
    already loaded (else the folder's)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    if not is_vision_language(config):
        return None
    # Only now: importing the image processors takes seconds (torchvision where installed), a text model's run none.
    from transformers import AutoImageProcessor, AutoTokenizer

    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "preprocessor_config.json")):
        raise FileNotFoundError(f"{config_key}={path!r} is a vision-language model ({config.model_type}) but the "
                                "folder has no preprocessor_config.json (its image processor); copy it from the "
                                "model's original folder.")
    image_processor = AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    if not hasattr(image_processor, "merge_size"):
        raise ValueError(f"{config_key}={path!r}: image processor {type(image_processor).__name__} is not a "
                         "Qwen2-VL-style one (patches merged merge_size x merge_size); only Qwen2-VL and Qwen2.5-VL "
                         "are supported as vision-language models.")
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    return VisionProcessor(tokenizer=tokenizer, image_processor=image_processor, config=config)


def copy_processor_files(source: str, target: str) -> list[str]:
    """Copy the processor files (:data:`PROCESSOR_FILES`) of the model folder ``source`` that ``target`` lacks into
    ``target``, each written under a temporary name and renamed, so that ``AutoProcessor.from_pretrained(target)``
    loads what ``source`` would. Files already in ``target`` are kept: a chat template the tokenizer saved there is
    the one it was trained with (``custom_chat_template`` included). Nothing is copied from a folder without
    ``preprocessor_config.json`` (a text model's). Returns the names copied."""
    import shutil

    from verl.utils.fs import atomic_write

    if not os.path.isfile(os.path.join(source, "preprocessor_config.json")):
        return []
    copied = []
    for name in PROCESSOR_FILES:
        origin, destination = os.path.join(source, name), os.path.join(target, name)
        if os.path.isfile(origin) and not os.path.exists(destination):
            with open(origin, "rb") as src, atomic_write(destination) as dst:
                shutil.copyfileobj(src, dst)
            copied.append(name)
    return copied


def as_vision_processor(processor, tokenizer) -> VisionProcessor:
    """``processor`` as a :class:`VisionProcessor`: one already, or a transformers processor (with
    ``image_processor`` and a ``config`` attribute, as ``verl.utils.hf_processor`` returns it)."""
    if isinstance(processor, VisionProcessor):
        return processor
    image_processor, config = getattr(processor, "image_processor", None), getattr(processor, "config", None)
    if image_processor is None or config is None or not hasattr(image_processor, "merge_size"):
        raise ValueError(f"processor {type(processor).__name__} is not a Qwen2-VL-style processor with a model config "
                         "(load it with verl.utils.hf_processor or verl.models.vision.load_processor)")
    return VisionProcessor(tokenizer=tokenizer, image_processor=image_processor, config=config)


@torch.no_grad()
def rope_index(config, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               image_grid_thw: torch.Tensor | None) -> torch.Tensor:
    """M-RoPE position ids (3, T) of one left-padded row, by the model class's own ``get_rope_index`` (run on the
    config alone, no weights); padding positions hold 0."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    import transformers

    model_class = getattr(transformers, MODEL_MAPPING_NAMES[config.model_type])
    host = types.SimpleNamespace(config=config)
    host.get_vision_position_ids = types.MethodType(model_class.get_vision_position_ids, host)
    token_type = (input_ids == config.image_token_id).int()
    positions, _ = model_class.get_rope_index(host, input_ids[None], mm_token_type_ids=token_type[None],
                                              image_grid_thw=image_grid_thw, attention_mask=attention_mask[None])
    return positions[:, 0]


def multi_modal_batch(rows: Sequence[dict], device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """The ``multi_modal_inputs`` of a micro-batch's rows (``{}`` for a row without images), each distinct row's
    images once; ``{}`` when no row has images.

    A prompt's ``n`` samples carry the same images (the same tensors after the batch's repeat, or equal ones after a
    transfer), and the vision tower would encode them ``n`` times: ``pixel_values`` and ``image_grid_thw`` hold
    the images of the rows whose images differ from every earlier row's, and ``image_index`` (images,) gives, for
    each image of the rows in row order (the order their image tokens come in the batch), its place among those.
    :func:`verl.models.logprob.encoded_images` lays the encoder's outputs back out in row order; gradients of a
    shared image add up, as they would for separate copies. ``image_index`` stays on the CPU (it is read as a
    list); the pixels and grids go to ``device``. Rows are compared whole: an image shared by two rows whose other
    images differ is encoded for each."""
    distinct: list[dict] = []
    firsts: list[int] = []  # each distinct row's first image among the distinct images
    index: list[int] = []
    same: dict[int, int] = {}  # id(pixel_values) -> its distinct row; ``rows`` keeps every tensor alive, so ids
    # stay unique for the whole call
    for row in rows:
        if not row:
            continue
        at = same.get(id(row["pixel_values"]))
        if at is None:
            at = next((i for i, kept in enumerate(distinct) if _same_images(kept, row)), None)
        if at is None:
            at = len(distinct)
            firsts.append(firsts[-1] + len(distinct[-1]["image_grid_thw"]) if distinct else 0)
            distinct.append(row)
        same[id(row["pixel_values"])] = at
        index.extend(range(firsts[at], firsts[at] + len(row["image_grid_thw"])))
    if not distinct:
        return {}
    joined = {key: torch.cat([r[key] for r in distinct]).to(device) for key in ("pixel_values", "image_grid_thw")}
    return {**joined, "image_index": torch.tensor(index, dtype=torch.long)}


def _same_images(a: dict, b: dict) -> bool:
    """Equal grids and pixels; nine patches spread over the rows first (different pictures nearly always differ
    there, where a corner alone is often the same plain background)."""
    pa, pb = a["pixel_values"], b["pixel_values"]
    if pa.shape != pb.shape or not torch.equal(a["image_grid_thw"], b["image_grid_thw"]):
        return False
    probe = slice(None, None, max(1, len(pa) // 8))
    return torch.equal(pa[probe], pb[probe]) and torch.equal(pa, pb)


def pixels_in_row_order(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """:func:`multi_modal_batch`'s images repeated back out in row order (for a model that encodes its own
    pixels: transformers' ``generate`` before ``mm_encoder_outputs``); inputs without ``image_index`` are
    already in row order."""
    if not inputs or "image_index" not in inputs:
        return dict(inputs)
    grid, index = inputs["image_grid_thw"], inputs["image_index"]
    patches = inputs["pixel_values"].split(grid.prod(-1).tolist())
    return {"pixel_values": torch.cat([patches[i] for i in index.tolist()]),
            "image_grid_thw": grid[index.to(grid.device)]}


@torch.no_grad()
def encode_images(module: torch.nn.Module, rows: Sequence[dict] | None,
                  device: torch.device) -> list[tuple[tuple[torch.Tensor, ...], torch.Tensor | None]] | None:
    """The vision encoder's outputs for each prompt's images, encoded once (a rollout reuses them for the prompt's
    ``n`` samples): per row of ``multi_modal_inputs``, its images' features (one ``(tokens, hidden)`` tensor
    each) and ``image_grid_thw`` (None for a row without images); None when no row has images. Runs through the
    root module's forward, so that FSDP's hooks gather the vision tower's weights as for any forward."""
    inputs = multi_modal_batch(rows, device) if rows is not None else {}
    if not inputs:
        return None

    def encode(pixel_values, image_grid_thw):  # as arguments, which FSDP's forward hooks see
        return encoded_images(module, {**inputs, "pixel_values": pixel_values, "image_grid_thw": image_grid_thw})

    features = call_as_forward(module, encode, inputs["pixel_values"], inputs["image_grid_thw"])
    per_row, at = [], 0
    for row in rows:
        count = len(row["image_grid_thw"]) if row else 0
        per_row.append((tuple(features[at:at + count]), row["image_grid_thw"] if row else None))
        at += count
    return per_row


def vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The vision encoder of a vision-language model (``model.model.visual`` for Qwen2-VL / Qwen2.5-VL), else None."""
    backbone = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    return getattr(backbone, "visual", None)
