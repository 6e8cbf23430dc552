"""The native rollout engine (``actor_rollout_ref.rollout.name=native``): continuous batching over
a slot KV cache, batched prefill shared by the ``n`` samples of a prompt, CUDA-graph decode.

One call of :meth:`NativeRollout.generate_sequences`:

1. re-bind the module's weights (FSDP may have unsharded them into new storage; an optimizer step
   may have changed them: either way the next tokens come from the current values, nothing copied);
2. size and allocate the slot cache (``gpu_memory_utilization`` of free GPU memory, at most
   ``max_num_seqs`` slots and one per output row);
3. loop: admit waiting rows into free slots (prefill of their prompts in chunks of at most
   ``max_num_batched_tokens`` tokens, each prompt once, its keys/values copied into the slots of its
   samples, first token sampled), then decode all running slots ``[0, b)`` several steps at a time
   (on CUDA the decode attention reads a prompt's keys/values once for the samples prefilled with it,
   in chunks the scheduler keeps through refills and packing: ``Run.share_chunk``).
   The host reads which rows stopped (one device sync) every ``sync_every`` steps while rows wait, to
   refill freed slots; every ``4 * sync_every`` when none wait but rows can stop at eos, to pack the
   running rows into low slots so that ``b`` shrinks; otherwise only when the shortest remaining
   budget runs out;
4. free the cache (``free_cache_engine``), so training gets the memory back.

Multi-turn episodes (:meth:`NativeRollout.generate_episodes`) run in the same loop. A row whose turn
ends keeps its slot, paused, while the caller's ``on_turn`` future (a tool call, a simulated user)
runs; the other rows keep decoding, and waiting rows are admitted into free slots. When the future
has the continuation, only its tokens are prefilled into the slot, attending to the keys/values the
slot already holds (:func:`~verl.workers.rollout.native.model.extend`), and the row decodes on. So no
episode waits for the others' turns, and no context is computed twice.

The asynchronous trainer modes keep groups running across calls (:meth:`NativeRollout.generate_stream`,
:mod:`~verl.workers.rollout.native.stream`): a call returns once enough groups have finished, and the rows still
running resume in a later call, with the weights of that moment (partial rollout). The scheduler of both is
:class:`~verl.workers.rollout.native.scheduler.Run`.

A vision-language model (Qwen2-VL, Qwen2.5-VL) generates from prompts with images: the
vision tower encodes each prompt's images once (:func:`verl.models.vision.encode_images`), the prefill takes
the token embeddings with those features in place of the image placeholders and the prompt's M-RoPE positions
(the data's 3-row ``position_ids``), and each slot decodes at its text positions (``SlotState.rope_delta``
moves them past the images' compressed positions). The stream of the asynchronous modes keeps each group's
features and positions, so a suspended row is prefilled again with them (its generated tokens at text
positions). Placeholder tokens are never sampled; the recorded log-probs stay those of the raw logits, as the
trainer computes them. Multi-turn episodes extend with text only (prompts with images are refused there).

Decode is captured as one CUDA graph per batch-size bucket (``enforce_eager=True`` runs it eagerly,
as on CPU; so does a mixture of experts whose grouped matmul reads its group sizes on the host, see
:func:`~verl.workers.rollout.native.model.decode_capturable`). Graphs hold the addresses of the weights and of
the cache, so they are recaptured when either moved.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from verl.models.vision import encode_images
from verl.protocol import DataProto
from verl.utils import startup
from verl.workers.rollout.base import BaseRollout, EpisodeTokens, TurnHandler, build_rollout_output, check_left_padded
from verl.workers.rollout.native.cache import SlotCache, plan_slots, slot_bytes
from verl.workers.rollout.native.scheduler import PromptImages, Run, SlotState
from verl.workers.rollout.native.stream import StreamRun, StreamServer
from verl.workers.rollout.native.weights import DecoderWeights
from verl.workers.rollout.registry import IGNORED_CONFIG_KEYS, register_rollout

__all__ = ["NativeRollout"]


class _DecodeGraphs:
    """One captured decode step per batch-size bucket and shared-prompt chunk, valid while weights and cache stay put."""

    def __init__(self):
        self.key = None
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.captures = 0

    def validate(self, key) -> None:
        if key != self.key:
            self.reset()
            self.key = key

    def reset(self) -> None:
        self.graphs.clear()
        self.pool = None
        self.key = None

    def run(self, key: tuple[int, int], step) -> torch.Tensor:
        """Replay the graph of ``key`` (batch size, shared-prompt chunk), or run ``step`` and capture it."""
        if key in self.graphs:
            graph, logits = self.graphs[key]
            graph.replay()
            return logits
        # The warm-up is this step's real computation (same inputs), then the capture records it.
        with startup.WORKER.phase("cuda graph capture"):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                logits = step()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            # thread_local: a separate_async rollout receives weights (allocating) on another thread meanwhile.
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                static_logits = step()
            self.pool = graph.pool()
            self.graphs[key] = (graph, static_logits)
            self.captures += 1
        return logits


@register_rollout("native")
class NativeRollout(BaseRollout):
    """Fast generation with the actor's own weights; see the module docstring.

    Reads ``gpu_memory_utilization``, ``max_num_seqs``, ``max_num_batched_tokens`` (prefill chunk),
    ``max_model_len``, ``enforce_eager``, ``free_cache_engine`` besides the sampling keys. Sampling
    uses a generator seeded by ``meta_info['seed']``, else by a draw from torch's global RNG.
    ``last_stats`` describes the last call (``profile = True`` adds synchronised phase timings).
    """

    ignored_config_keys = IGNORED_CONFIG_KEYS["native"]

    def __init__(self, config, module: torch.nn.Module, tokenizer):
        super().__init__(config, module, tokenizer)
        self.weights = DecoderWeights(module)
        self.cache: SlotCache | None = None
        self.state: SlotState | None = None
        self.graphs = _DecodeGraphs()
        self.profile = False
        self.last_stats: dict = {}
        self.stream: StreamRun | None = None  # the asynchronous trainer's groups in flight
        self.server: StreamServer | None = None  # the same, decoded on a thread of its own (serve())

    def free_cache(self) -> None:
        """Release the KV cache and the captured graphs (their memory pool)."""
        self.cache = self.state = None
        self.graphs.reset()

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        params = self.sampling_params(prompts.meta_info)
        with self.server.paused() if self.server is not None else contextlib.nullcontext():
            responses, log_probs, _ = self._generate(prompts, params, None)
        return build_rollout_output(prompts, responses, log_probs, params)

    @torch.no_grad()
    def generate_episodes(self, prompts: DataProto, on_turn: TurnHandler) -> EpisodeTokens:
        """Multi-turn episodes with continuous admission and the cache kept between turns (module docstring)."""
        params = self.sampling_params(prompts.meta_info)
        responses, log_probs, run = self._generate(prompts, params, on_turn)
        lengths = torch.as_tensor(run.lengths)
        columns = torch.arange(params.response_length, device=responses.device)
        inside = columns[None] < lengths.to(responses.device)[:, None]
        generated = run.generated[: run.rows] & inside
        return EpisodeTokens(responses.masked_fill(~inside, params.pad_token_id).cpu(), generated.long().cpu(),
                             log_probs.masked_fill(~generated, 0.0).cpu(), lengths)

    @torch.no_grad()
    def generate_stream(self, prompts: DataProto | None, version: int, until_groups: int, wait_uids=(),
                        cancel_uids=()) -> tuple[DataProto | None, dict]:
        """One call of the asynchronous trainer's rollout (:mod:`~verl.workers.rollout.native.stream`): drop the
        groups in ``cancel_uids``, queue ``prompts`` (one group of ``n`` samples each, named by
        ``non_tensor_batch['uid']``), decode with the current weights (policy ``version``) until
        ``until_groups`` groups have finished and those in ``wait_uids`` too, and suspend the rest.

        Returns the finished groups' rows as :func:`build_rollout_output` builds them (prompts as submitted),
        with ``rollout_min_version``/``rollout_max_version`` per row in ``non_tensor_batch`` (the policy
        versions of its first and last generated tokens), or None; and the call's statistics."""
        if self.server is not None:
            chunks, stats = self.server.exchange(prompts, cancel_uids, until_groups, wait_uids)
            return self._stream_output(chunks, self.server.stream.params), stats
        self.weights.bind()
        if self.stream is None:
            params = self.sampling_params({})
            self.stream = StreamRun(self, params, width=int(self.config.prompt_length))
        stream = self.stream
        cancelled = stream.cancel(cancel_uids) if len(cancel_uids) else 0
        if prompts is not None and len(prompts):
            check_left_padded(prompts.batch["attention_mask"])
            stream.add(prompts)
        waiting = stream.active_rows()
        stats = {"cancelled_groups": cancelled}
        if waiting:
            self._ensure_cache(waiting, self._cache_length(stream.width, stream.params.response_length))
            try:
                stats.update(stream.run(version, self._generator({}), until_groups, wait_uids))
            finally:
                self.last_stats = stream.stats
                stream.suspend()
                if self.config.free_cache_engine:
                    self.free_cache()
        chunk = stream.take_finished()
        stats.update(finished_groups=len(chunk[0]), in_flight_groups=len(stream))
        return self._stream_output([chunk], stream.params), stats

    def serve(self) -> StreamServer:
        """Turn this engine into a rollout that decodes on its own thread (``separate_async``, or
        ``colocate_async.overlap_generation``): from now on
        :meth:`generate_stream` hands groups over to it and takes the finished ones, and new weights go through
        ``server.stage_weights``. The module must be this worker's own copy (no other code changes it)."""
        if self.server is None:
            self.weights.bind()
            self.server = StreamServer(self, self.sampling_params({}), width=int(self.config.prompt_length))
        return self.server

    @staticmethod
    def _stream_output(chunks: list, params) -> DataProto | None:
        groups = [g for chunk in chunks for g in chunk[0]]
        if not groups:
            return None
        tokens, log_probs = (torch.cat([chunk[i] for chunk in chunks if len(chunk[0])]) for i in (1, 2))
        first, last = (np.concatenate([chunk[i] for chunk in chunks if len(chunk[0])]) for i in (3, 4))
        output = build_rollout_output(DataProto.concat([g.prompt for g in groups]), tokens, log_probs, params)
        output.non_tensor_batch.update(rollout_min_version=first, rollout_max_version=last)
        return output

    def _generate(self, prompts: DataProto, params, on_turn):
        check_left_padded(prompts.batch["attention_mask"])
        self.weights.bind()
        device = self.weights.device
        input_ids = prompts.batch["input_ids"].to(device)
        valid = prompts.batch["attention_mask"].to(device).bool()
        batch, width = input_ids.shape
        images = self._prompt_images(prompts, device)  # before the cache takes the free memory
        self._ensure_cache(batch * params.n, self._cache_length(width, params.response_length))
        generator = self._generator(prompts.meta_info)
        if images is not None and on_turn is not None and any(f is not None for f in images.features):
            raise ValueError("multi-turn episodes with images: the native engine extends an episode with text only. "
                             "Use single-turn prompts for vision-language data (drop actor_rollout_ref.rollout."
                             "multi_turn.enable)")
        run = Run(self, params, input_ids, valid, generator, on_turn, images)
        try:
            responses, log_probs = run.generate()
        finally:
            self.last_stats = run.stats
            if self.config.free_cache_engine:
                self.free_cache()
        return responses, log_probs, run

    def _prompt_images(self, prompts: DataProto, device: torch.device) -> PromptImages | None:
        """A vision-language model's prompts: their images encoded once each (not once per sample) and their
        M-RoPE positions; None for a text model, or data without the three-row ``position_ids``."""
        positions = prompts.batch.get("position_ids", None)
        if self.weights.mrope_section is None or positions is None or positions.dim() != 3:
            image_token = self.weights.image_token_id
            if image_token is not None and bool((prompts.batch["input_ids"] == image_token).any()):
                raise ValueError(  # e.g. a multi-turn agent loop, which passes text prompts only
                    "prompts hold image placeholder tokens but no 3-row M-RoPE position_ids reached the rollout, so "
                    "their images cannot be placed; generate vision-language prompts in single-turn, synchronous "
                    "rollouts (drop actor_rollout_ref.rollout.multi_turn.enable)")
            if any(prompts.non_tensor_batch.get("multi_modal_inputs", ())):
                raise ValueError(
                    f"prompts with images for a {self.weights.model_type} model: the native engine generates with "
                    "images for Qwen2-VL / Qwen2.5-VL, from prompts with their 3-row M-RoPE position_ids (as verl's "
                    "RL dataset builds them); set actor_rollout_ref.rollout.name=hf to generate with transformers")
            return None
        encoded = encode_images(self.module, prompts.non_tensor_batch.get("multi_modal_inputs"), device)
        features = [torch.cat(f) if f else None for f, _ in encoded] if encoded else [None] * len(prompts)
        return PromptImages(features, positions.to(device))

    def _cache_length(self, width: int, length: int) -> int:
        """Columns of a slot: prompt width + response length, rounded up to 16."""
        max_model_len = self.config.max_model_len or 0
        if max_model_len and width + length > int(max_model_len):
            raise ValueError(f"prompt width {width} + response_length {length} exceeds "
                             f"actor_rollout_ref.rollout.max_model_len={max_model_len}")
        return -(-(width + length) // 16) * 16

    def _generator(self, meta_info: dict) -> torch.Generator:
        """The call's sampling generator: seeded by ``meta_info['seed']``, else by a draw from torch's RNG."""
        seed = meta_info.get("seed")
        seed = int(torch.randint(0, 2**62, ()).item()) if seed is None else int(seed)
        return torch.Generator(device=self.weights.device).manual_seed(seed)

    def _ensure_cache(self, rows: int, max_len: int) -> None:
        w = self.weights
        shape = (w.num_layers, w.num_kv_heads, max_len, w.head_dim, w.dtype, w.device)
        want = max(1, min(rows, int(self.config.max_num_seqs)))
        if self.cache is not None and self.cache.fits(*shape) and self.cache.num_slots >= want:
            return
        self.free_cache()
        per_slot = slot_bytes(w.num_layers, w.num_kv_heads, w.head_dim, max_len, w.dtype)
        # Room left for activations: float32 logits and sampling buffers of every running row.
        reserve = 4 * want * w.lm_head.shape[0] * 4
        slots = plan_slots(rows, int(self.config.max_num_seqs), per_slot, w.device,
                           float(self.config.gpu_memory_utilization), reserve)
        self.cache = SlotCache(w.num_layers, slots, w.num_kv_heads, max_len, w.head_dim, w.dtype, w.device)
        self.state = SlotState(slots, w.device)
