"""The FSDP2 workers: one class per role, whose ``@register``-ed methods the driver calls.

- :class:`ActorRolloutRefWorker` — the policy (``actor_rollout_ref`` section): training, generation
  with the actor's own weights (no second copy), and the frozen reference policy;
- :class:`CriticWorker` — the value model (``critic`` section);
- :class:`RewardModelWorker` — a sequence-classifier reward model (``reward_model`` section).

The workers are thin: they load models, wrap them in :class:`~verl.workers.engine.FSDPEngine`, turn
the config's batch sizes into per-rank ones, and move data on and off the device; the math lives in
:mod:`.actor`, :mod:`.critic` and :mod:`.reward_model`. Every ``DP_COMPUTE_PROTO`` method receives
this rank's rows, moves them to ``self.device`` and returns its result on the CPU.

Batch sizes in the config count prompts and are global; per rank they become
``ppo_mini_batch_size x rollout.n / world_size`` rows per optimizer step. Micro-batches are
``*_micro_batch_size_per_gpu`` rows (the deprecated global ``*_micro_batch_size`` is divided by the
world size), or, with ``use_dynamic_bsz``, as many rows as fit a token budget
(``*_max_token_len_per_gpu``).
"""

from __future__ import annotations

import importlib
import logging
from contextlib import nullcontext
import random

import numpy as np
import torch

from verl.models import load_causal_lm, load_tokenizer, load_value_model
from verl.models.lora import LoraSettings, adapters_disabled, apply_lora, lora_config_dict, merge_into_gathered_weights
from verl.protocol import DataProto
from verl.single_controller import Dispatch, Worker, register
from verl.interactions.base import load_interactions
from verl.tools.base import load_tools
from verl.utils.config import config_get, uses_token_budget
from verl.utils.debug import memory_usage
from verl.workers.actor import DataParallelPPOActor
from verl.workers.critic import DataParallelPPOCritic
from verl.workers.engine import FSDPEngine
from verl.workers.engine.fsdp import mixed_precision_policy
from verl.rewards.model import compute_rm_scores, load_reward_model, same_tokenizer
from verl.workers.rollout import get_rollout_class
from verl.workers.rollout.agent_loop import ToolAgentLoop

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "RewardModelWorker", "micro_batching", "per_rank_mini_batch"]

logger = logging.getLogger(__name__)

_GIB = 1024**3
_CHECKPOINT_CONTENTS = ["model", "optimizer", "extra"]
# The fsdp_config keys the engine reads (copied when a default dtype is filled in).
_ENGINE_FSDP_KEYS = ("param_offload", "optimizer_offload", "offload_policy", "reshard_after_forward", "fsdp_size",
                     "dtype", "mixed_precision")


# ------------------------------------------------------------------------------------------------ helpers
def per_rank_mini_batch(section, where: str, rollout_n: int, world_size: int) -> int:
    """Rows per optimizer step on one rank: ``<where>.ppo_mini_batch_size`` (prompts) x n / world size."""
    prompts = config_get(section, "ppo_mini_batch_size")
    if not isinstance(prompts, int) or prompts <= 0:
        raise ValueError(f"{where}.ppo_mini_batch_size must be a positive number of prompts, got {prompts!r}")
    rows = prompts * rollout_n
    if rows % world_size:
        raise ValueError(f"{where}.ppo_mini_batch_size ({prompts}) x rollout.n ({rollout_n}) = {rows} sequences "
                         f"cannot be split evenly over {world_size} ranks; make it a multiple of {world_size}")
    return rows // world_size


def micro_batching(section, where: str, name: str, world_size: int, *, dynamic_key: str, token_key: str,
                   remove_padding: bool) -> tuple[int | None, int | None]:
    """``(micro_batch_size, max_token_len)`` of one phase: a token budget ``<where>.<token_key>`` when
    ``<where>.<dynamic_key>`` is true, or unset (null) with packed forwards (``remove_padding``: memory
    then grows with tokens, not rows); else ``<where>.<name>_per_gpu`` rows (or the deprecated global
    ``<where>.<name>`` divided by the world size)."""
    if uses_token_budget(config_get(section, dynamic_key), remove_padding):
        budget = config_get(section, token_key)
        if not isinstance(budget, int) or budget <= 0:
            raise ValueError(f"{where}.{dynamic_key}=true needs {where}.{token_key} > 0 tokens, got {budget!r}")
        return None, budget
    per_gpu = config_get(section, f"{name}_per_gpu")
    if per_gpu is None and config_get(section, name) is not None:
        per_gpu = max(int(config_get(section, name)) // world_size, 1)
    if not isinstance(per_gpu, int) or per_gpu <= 0:
        raise ValueError(f"{where}.{name}_per_gpu is not set (got {per_gpu!r}): set it to the sequences per device "
                         f"per forward pass, e.g. {where}.{name}_per_gpu=4, or set {where}.{dynamic_key}=true")
    return per_gpu, None


def _checkpointing(model_config) -> bool:
    """``enable_gradient_checkpointing``; unset (null) means on here: the trainer fills it in from the
    memory estimate (verl.trainer.plan) before the workers start, other callers get the safe choice."""
    value = config_get(model_config, "enable_gradient_checkpointing")
    return True if value is None else bool(value)


def _fsdp_config_with_dtype(fsdp_config, dtype) -> dict:
    """The engine's keys of ``fsdp_config``, with compute ``dtype`` filled in when it names none."""
    merged = {k: config_get(fsdp_config, k) for k in _ENGINE_FSDP_KEYS if config_get(fsdp_config, k) is not None}
    if dtype is not None and "dtype" not in merged and config_get(merged, "mixed_precision.param_dtype") is None:
        merged["dtype"] = dtype
    return merged


def _import_external_lib(model_config) -> None:
    lib = config_get(model_config, "external_lib")
    if lib:
        importlib.import_module(lib)  # registers custom architectures with transformers


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _memory_metrics(device: torch.device) -> dict[str, float]:
    cuda = device.type == "cuda"
    return {
        "perf/max_memory_allocated_gb": torch.cuda.max_memory_allocated(device) / _GIB if cuda else 0.0,
        "perf/max_memory_reserved_gb": torch.cuda.max_memory_reserved(device) / _GIB if cuda else 0.0,
        "perf/cpu_memory_used_gb": memory_usage().get("cpu_rss_gb", 0.0),
    }


def _temperature(data: DataProto, default: float) -> float:
    """``meta_info['temperature']`` (else ``default``); 0 (greedy) scores at 1.0, as the rollout does."""
    value = data.meta_info.get("temperature")
    value = float(default if value is None else value)
    return value if value > 0 else 1.0


# ------------------------------------------------------------------------------------------------ policy
class _RoleWorker(Worker):
    """What the three roles share: the collective timeout of ``actor_rollout_ref.nccl_timeout``
    (colocated roles share one process group; the first role of a process to join sets it)."""

    def __init__(self, nccl_timeout_s: float | None = None):
        super().__init__()
        self.nccl_timeout_s = float(nccl_timeout_s) if nccl_timeout_s else 1800.0

    def _start_init(self, model_config) -> tuple[str, bool]:
        """The start of every ``init_model``: join the process group, import ``model.external_lib``;
        returns ``(model.path, model.trust_remote_code)``."""
        self.init_process_group(timeout_s=self.nccl_timeout_s)
        _import_external_lib(model_config)
        return config_get(model_config, "path"), bool(config_get(model_config, "trust_remote_code", False))


class ActorRolloutRefWorker(_RoleWorker):
    """The policy's roles on one device. ``config`` is the ``actor_rollout_ref`` section; ``role`` one of
    ``actor``, ``rollout``, ``ref``, ``actor_rollout``, ``actor_rollout_ref``.

    The rollout engine generates with the actor engine's module (unsharded around each call); the
    reference policy is a second, frozen copy of ``model.path`` in its own engine (no optimizer),
    computing in the actor's dtype unless ``ref.fsdp_config.dtype`` says otherwise.
    """

    ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")

    def __init__(self, config, role: str, nccl_timeout_s: float | None = None):
        super().__init__(nccl_timeout_s)
        if role not in self.ROLES:
            raise ValueError(f"ActorRolloutRefWorker role must be one of {list(self.ROLES)}, got {role!r}")
        self.config, self.role = config, role
        self._is_actor = role in ("actor", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref")
        self.tokenizer = self.actor_engine = self.actor = self.rollout = self.ref_engine = self.ref_policy = None
        self.lora: LoraSettings | None = None

    def _require(self, needed: bool, what: str, method: str) -> None:
        if not needed:
            raise RuntimeError(f"{method}() needs the {what}, but this worker has role {self.role!r}")
        if self.tokenizer is None:
            raise RuntimeError(f"{method}() called before init_model()")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        config, model_config = self.config, self.config.model
        path, trust_remote_code = self._start_init(model_config)
        # Sampling draws from the process RNG: seed it per rank so a run is reproducible, on either backend.
        _seed_everything(int(config_get(config, "rollout.seed", 0)) + self.rank)
        self.tokenizer = load_tokenizer(config_get(model_config, "tokenizer_path") or path,
                                        config_key="actor_rollout_ref.model.path", trust_remote_code=trust_remote_code,
                                        chat_template=config_get(model_config, "custom_chat_template"))
        load_kwargs = {"trust_remote_code": trust_remote_code,
                       "override_config": config_get(model_config, "override_config")}
        actor = config.actor
        remove_padding = bool(config_get(model_config, "use_remove_padding", False))
        load_kwargs["remove_padding"] = remove_padding
        # use_fused_kernels picks the log-prob reduction explicitly; otherwise the fastest available one.
        kernel = (config_get(model_config, "fused_kernel_options.impl_backend", "torch")
                  if config_get(model_config, "use_fused_kernels", False) else "auto")
        self.lora = LoraSettings.from_config(model_config, "actor_rollout_ref.model")
        if self._is_actor or self._is_rollout:
            model = load_causal_lm(path, dtype=config_get(actor, "fsdp_config.model_dtype", "fp32"), **load_kwargs)
            if self.lora is not None:
                apply_lora(model, self.lora)
            self.actor_engine = FSDPEngine(
                model, fsdp_config=actor.fsdp_config, optim_config=actor.optim if self._is_actor else None,
                grad_clip=config_get(actor, "grad_clip", 1.0), device=self.device,
                enable_gradient_checkpointing=self._is_actor and _checkpointing(model_config),
                compile_layers=bool(config_get(actor, "use_torch_compile", False)),
                lora_config=lora_config_dict(model, path) if self.lora is not None else None)
        if self._is_actor:
            where = "actor_rollout_ref.actor"
            micro, budget = micro_batching(actor, where, "ppo_micro_batch_size", self.world_size,
                                           dynamic_key="use_dynamic_bsz", token_key="ppo_max_token_len_per_gpu",
                                           remove_padding=remove_padding)
            self.actor = DataParallelPPOActor(
                actor, self.actor_engine, micro_batch_size=micro, max_token_len=budget, remove_padding=remove_padding,
                logprob_kernel=kernel,
                mini_batch_size=per_rank_mini_batch(actor, where, int(config_get(config, "rollout.n", 1)),
                                                    self.world_size))
            self._log_prob_batching = micro_batching(
                config.rollout, "actor_rollout_ref.rollout", "log_prob_micro_batch_size", self.world_size,
                dynamic_key="log_prob_use_dynamic_bsz", token_key="log_prob_max_token_len_per_gpu",
                remove_padding=remove_padding)
        if self._is_rollout:
            rollout_cls = get_rollout_class(config_get(config, "rollout.name", "hf"))
            self.rollout = rollout_cls(config.rollout, self.actor_engine.module, self.tokenizer)
            multi_turn = config_get(config, "rollout.multi_turn")
            if config_get(multi_turn, "enable", False):
                tools_file = config_get(multi_turn, "tool_config_path")
                interactions_file = config_get(multi_turn, "interaction_config_path")
                self.rollout = ToolAgentLoop(self.rollout, self.tokenizer, multi_turn,
                                             load_tools(tools_file) if tools_file else {},
                                             load_interactions(interactions_file) if interactions_file else {})
        if self._is_ref and self.lora is not None and self.actor_engine is not None:
            # The reference policy is the actor with its adapter switched off: no second copy of the weights.
            self.ref_engine = self.actor_engine
            self.ref_policy = DataParallelPPOActor(config.ref, self.actor_engine, remove_padding=remove_padding,
                                                   logprob_kernel=kernel)
            self._ref_batching = micro_batching(
                config.ref, "actor_rollout_ref.ref", "log_prob_micro_batch_size", self.world_size,
                dynamic_key="log_prob_use_dynamic_bsz", token_key="log_prob_max_token_len_per_gpu",
                remove_padding=remove_padding)
        elif self._is_ref:
            ref = config.ref
            fsdp_config = _fsdp_config_with_dtype(ref.fsdp_config, config_get(actor, "fsdp_config.dtype"))
            dtype = mixed_precision_policy(fsdp_config, self.device).param_dtype  # frozen: no fp32 master copy
            self.ref_engine = FSDPEngine(load_causal_lm(path, dtype=dtype, **load_kwargs), fsdp_config=fsdp_config,
                                         optim_config=None, device=self.device,
                                         compile_layers=bool(config_get(ref, "use_torch_compile", False)))
            self.ref_policy = DataParallelPPOActor(ref, self.ref_engine, remove_padding=remove_padding,
                                                   logprob_kernel=kernel)
            self._ref_batching = micro_batching(
                ref, "actor_rollout_ref.ref", "log_prob_micro_batch_size", self.world_size,
                dynamic_key="log_prob_use_dynamic_bsz", token_key="log_prob_max_token_len_per_gpu",
                remove_padding=remove_padding)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """``rollout.n`` responses per prompt (interleaved rows); ``meta_info`` (``validate``, ``n``,
        ``do_sample``, ``temperature``, ...) overrides the rollout config for this call."""
        self._require(self._is_rollout, "rollout", "generate_sequences")
        prompts = prompts.to(self.device)
        with self.actor_engine.gathered_params() as module:
            if self.lora is None:
                output = self.rollout.generate_sequences(prompts)
            else:  # base + adapter merged into the gathered weights (freed at reshard), adapter layers off
                merge_into_gathered_weights(module)
                with adapters_disabled(module):
                    output = self.rollout.generate_sequences(prompts)
        if not config_get(self.config, "rollout.calculate_log_probs", False):
            output.batch.pop("rollout_log_probs", None)  # as the original: only when asked for
        return output.to("cpu")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` (B, R) of the actor at ``meta_info['temperature']``
        (default ``rollout.temperature``)."""
        self._require(self._is_actor, "actor", "compute_log_prob")
        data = data.to(self.device)
        micro, budget = self._log_prob_batching
        with self.actor_engine.on_device():
            log_probs, entropys = self.actor.compute_log_prob(
                data, temperature=_temperature(data, config_get(self.config, "rollout.temperature", 1.0)),
                micro_batch_size=micro, max_token_len=budget, calculate_entropy=True)
        return DataProto(batch={"old_log_probs": log_probs.cpu(), "entropys": entropys.cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` (B, R) of the reference policy, at the same temperature as the actor's."""
        self._require(self._is_ref, "reference policy", "compute_ref_log_prob")
        data = data.to(self.device)
        micro, budget = self._ref_batching
        shared = self.ref_engine is self.actor_engine  # LoRA: the base model is the actor without its adapter
        with self.ref_engine.on_device(), adapters_disabled(self.ref_engine.module) if shared else nullcontext():
            log_probs, _ = self.ref_policy.compute_log_prob(
                data, temperature=_temperature(data, config_get(self.config, "rollout.temperature", 1.0)),
                micro_batch_size=micro, max_token_len=budget, calculate_entropy=False)
        return DataProto(batch={"ref_log_prob": log_probs.cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO epochs over the batch, then one LR-scheduler step (one per training step, as verl).
        Returns no rows; ``meta_info['metrics']`` holds the metric lists (see
        :meth:`DataParallelPPOActor.update_policy`) and the ``perf/*memory*`` figures."""
        self._require(self._is_actor, "actor", "update_actor")
        data = data.to(self.device)
        temperature = _temperature(data, config_get(self.config, "rollout.temperature", 1.0))
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
        contents = list(config_get(self.config, "actor.checkpoint.save_contents", _CHECKPOINT_CONTENTS))
        with self.actor_engine.on_device(optimizer=True):
            self.actor_engine.save_checkpoint(local_path, save_contents=contents, tokenizer=self.tokenizer)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> None:
        """Restore ``actor.checkpoint.load_contents``; the rollout reads the same module, so it follows."""
        self._require(self._is_actor, "actor", "load_checkpoint")
        contents = list(config_get(self.config, "actor.checkpoint.load_contents", _CHECKPOINT_CONTENTS))
        with self.actor_engine.on_device(optimizer=True):
            self.actor_engine.load_checkpoint(local_path, load_contents=contents)


# ------------------------------------------------------------------------------------------------ critic
class CriticWorker(_RoleWorker):
    """The value model on one device. ``config`` is the ``critic`` section; ``rollout_n`` the samples per
    prompt (default ``critic.rollout_n``), which turns ``ppo_mini_batch_size`` (prompts) into rows."""

    def __init__(self, config, rollout_n: int | None = None, nccl_timeout_s: float | None = None):
        super().__init__(nccl_timeout_s)
        self.config = config
        self.rollout_n = int(rollout_n if rollout_n is not None else config_get(config, "rollout_n", 1))
        self.tokenizer = self.engine = self.critic = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        config, model_config = self.config, self.config.model
        path, trust_remote_code = self._start_init(model_config)
        self.tokenizer = load_tokenizer(config_get(model_config, "tokenizer_path") or path,
                                        config_key="critic.model.path", trust_remote_code=trust_remote_code)
        fsdp_config = config_get(model_config, "fsdp_config") or config_get(config, "fsdp_config")
        remove_padding = bool(config_get(model_config, "use_remove_padding", False))
        model = load_value_model(path, dtype=config_get(fsdp_config, "model_dtype", "fp32"),
                                 trust_remote_code=trust_remote_code, remove_padding=remove_padding,
                                 override_config=config_get(model_config, "override_config"))
        lora = LoraSettings.from_config(model_config, "critic.model")
        if lora is not None:
            apply_lora(model, lora, value_head=True)
        self.engine = FSDPEngine(
            model, fsdp_config=fsdp_config, optim_config=config.optim, grad_clip=config_get(config, "grad_clip", 1.0),
            lora_config=lora_config_dict(model, path, value_head=True) if lora is not None else None,
            enable_gradient_checkpointing=_checkpointing(model_config), device=self.device,
            compile_layers=bool(config_get(config, "use_torch_compile", False)))
        micro, budget = micro_batching(config, "critic", "ppo_micro_batch_size", self.world_size,
                                       dynamic_key="use_dynamic_bsz", token_key="ppo_max_token_len_per_gpu",
                                       remove_padding=remove_padding)
        self.critic = DataParallelPPOCritic(
            config, self.engine, mini_batch_size=per_rank_mini_batch(config, "critic", self.rollout_n, self.world_size),
            micro_batch_size=micro, max_token_len=budget, remove_padding=remove_padding)
        self._forward_batching = micro_batching(
            config, "critic", "forward_micro_batch_size", self.world_size, dynamic_key="use_dynamic_bsz",
            token_key="forward_max_token_len_per_gpu", remove_padding=remove_padding)

    def _check_ready(self, method: str) -> None:
        if self.critic is None:
            raise RuntimeError(f"CriticWorker.{method}() called before init_model()")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
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
        contents = list(config_get(self.config, "checkpoint.save_contents", _CHECKPOINT_CONTENTS))
        with self.engine.on_device(optimizer=True):
            self.engine.save_checkpoint(local_path, save_contents=contents, tokenizer=self.tokenizer)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> None:
        self._check_ready("load_checkpoint")
        contents = list(config_get(self.config, "checkpoint.load_contents", _CHECKPOINT_CONTENTS))
        with self.engine.on_device(optimizer=True):
            self.engine.load_checkpoint(local_path, load_contents=contents)


# ------------------------------------------------------------------------------------------------ reward model
class RewardModelWorker(_RoleWorker):
    """A frozen sequence-classifier reward model on one device; ``config`` is the ``reward_model`` section.

    When ``model.input_tokenizer`` (the policy's tokenizer) differs from the reward model's own (vocabulary
    or chat template), rows are re-encoded from ``raw_prompt`` + the decoded response; otherwise the
    policy's token ids are scored as they are.
    """

    def __init__(self, config, nccl_timeout_s: float | None = None):
        super().__init__(nccl_timeout_s)
        self.config = config
        self.engine = self.rm_tokenizer = self.input_tokenizer = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        config, model_config = self.config, self.config.model
        path, trust_remote_code = self._start_init(model_config)
        self.rm_tokenizer = load_tokenizer(path, config_key="reward_model.model.path",
                                           trust_remote_code=trust_remote_code)
        input_path = config_get(model_config, "input_tokenizer")
        if input_path:
            source = load_tokenizer(input_path, config_key="reward_model.model.input_tokenizer",
                                    trust_remote_code=trust_remote_code)
            self.input_tokenizer = None if same_tokenizer(source, self.rm_tokenizer) else source
        fsdp_config = _fsdp_config_with_dtype(config_get(model_config, "fsdp_config"), None)
        dtype = mixed_precision_policy(fsdp_config, self.device).param_dtype
        self.remove_padding = bool(config_get(model_config, "use_remove_padding", False))
        model = load_reward_model(path, dtype=dtype, trust_remote_code=trust_remote_code,
                                  override_config=config_get(model_config, "override_config"),
                                  remove_padding=self.remove_padding)
        self.engine = FSDPEngine(model, fsdp_config=fsdp_config, optim_config=None, device=self.device)
        self._batching = micro_batching(config, "reward_model", "micro_batch_size", self.world_size,
                                        dynamic_key="use_dynamic_bsz", token_key="forward_max_token_len_per_gpu",
                                        remove_padding=self.remove_padding)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` (B, R): the score of prompt + valid response at the last valid response token."""
        if self.engine is None:
            raise RuntimeError("RewardModelWorker.compute_rm_score() called before init_model()")
        data = data.to(self.device)
        micro, budget = self._batching
        with self.engine.on_device():
            scores = compute_rm_scores(self.engine.module, data, micro_batch_size=micro, max_token_len=budget,
                                       src_tokenizer=self.input_tokenizer, rm_tokenizer=self.rm_tokenizer,
                                       max_length=config_get(self.config, "max_length"),
                                       remove_padding=self.remove_padding)
        return DataProto(batch={"rm_scores": scores.cpu()})
