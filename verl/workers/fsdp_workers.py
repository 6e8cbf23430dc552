"""The FSDP2 workers: one class per role, whose ``@register``-ed methods the driver calls.

- :class:`ActorRolloutRefWorker` — the policy (``actor_rollout_ref`` section): training, generation
  with the actor's own weights (no second copy), and the frozen reference policy;
- :class:`CriticWorker` — the value model (``critic`` section);
- :class:`RewardModelWorker` — a sequence-classifier reward model (``reward_model`` section).

Each worker gets its section as a typed config (:mod:`verl.workers.config`; the driver passes the ones it
resolved, a dict or an OmegaConf node is converted on arrival, as the original does). The workers are thin:
they load models, wrap them in :class:`~verl.workers.engine.FSDPEngine`, take their per-rank batch sizes from
:mod:`verl.workers.config.batching`, and move data on and off the device; the math lives in :mod:`.actor`,
:mod:`.critic` and :mod:`verl.rewards.model`. Every ``DP_COMPUTE_PROTO`` method receives this rank's rows,
moves them to ``self.device`` and returns its result on the CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import numpy as np
import torch

from verl.checkpoint_engine import WeightSyncGroup, apply_weights, drain
from verl.interactions.utils.interaction_registry import initialize_interactions_from_config as load_interactions
from verl.models import load_causal_lm, load_tokenizer, load_value_model
from verl.models.lora import LoraSettings, adapters_disabled, apply_lora, lora_config_dict, merge_into_gathered_weights
from verl.models.vision import vision_tower
from verl.protocol import DataProto
from verl.rewards.model import compute_rm_scores, load_reward_model, same_tokenizer
from verl.single_controller import Dispatch, Worker, register
from verl.single_controller.profiling import DistProfilerExtension
from verl.single_controller.worker import NODE_IP_ENV, free_port
from verl.tools.base import load_tools
from verl.utils import startup
from verl.utils.debug import memory_usage
from verl.utils.profiler.config import ProfilerConfig
from verl.utils.profiler.profile import DistProfiler
from verl.workers.actor import DataParallelPPOActor
from verl.workers.config import ActorRolloutRefConfig, CriticConfig, ModelConfig, RewardModelConfig
from verl.workers.config.batching import critic_batching, policy_batching, reward_model_batching
from verl.workers.critic import DataParallelPPOCritic
from verl.workers.engine import FSDPEngine
from verl.workers.engine.fsdp import mixed_precision_policy
from verl.workers.rollout.agent_loop import ToolAgentLoop
from verl.workers.rollout.registry import get_rollout_class

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "RewardModelWorker"]

_GIB = 1024**3


def _checkpointing(model_config: ModelConfig) -> bool:
    """``enable_gradient_checkpointing``; null means "not chosen yet": the driver resolves it from the
    memory estimate before the workers start, so only a worker built outside the trainer sees it, and
    takes the safe choice."""
    value = model_config.enable_gradient_checkpointing
    return True if value is None else bool(value)


def _memory_metrics(device: torch.device) -> dict[str, float]:
    cuda = device.type == "cuda"
    return {"perf/max_memory_allocated_gb": torch.cuda.max_memory_allocated(device) / _GIB if cuda else 0.0,
            "perf/max_memory_reserved_gb": torch.cuda.max_memory_reserved(device) / _GIB if cuda else 0.0,
            "perf/cpu_memory_used_gb": memory_usage().get("cpu_rss_gb", 0.0)}


def _temperature(data: DataProto, default: float) -> float:
    """``meta_info['temperature']`` (else ``default``); 0 (greedy) scores at 1.0, as the rollout does."""
    value = data.meta_info.get("temperature")
    value = float(default if value is None else value)
    return value if value > 0 else 1.0


def _freeze_vision_tower(model: torch.nn.Module, path: str) -> None:
    """``actor.freeze_vision_tower``: the vision encoder gets no gradient and no optimizer state (the engine's
    optimizer takes only parameters that require grad)."""
    tower = vision_tower(model)
    if tower is None:
        raise ValueError(f"actor_rollout_ref.actor.freeze_vision_tower=True, but actor_rollout_ref.model.path={path!r} "
                         "has no vision tower (a text-only model); drop the key.")
    tower.requires_grad_(False)


class _RoleWorker(Worker, DistProfilerExtension):
    """What the three roles share: the collective timeout (``actor_rollout_ref.nccl_timeout``; colocated
    roles share one process group, and the first role of a process to join sets it), and the profiler the driver
    starts and stops around the steps ``global_profiler.steps`` lists (``start_profile``/``stop_profile``)."""

    def __init__(self, nccl_timeout_s: float | None = None):
        super().__init__()
        self.nccl_timeout_s = float(ActorRolloutRefConfig.nccl_timeout if nccl_timeout_s is None else nccl_timeout_s)

    def _init_profiler(self, config: ProfilerConfig, role: str) -> None:
        DistProfilerExtension.__init__(self, DistProfiler(self.rank, config, save_file_prefix=role))

    def _start_init(self, model_config: ModelConfig) -> str:
        self.init_process_group(timeout_s=self.nccl_timeout_s)
        if model_config.external_lib:
            importlib.import_module(model_config.external_lib)  # registers custom architectures with transformers
        return model_config.path


class ActorRolloutRefWorker(_RoleWorker):
    """The policy's roles on one device. ``config`` is the ``actor_rollout_ref`` section; ``role`` one of
    ``actor``, ``rollout``, ``ref``, ``actor_rollout``, ``actor_rollout_ref``, ``actor_ref``. A ``rollout`` alone
    (``separate_async``) holds its own whole copy of the model and receives the actor's weights; so does a colocated
    rollout with ``rollout_copy`` (``colocate_async.overlap_generation``), which decodes on a thread of its own while
    the actor trains and takes the actor's weights through :meth:`update_rollout_weights`.

    The rollout engine generates with the actor engine's module (unsharded around each call); the
    reference policy is a second, frozen copy of ``model.path`` in its own engine (no optimizer),
    computing in ``ref.fsdp_config.dtype`` (the actor's unless set).
    """

    ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref", "actor_ref")

    def __init__(self, config: ActorRolloutRefConfig, role: str, nccl_timeout_s: float | None = None,
                 rollout_copy: bool = False):
        config = ActorRolloutRefConfig.from_config(config)
        super().__init__(config.nccl_timeout if nccl_timeout_s is None else nccl_timeout_s)
        if role not in self.ROLES:
            raise ValueError(f"ActorRolloutRefWorker role must be one of {list(self.ROLES)}, got {role!r}")
        self.config, self.role = config, role
        self._is_actor = role in ("actor", "actor_rollout", "actor_rollout_ref", "actor_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref", "actor_ref")
        if rollout_copy and not (self._is_actor and self._is_rollout):
            raise ValueError(f"rollout_copy is for a worker that is both actor and rollout, not role {role!r}")
        # The rollout has its own copy of the weights: on devices of its own, or colocated and decoding on a thread.
        self._own_rollout_weights = self._is_rollout and (rollout_copy or not self._is_actor)
        self._init_profiler(functools.reduce(ProfilerConfig.union, [
            section.profiler for section, used in ((config.actor, self._is_actor), (config.rollout, self._is_rollout),
                                                   (config.ref, self._is_ref)) if used]), role)
        self.tokenizer = self.actor_engine = self.actor = self.rollout = self.ref_engine = self.ref_policy = None
        self.rollout_module: torch.nn.Module | None = None  # a rollout's own copy of the model
        self.lora: LoraSettings | None = None
        self.weight_sync: WeightSyncGroup | None = None  # to or from the other pool (separate_async)

    def _require(self, needed: bool, what: str, method: str) -> None:
        if not needed:
            raise RuntimeError(f"{method}() needs the {what}, but this worker has role {self.role!r}")
        if self.tokenizer is None:
            raise RuntimeError(f"{method}() called before init_model()")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        config, model_config, actor = self.config, self.config.model, self.config.actor
        path = self._start_init(model_config)
        # Sampling draws from the process RNG: seed it per rank so a run is reproducible, on either backend.
        random.seed(config.rollout.seed + self.rank)
        np.random.seed(config.rollout.seed + self.rank)
        torch.manual_seed(config.rollout.seed + self.rank)
        self.tokenizer = load_tokenizer(model_config.tokenizer_path or path, config_key="actor_rollout_ref.model.path",
                                        trust_remote_code=model_config.trust_remote_code,
                                        chat_template=model_config.custom_chat_template)
        remove_padding = model_config.use_remove_padding
        load_kwargs = {"trust_remote_code": model_config.trust_remote_code,
                       "override_config": model_config.override_config, "remove_padding": remove_padding}
        # use_fused_kernels picks the log-prob reduction explicitly; otherwise the fastest available one.
        kernel = model_config.fused_kernel_options["impl_backend"] if model_config.use_fused_kernels else "auto"
        self.lora = LoraSettings.from_config(model_config, "actor_rollout_ref.model")
        batching = policy_batching(config, self.world_size, actor=self._is_actor, reference=self._is_ref)
        if self._own_rollout_weights:
            # A rollout of its own (separate_async, or colocated on a thread): a whole copy of the model in the dtype
            # the colocated rollout computes in; the trainer's weights arrive through receive_weights or
            # update_rollout_weights.
            dtype = mixed_precision_policy(actor.fsdp_config, self.device).param_dtype
            with startup.WORKER.phase("rollout model load"):
                self.rollout_module = load_causal_lm(path, dtype=dtype, **load_kwargs).to(self.device).eval()
        if self._is_actor:
            with startup.WORKER.phase("actor model load"):
                model = load_causal_lm(path, dtype=actor.fsdp_config.model_dtype, **load_kwargs)
                if self.lora is not None:
                    apply_lora(model, self.lora)
                if actor.freeze_vision_tower:
                    _freeze_vision_tower(model, path)
            with startup.WORKER.phase("actor fsdp"):
                self.actor_engine = FSDPEngine(
                    model, fsdp_config=actor.fsdp_config, optim_config=actor.optim,
                    grad_clip=actor.grad_clip, device=self.device, compile_layers=actor.use_torch_compile,
                    enable_gradient_checkpointing=_checkpointing(model_config),
                    lora_config=lora_config_dict(model, path) if self.lora is not None else None)
            self.actor = DataParallelPPOActor(
                actor, self.actor_engine, micro_batch_size=batching.update.micro_batch_size,
                max_token_len=batching.update.max_token_len, remove_padding=remove_padding, logprob_kernel=kernel,
                mini_batch_size=batching.mini_batch_size)
            self._log_prob_batching = batching.log_prob
        if self._is_rollout:
            with startup.WORKER.phase("rollout engine"):
                rollout_class = get_rollout_class(config.rollout.name)
                module = self.actor_engine.module if self.rollout_module is None else self.rollout_module
                self.rollout = rollout_class(config.rollout, module, self.tokenizer)
            multi_turn = config.rollout.multi_turn
            if multi_turn.enable:
                tools, interactions = multi_turn.tool_config_path, multi_turn.interaction_config_path
                self.rollout = ToolAgentLoop(self.rollout, self.tokenizer, multi_turn,
                                             load_tools(tools) if tools else {},
                                             load_interactions(interactions) if interactions else {})
        if self._is_ref and self.lora is not None and self.actor_engine is not None:
            # The reference policy is the actor with its adapter switched off: no second copy of the weights.
            self.ref_engine = self.actor_engine
        elif self._is_ref:
            fsdp_config = config.ref.fsdp_config
            dtype = mixed_precision_policy(fsdp_config, self.device).param_dtype  # frozen: no fp32 master copy
            with startup.WORKER.phase("ref model load"):
                model = load_causal_lm(path, dtype=dtype, **load_kwargs)
            with startup.WORKER.phase("ref fsdp"):
                self.ref_engine = FSDPEngine(model, fsdp_config=fsdp_config, optim_config=None, device=self.device,
                                             compile_layers=config.ref.use_torch_compile)
        if self._is_ref:
            self.ref_policy = DataParallelPPOActor(config.ref, self.ref_engine, remove_padding=remove_padding,
                                                   logprob_kernel=kernel)
            self._ref_batching = batching.ref_log_prob

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @DistProfiler.annotate(role="rollout_generate")
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """``rollout.n`` responses per prompt (interleaved rows); ``meta_info`` (``validate``, ``n``,
        ``do_sample``, ``temperature``, ...) overrides the rollout config for this call."""
        self._require(self._is_rollout, "rollout", "generate_sequences")
        prompts = prompts.to(self.device)
        with self._generation_weights():
            output = self.rollout.generate_sequences(prompts)
        if not self.config.rollout.calculate_log_probs:
            output.batch.pop("rollout_log_probs", None)  # as the original: only when asked for
        return output.to("cpu")

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def generate_stream(self, request: dict) -> tuple[DataProto | None, dict]:
        """The asynchronous trainer's rollout on this rank (``trainer.v1.trainer_mode=colocate_async``): the
        request's ``prompts`` join the groups in flight, ``cancel_uids`` leave, and the engine decodes with the
        current weights until ``until_groups`` groups (and every group of ``wait_uids``) have finished; the rest
        wait, suspended, for the next call. Returns the finished rows (or None) and the call's statistics; see
        :meth:`verl.workers.rollout.native.NativeRollout.generate_stream`."""
        self._require(self._is_rollout, "rollout", "generate_stream")
        if self.rollout_module is not None:  # a rollout of its own decodes on its own thread from the first call
            self.rollout.serve()
        with self._generation_weights():
            output, stats = self.rollout.generate_stream(
                request["prompts"], request["version"], request["until_groups"], request["wait_uids"],
                request["cancel_uids"])
        if output is None:
            return None, stats
        if not self.config.rollout.calculate_log_probs:
            output.batch.pop("rollout_log_probs", None)
        return output.to("cpu"), stats

    @contextmanager
    def _generation_weights(self) -> Iterator[None]:
        """The whole weights the rollout generates with, for the block: the actor's, unsharded (base + LoRA adapter
        merged, adapter layers off), or a rollout's own copy."""
        if self.rollout_module is not None:
            yield
            return
        with self.actor_engine.gathered_params() as module:
            if self.lora is None:
                yield
                return
            merge_into_gathered_weights(module)  # freed at reshard
            with adapters_disabled(module):
                yield

    def close(self) -> None:
        """Stop the rollout's generation thread, if it has one (it holds the rollout's weights and KV cache)."""
        server = getattr(self.rollout, "server", None)
        if server is not None:
            server.close()

    def _rollout_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The actor's tensors whole, one at a time (each a collective), floating ones in the dtype the rollout
        computes in."""
        dtype = mixed_precision_policy(self.config.actor.fsdp_config, self.device).param_dtype
        for name, t, _ in self.actor_engine.full_tensors():
            yield name, t.to(dtype) if t.is_floating_point() else t

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def weight_sync_address(self) -> str:
        """Where the weight-sync group meets (``separate_async``): a free port on this rank's node, whose store this
        rank (the actor's rank 0, the sender) serves."""
        host = os.environ.get(NODE_IP_ENV) or "127.0.0.1"
        return f"tcp://{host}:{free_port(host)}"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def send_weights(self, address: str, world_size: int) -> dict:
        """Send the actor's weights to the rollout's own workers (``separate_async``): every rank gathers each tensor
        whole (a collective), the actor's rank 0 broadcasts them in buckets of
        ``checkpoint_engine.update_weights_bucket_megabytes`` in the dtype the rollout computes in. Returns the
        sender's statistics (``{}`` on the other ranks)."""
        self._require(self._is_actor, "actor", "send_weights")
        if self.rank == 0 and self.weight_sync is None:
            self.weight_sync = WeightSyncGroup(address, 0, world_size, self.device, timeout=self.nccl_timeout_s)
        tensors = self._rollout_tensors()
        if self.weight_sync is None:
            drain(tensors)
            return {}
        bucket = int(self.config.rollout.checkpoint_engine.update_weights_bucket_megabytes) << 20
        return self.weight_sync.send(tensors, bucket)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def receive_weights(self, address: str, world_size: int, version: int) -> None:
        """Receive the actor's weights (``separate_async``) while the rollout decodes on, then have its thread
        apply them between two rounds of decoding: the groups in flight go on with policy ``version``."""
        self._require(self.rollout_module is not None, "rollout's own copy of the model (role 'rollout')",
                      "receive_weights")
        if self.weight_sync is None:
            self.weight_sync = WeightSyncGroup(address, 1 + self.rank, world_size, self.device,
                                               timeout=self.nccl_timeout_s)
        tensors = self.weight_sync.receive()
        self.rollout.serve().stage_weights(version, lambda: apply_weights(self.rollout_module, tensors))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_rollout_weights(self, version: int) -> dict:
        """The actor's weights into this rank's colocated rollout copy (``colocate_async.overlap_generation``): every
        rank gathers each tensor whole (a collective) in the dtype the rollout computes in, and the rollout's thread
        copies them in between two rounds of decoding; the groups in flight go on with policy ``version``. Returns
        the bytes copied."""
        self._require(self._is_actor and self.rollout_module is not None,
                      "actor and a rollout copy of its own (trainer.v1.colocate_async.overlap_generation)",
                      "update_rollout_weights")
        tensors = list(self._rollout_tensors())
        if self.device == "cuda":  # gathered on this thread's stream; the rollout's thread reads them on its own
            torch.cuda.current_stream().synchronize()
        self.rollout.serve().stage_weights(version, lambda: apply_weights(self.rollout_module, tensors))
        return {"bytes": sum(t.numel() * t.element_size() for _, t in tensors)}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @DistProfiler.annotate(role="actor_compute_log_prob")
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` (B, R) of the actor at ``meta_info['temperature']``
        (default ``rollout.temperature``)."""
        self._require(self._is_actor, "actor", "compute_log_prob")
        data = data.to(self.device)
        micro, budget = self._log_prob_batching
        with self.actor_engine.on_device():
            log_probs, entropys = self.actor.compute_log_prob(
                data, temperature=_temperature(data, self.config.rollout.temperature),
                micro_batch_size=micro, max_token_len=budget, calculate_entropy=True)
        return DataProto(batch={"old_log_probs": log_probs.cpu(), "entropys": entropys.cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @DistProfiler.annotate(role="ref_compute_log_prob")
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` (B, R) of the reference policy, at the same temperature as the actor's."""
        self._require(self._is_ref, "reference policy", "compute_ref_log_prob")
        data = data.to(self.device)
        micro, budget = self._ref_batching
        shared = self.ref_engine is self.actor_engine  # LoRA: the base model is the actor without its adapter
        with self.ref_engine.on_device(), adapters_disabled(self.ref_engine.module) if shared else nullcontext():
            log_probs, _ = self.ref_policy.compute_log_prob(
                data, temperature=_temperature(data, self.config.rollout.temperature),
                micro_batch_size=micro, max_token_len=budget, calculate_entropy=False)
        return DataProto(batch={"ref_log_prob": log_probs.cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @DistProfiler.annotate(role="actor_update")
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO epochs over the batch, then one LR-scheduler step (one per training step, as verl).
        Returns no rows; ``meta_info['metrics']`` holds the metric lists (see
        :meth:`DataParallelPPOActor.update_policy`) and the ``perf/*memory*`` figures."""
        self._require(self._is_actor, "actor", "update_actor")
        data = data.to(self.device)
        temperature = _temperature(data, self.config.rollout.temperature)
        with self.actor_engine.on_device(optimizer=True):
            metrics, recorded = self.actor.update_policy(data, temperature=temperature)
        self.actor_engine.lr_scheduler_step()
        metrics.update(_memory_metrics(self.device))
        if recorded is None:
            return DataProto(meta_info={"metrics": metrics})
        recorded.meta_info["metrics"] = metrics
        return recorded.to("cpu")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int | None = None) -> None:
        """The actor's ``actor.checkpoint.save_contents`` into ``local_path`` (the step is in the folder
        name; ``global_step`` is accepted for verl's signature). The tokenizer goes to ``huggingface/``;
        the reference model is not saved (it is ``model.path``)."""
        self._require(self._is_actor, "actor", "save_checkpoint")
        contents = list(self.config.actor.checkpoint.save_contents)
        with self.actor_engine.on_device(optimizer=True):
            self.actor_engine.save_checkpoint(local_path, save_contents=contents, tokenizer=self.tokenizer)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> None:
        """Restore ``actor.checkpoint.load_contents``; the rollout reads the same module, so it follows."""
        self._require(self._is_actor, "actor", "load_checkpoint")
        contents = list(self.config.actor.checkpoint.load_contents)
        with self.actor_engine.on_device(optimizer=True):
            self.actor_engine.load_checkpoint(local_path, load_contents=contents)


class CriticWorker(_RoleWorker):
    """The value model on one device. ``config`` is the ``critic`` section; ``rollout_n`` the samples per
    prompt (default ``critic.rollout_n``), which turns ``ppo_mini_batch_size`` (prompts) into rows."""

    def __init__(self, config: CriticConfig, rollout_n: int | None = None, nccl_timeout_s: float | None = None):
        super().__init__(nccl_timeout_s)
        config = CriticConfig.from_config(config)
        self.config = config if rollout_n is None else dataclasses.replace(config, rollout_n=int(rollout_n))
        self._init_profiler(self.config.profiler, "critic")
        self.tokenizer = self.engine = self.critic = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        config, model_config = self.config, self.config.model
        path = self._start_init(model_config)
        self.tokenizer = load_tokenizer(model_config.tokenizer_path or path, config_key="critic.model.path",
                                        trust_remote_code=model_config.trust_remote_code)
        fsdp_config, remove_padding = model_config.fsdp_config, model_config.use_remove_padding
        lora = LoraSettings.from_config(model_config, "critic.model")
        with startup.WORKER.phase("critic model load"):
            model = load_value_model(path, dtype=fsdp_config.model_dtype, remove_padding=remove_padding,
                                     trust_remote_code=model_config.trust_remote_code,
                                     override_config=model_config.override_config)
            if lora is not None:
                apply_lora(model, lora, value_head=True)
        with startup.WORKER.phase("critic fsdp"):
            self.engine = FSDPEngine(
                model, fsdp_config=fsdp_config, optim_config=config.optim, grad_clip=config.grad_clip,
                device=self.device, enable_gradient_checkpointing=_checkpointing(model_config),
                lora_config=lora_config_dict(model, path, value_head=True) if lora is not None else None,
                compile_layers=config.use_torch_compile)
        batching = critic_batching(config, self.world_size)
        self.critic = DataParallelPPOCritic(
            config, self.engine, mini_batch_size=batching.mini_batch_size, remove_padding=remove_padding,
            micro_batch_size=batching.update.micro_batch_size, max_token_len=batching.update.max_token_len)
        self._forward_batching = batching.forward

    def _check_ready(self, method: str) -> None:
        if self.critic is None:
            raise RuntimeError(f"CriticWorker.{method}() called before init_model()")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @DistProfiler.annotate(role="compute_values")
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R): the value head at the positions that predict each response token (raw,
        not masked: the driver masks with ``response_mask``)."""
        self._check_ready("compute_values")
        data = data.to(self.device)
        micro, budget = self._forward_batching
        with self.engine.on_device():
            values = self.critic.compute_values(data, micro_batch_size=micro, max_token_len=budget)
        return DataProto(batch={"values": values.cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @DistProfiler.annotate(role="critic_update")
    def update_critic(self, data: DataProto) -> DataProto:
        """Clipped value-loss epochs, then one LR-scheduler step. No rows; ``meta_info['metrics']``."""
        self._check_ready("update_critic")
        data = data.to(self.device)
        with self.engine.on_device(optimizer=True):
            metrics = self.critic.update_critic(data)
        self.engine.lr_scheduler_step()
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int | None = None) -> None:
        self._check_ready("save_checkpoint")
        contents = list(self.config.checkpoint.save_contents)
        with self.engine.on_device(optimizer=True):
            self.engine.save_checkpoint(local_path, save_contents=contents, tokenizer=self.tokenizer)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> None:
        self._check_ready("load_checkpoint")
        contents = list(self.config.checkpoint.load_contents)
        with self.engine.on_device(optimizer=True):
            self.engine.load_checkpoint(local_path, load_contents=contents)


class RewardModelWorker(_RoleWorker):
    """A frozen reward model on one device; ``config`` is the ``reward_model`` section.

    A sequence classifier (``compute_rm_score``): when ``model.input_tokenizer`` (the policy's tokenizer) differs
    from the reward model's own (vocabulary or chat template), rows are re-encoded from ``raw_prompt`` + the decoded
    response; otherwise the policy's token ids are scored as they are. With ``generative`` it is a judge LLM instead
    (``generate_sequences``, with the ``reward_model.rollout`` engine; :mod:`verl.rewards.generative`).
    """

    def __init__(self, config: RewardModelConfig, nccl_timeout_s: float | None = None, generative: bool = False):
        super().__init__(nccl_timeout_s)
        self.config = RewardModelConfig.from_config(config)
        self._init_profiler(self.config.profiler, "reward_model")
        self.engine = self.rm_tokenizer = self.input_tokenizer = self.rollout = None
        self.generative = generative

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        config, model_config = self.config, self.config.model
        path, trust_remote_code = self._start_init(model_config), model_config.trust_remote_code
        self.rm_tokenizer = load_tokenizer(path, config_key="reward_model.model.path",
                                           trust_remote_code=trust_remote_code)
        if model_config.input_tokenizer:
            source = load_tokenizer(model_config.input_tokenizer, config_key="reward_model.model.input_tokenizer",
                                    trust_remote_code=trust_remote_code)
            self.input_tokenizer = None if same_tokenizer(source, self.rm_tokenizer) else source
        fsdp_config = model_config.fsdp_config
        dtype = mixed_precision_policy(fsdp_config, self.device).param_dtype  # frozen: no fp32 master copy
        self.remove_padding = model_config.use_remove_padding
        if self.generative:
            with startup.WORKER.phase("rm model load"):
                model = load_causal_lm(path, dtype=dtype, trust_remote_code=trust_remote_code,
                                       override_config=model_config.override_config)
            with startup.WORKER.phase("rm fsdp"):
                self.engine = FSDPEngine(model, fsdp_config=fsdp_config, optim_config=None, device=self.device)
            self.rollout = get_rollout_class(config.rollout.name)(config.rollout, self.engine.module, self.rm_tokenizer)
            return
        with startup.WORKER.phase("rm model load"):
            model = load_reward_model(path, dtype=dtype, trust_remote_code=trust_remote_code,
                                      override_config=model_config.override_config, remove_padding=self.remove_padding)
        with startup.WORKER.phase("rm fsdp"):
            self.engine = FSDPEngine(model, fsdp_config=fsdp_config, optim_config=None, device=self.device)
        self._batching = reward_model_batching(config, self.world_size)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @DistProfiler.annotate(role="compute_rm_score")
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` (B, R): the score of prompt + valid response at the last valid response token."""
        if self.engine is None or self.generative:
            raise RuntimeError("RewardModelWorker.compute_rm_score() needs a sequence-classifier reward model "
                               "(generative=False) and init_model() first")
        data = data.to(self.device)
        micro, budget = self._batching
        with self.engine.on_device():
            scores = compute_rm_scores(self.engine.module, data, micro_batch_size=micro, max_token_len=budget,
                                       src_tokenizer=self.input_tokenizer, rm_tokenizer=self.rm_tokenizer,
                                       max_length=self.config.max_length, remove_padding=self.remove_padding)
        return DataProto(batch={"rm_scores": scores.cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """The judge's responses to left-padded prompts (a generative reward model), sampled as ``meta_info`` says
        (see :func:`~verl.workers.rollout.base.resolve_sampling_params`)."""
        if self.rollout is None:
            raise RuntimeError("RewardModelWorker.generate_sequences() needs a generative reward model (built with "
                               "generative=True) and init_model() first")
        prompts = prompts.to(self.device)
        with self.engine.gathered_params():
            output = self.rollout.generate_sequences(prompts)
        output.batch.pop("rollout_log_probs", None)
        return output.to("cpu")
