"""Rollout with Hugging Face ``generate``: the slow, simple reference engine (``rollout.name=hf``).

Sampling is ours, not the model's: the model's own ``generation_config`` (Qwen2.5 ships top_k 20,
top_p 0.8, repetition_penalty 1.05...) is set aside during the call, HF's warpers are left neutral,
and our logits processors apply temperature, top-k and top-p. The first of them records the
log-prob of each sampled token under the raw logits (before any filtering), one step at a time, so
log-probs never need the ``(steps, rows, vocab)`` tensor that ``output_logits`` would keep.

A vision-language model (Qwen2.5-VL) generates from prompts with images: the rows' ``multi_modal_inputs``
(``pixel_values``, ``image_grid_thw``, see :mod:`verl.models.vision`) go through the vision encoder once per
prompt, and its outputs are handed to ``generate`` for each of the prompt's ``n`` samples. A transformers version
whose models take no precomputed encoder outputs (no ``mm_encoder_outputs`` argument, as before 5.2x) gets each
sample's pixels instead, and encodes them in its own prefill.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from transformers import (GenerationConfig, LogitsProcessor, LogitsProcessorList, SuppressTokensLogitsProcessor,
                          TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from verl.models.vision import encode_images, multi_modal_batch, pixels_in_row_order, placeholder_token_ids
from verl.protocol import DataProto
from verl.workers.rollout.base import BaseRollout, SamplingParams, build_rollout_output, check_left_padded
from verl.workers.rollout.registry import IGNORED_CONFIG_KEYS, register_rollout

__all__ = ["HFRollout"]


class _SampledTokenLogProbs(LogitsProcessor):
    """Records log softmax(logits / T) at each sampled token.

    Placed first among the processors, it sees the model's raw logits. The token sampled at step t
    is known only when step t+1 starts (it is then the last column of ``input_ids``), or, for the
    last step, from the finished sequences: so it keeps one step's log-probs pending.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.pending: torch.Tensor | None = None
        self.values: list[torch.Tensor] = []

    def _take(self, tokens: torch.Tensor) -> None:
        self.values.append(self.pending.gather(-1, tokens[:, None]).squeeze(-1))
        self.pending = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            self._take(input_ids[:, -1])
        self.pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """The ``(rows, steps)`` log-probs, given the sequences ``generate`` returned."""
        if self.pending is not None:
            self._take(sequences[:, -1])
        return torch.stack(self.values, dim=1)


@contextlib.contextmanager
def _without_model_generation_config(module: torch.nn.Module):
    """Hide the model's ``generation_config`` so that ``generate`` fills unset fields from the
    library defaults only (it would otherwise take the model's top_k, penalties, suppressed tokens)."""
    saved = getattr(module, "generation_config", None)
    if saved is None:
        yield
        return
    module.generation_config = GenerationConfig()
    try:
        yield
    finally:
        module.generation_config = saved


@contextlib.contextmanager
def _seeded(seed, device: torch.device):
    """Seed the global RNG (``generate`` samples from it) for this call only, when ``seed`` is set."""
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(seed))
        yield


@register_rollout("hf")
class HFRollout(BaseRollout):
    """Generates with ``module.generate`` in micro-batches of ``rollout.micro_batch_size`` rows
    (of the ``B*n`` output rows; all at once when unset). The module is put in eval mode for the
    call and its previous mode restored. Sampling uses the global torch RNG: seed torch, or pass
    ``meta_info['seed']`` for a call that is reproducible on its own."""

    ignored_config_keys = IGNORED_CONFIG_KEYS["hf"]

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        params = self.sampling_params(prompts.meta_info)
        attention_mask = prompts.batch["attention_mask"]
        check_left_padded(attention_mask)
        device = next(self.module.parameters()).device
        input_ids = prompts.batch["input_ids"].repeat_interleave(params.n, dim=0).to(device)
        attention_mask = attention_mask.repeat_interleave(params.n, dim=0).to(device)
        micro_batch_size = self.config.micro_batch_size or input_ids.shape[0]

        responses, log_probs = [], []
        was_training = self.module.training
        self.module.eval()
        try:
            rows = prompts.non_tensor_batch.get("multi_modal_inputs")
            images = encode_images(self.module, rows, device) if self._takes("mm_encoder_outputs") else rows
            if images is not None and not any(r for r in images):
                images = None
            with _without_model_generation_config(self.module), _seeded(prompts.meta_info.get("seed"), device):
                for start in range(0, input_ids.shape[0], micro_batch_size):
                    end = start + micro_batch_size
                    extra = {} if images is None else self._image_kwargs(images, input_ids[start:end], start, params.n)
                    ids, lps = self._generate(input_ids[start:end], attention_mask[start:end], params, extra)
                    responses.append(ids)
                    log_probs.append(lps)
        finally:
            self.module.train(was_training)
        return build_rollout_output(prompts, _cat_padded(responses, params.pad_token_id),
                                    _cat_padded(log_probs, 0.0), params)

    def _takes(self, argument: str) -> bool:
        """Whether ``generate`` passes ``argument`` on to this model (its forward or its input preparation)."""
        return any(argument in inspect.signature(f).parameters
                   for f in (self.module.forward, self.module.prepare_inputs_for_generation))

    def _image_kwargs(self, images: list, input_ids: torch.Tensor, first_row: int, n: int) -> dict:
        """``generate``'s image arguments for output rows ``first_row ..`` (row ``i`` samples prompt ``i // n``):
        the encoder outputs of :func:`encode_images`, or (transformers without ``mm_encoder_outputs``) the rows'
        ``multi_modal_inputs``, whose pixels the model encodes itself."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        rows = [images[(first_row + i) // n] for i in range(input_ids.shape[0])]
        token_types = {}
        if self._takes("mm_token_type_ids"):
            token_types["mm_token_type_ids"] = (input_ids == self.module.config.image_token_id).int()
        if not self._takes("mm_encoder_outputs"):
            pixels = pixels_in_row_order(multi_modal_batch(rows, input_ids.device))
            return {**pixels, **token_types} if pixels else {}
        features = [f for row_features, _ in rows for f in row_features]
        if not features:
            return {}
        grids = torch.cat([grid for _, grid in rows if grid is not None]).to(input_ids.device)
        return {"mm_encoder_outputs": {"image": BaseModelOutputWithPooling(pooler_output=tuple(features))},
                "image_grid_thw": grids, **token_types}

    def _generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams,
                  extra: dict) -> tuple[torch.Tensor, torch.Tensor]:
        recorder = _SampledTokenLogProbs(params.temperature)
        processors = [recorder]
        placeholders = placeholder_token_ids(self.module.config)
        if placeholders:  # after the recorder (the log-probs stay the model's own, as the trainer computes them) and
            # before top-k/top-p, so that the filters keep tokens that can be sampled
            processors.append(SuppressTokensLogitsProcessor(placeholders, device=input_ids.device))
        sampling = {"do_sample": False}
        if not params.greedy:
            # HF's own warpers stay neutral (top_k=0 overrides its default of 50); ours run in order.
            sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
            if params.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                processors.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                processors.append(TopPLogitsWarper(params.top_p))
        generation_config = GenerationConfig(
            max_new_tokens=params.response_length, num_beams=1, num_return_sequences=1, use_cache=True,
            eos_token_id=list(params.eos_token_ids) or None, pad_token_id=params.pad_token_id, **sampling)
        sequences = self.module.generate(input_ids=input_ids, attention_mask=attention_mask,
                                         generation_config=generation_config,
                                         logits_processor=LogitsProcessorList(processors), **extra)
        return sequences[:, input_ids.shape[1]:], recorder.finish(sequences)


def _cat_padded(parts: list[torch.Tensor], value) -> torch.Tensor:
    """Concatenate rows of micro-batches that stopped after different numbers of steps."""
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=value) for p in parts])
