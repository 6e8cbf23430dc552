"""Memory estimate of a PPO/GRPO config before anything starts: per-GPU bytes of each role, per phase.

    python -m verl.trainer.plan <the same overrides as main_ppo>

Reads the model's ``config.json`` only (the parameters are counted on the meta device; no weights are
loaded, no GPU is needed) and prints, per GPU of the actor's pool: weights, gradients and optimizer
state of the actor (and critic), the reference weights, activations at the configured micro-batch
(token budget or rows x longest sequence) with or without gradient checkpointing, the log-prob
chunk's logits, and the rollout's weights and KV cache; then the peak of each phase of a step and
whether it fits the device, and which key to change when it does not.

The activation model is per token and per decoder layer (bf16, packed varlen attention), from the
tensors autograd keeps in a Llama/Qwen2-style layer: two RMSNorms (fp32 input and bf16 output, 3h
each), q/k/v and the rotary copies, the attention output and o_proj input (13h + 4·kv in all, kv
heads counted as repeated once for the kernel), and the MLP's gate, up, SiLU and product (4·I):
``2·(13h + 4kv + 4I)`` bytes. Compiled layers (``use_torch_compile`` on CUDA) recompute the cheap
elementwise results in backward and keep about ``2·(7h + 4kv + 3I)``. With checkpointing a layer
keeps only its input (2h bytes) and the forward holds one layer's MLP intermediates at a time (3·I).
A mixture of experts counts ``I`` as the top-k experts' widths together (plus a shared expert's) and adds
the tokens gathered for each chosen expert and its outputs before they are weighted: ``2·2·k·h`` per token.
Backward also holds one layer's gradient reduction: FSDP2 casts the layer's bf16 gradients to the reduce dtype
(fp32 unless ``mixed_precision.reduce_dtype`` says otherwise) for the reduce-scatter and writes the shard's
result, ``(2 + 4 + 4/n)`` bytes per parameter of the layer in fp32 --
negligible for small dense layers, 5.8 GiB for a Qwen3-30B-A3B layer on one GPU.
Checked against the measured peaks of ``bench/train_step.py``, ``bench/peer_grpo.py`` and
``bench/model_step.py`` (docs/benchmarks.md).

LoRA: gradients and optimizer state for the adapter's factors only (counted by injecting it into the
meta-device model), no reference weights (the reference is the actor with its adapter off); the
activations are taken as those of full training (the frozen layers still pass gradients back).

Not modelled: parameter offload (optimizer offload is: its state is then not on the GPU), sequence
parallelism, multi-turn rollouts, fragmentation of the caching allocator.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

from verl.trainer.config.spec import RunSpec, resolve_run
from verl.workers.config import ModelConfig
from verl.workers.config.batching import Batching, policy_phase
from verl.workers.engine.fsdp import mixed_precision_policy

GIB = 2 ** 30
LOGPROB_CHUNK = 1024  # rows of logits alive at once (verl.models.logprob)
COMPUTE_BYTES = 2  # bf16 compute copies (fsdp_config.mixed_precision.param_dtype's default)
_DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


@dataclass
class ModelShape:
    """What the estimate needs of an architecture."""

    params: int
    layer_params: int
    layers: int
    hidden: int
    intermediate: int
    kv_dim: int
    vocab: int
    routed: int = 0  # experts per token of a mixture of experts (num_experts_per_tok); 0 for a dense MLP

    @property
    def root_params(self) -> int:
        """Parameters outside the decoder layers (embeddings, final norm, untied lm_head)."""
        return self.params - self.layers * self.layer_params

    @property
    def unsharded_bytes(self) -> int:
        """The bf16 compute copies FSDP holds at once in a forward: the root's and two layers' (prefetch)."""
        return COMPUTE_BYTES * (self.root_params + 2 * self.layer_params)

    def activation_bytes(self, tokens: int, checkpointing: bool, compiled: bool = False) -> int:
        """Autograd-saved activations of the decoder stack for ``tokens`` packed tokens (see module doc)."""
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        dispatch = 2 * self.routed * h  # a mixture of experts: each chosen expert's gathered tokens and outputs
        if checkpointing:
            return tokens * (self.layers * 2 * h + 2 * (3 * i + dispatch))
        if compiled:  # the fused layer recomputes norms and SwiGLU products instead of keeping them
            return tokens * self.layers * 2 * (7 * h + 4 * kv + 3 * i + dispatch)
        return tokens * self.layers * 2 * (13 * h + 4 * kv + 4 * i + dispatch)

    def forward_bytes(self, tokens: int) -> int:
        """Transient activations of a no-grad forward (one layer's MLP intermediates, the residual; a mixture of
        experts' gathered tokens and expert outputs)."""
        return tokens * 2 * (3 * self.intermediate + 4 * self.hidden + 2 * self.routed * self.hidden)


def training_components(shape: ModelShape, tokens: int, *, checkpointing: bool, compiled: bool = False,
                        logits: bool = True, n_gpus: int = 1, master_bytes: int = 4, reduce_bytes: int = 4,
                        optimizer_on_gpu: bool = True, trainable: int | None = None) -> dict[str, int]:
    """Per-GPU bytes of a model trained with FSDP2 + AdamW at a micro-batch of ``tokens`` packed tokens.
    ``trainable``: the parameters that get gradients and optimizer state (a LoRA adapter's), default all.
    ``reduce_bytes``: the size of the gradients' reduce-scatter dtype (``mixed_precision.reduce_dtype``)."""
    label = f"activations ({tokens} tokens, {'ckpt' if checkpointing else 'no ckpt'}{', compiled' * compiled})"
    adapter = trainable or 0  # LoRA factors come on top of the (frozen) model
    layer_trainable = shape.layer_params if trainable is None else trainable // shape.layers
    trainable = shape.params if trainable is None else trainable
    parts = {
        "weights (sharded master)": (shape.params + adapter) * master_bytes // n_gpus,
        "gradients (sharded)": trainable * master_bytes // n_gpus,
        "optimizer (AdamW moments)": 2 * 4 * trainable // n_gpus if optimizer_on_gpu else 0,
        "unsharded bf16 (root + 2 layers)": shape.unsharded_bytes,
        label: shape.activation_bytes(tokens, checkpointing, compiled),
        # bf16 gradients, their reduce-scatter input in the reduce dtype and its output shard
        "gradient reduction (one layer)": (layer_trainable * (COMPUTE_BYTES + reduce_bytes)
                                           + layer_trainable * reduce_bytes // n_gpus),
    }
    if logits:
        parts["log-prob chunk logits + grad"] = min(LOGPROB_CHUNK, tokens) * shape.vocab * 2 * COMPUTE_BYTES
    return parts


def model_shape(path: str, *, config_key: str, trust_remote_code: bool = False, override_config=None,
                value_head: bool = False) -> ModelShape:
    """Counts the parameters of the model at ``path`` on the meta device (nothing is allocated)."""
    from verl.models.loader import load_hf_config
    from verl.models.vision import causal_lm_class, is_vision_language

    config = load_hf_config(path, trust_remote_code=trust_remote_code, override_config=override_config,
                            config_key=config_key)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    with torch.device("meta"):
        model = causal_lm_class(config).from_config(config, trust_remote_code=trust_remote_code)
    params = sum(p.numel() for p in model.parameters())
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        layers = next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), None)
    if not layers:
        raise ValueError(f"{config_key}={path!r}: no decoder layer list found in {type(model).__name__}")
    layer_params = sum(p.numel() for p in layers[0].parameters())
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    if value_head and is_vision_language(config):  # the model keeps its lm_head, and gains a head of one output
        params += text.hidden_size
    elif value_head:  # a value head replaces the lm_head (tied or not, its weight is no longer shared)
        lm_head = text.vocab_size * text.hidden_size
        tied = bool(getattr(text, "tie_word_embeddings", False))
        params = params - (0 if tied else lm_head) + text.hidden_size + 1
    dense = getattr(text, "intermediate_size", None) or 4 * text.hidden_size
    routed = getattr(text, "num_experts_per_tok", None) or 0
    if routed:  # the top-k experts' MLPs (Mixtral-style configs give an expert's width as intermediate_size) and
        # the shared experts' where the model has them (Qwen2-MoE: one of its own width; DeepSeek: n of an expert's)
        expert = getattr(text, "moe_intermediate_size", None) or dense
        shared = (getattr(text, "shared_expert_intermediate_size", None)
                  or (getattr(text, "n_shared_experts", None) or 0) * expert)
        intermediate = routed * expert + shared
    else:
        intermediate = dense
    return ModelShape(params=params, layer_params=layer_params, layers=len(layers), hidden=text.hidden_size,
                      intermediate=intermediate, kv_dim=kv_heads * head_dim, vocab=text.vocab_size, routed=routed)


@dataclass
class Plan:
    """Per-GPU bytes by role and component, the peak of each phase, and advice."""

    device_bytes: int | None
    components: dict[str, dict[str, int]] = field(default_factory=dict)
    phases: dict[str, int] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def peak(self) -> int:
        return max(self.phases.values())

    @property
    def fits(self) -> bool | None:
        return None if self.device_bytes is None else self.peak <= self.device_bytes

    def render(self) -> str:
        lines = ["per-GPU memory estimate (GiB)"]
        for role, parts in self.components.items():
            lines.append(f"  {role}")
            lines += [f"    {name:34} {value / GIB:8.2f}" for name, value in parts.items()]
        lines.append("  peak by phase")
        lines += [f"    {name:34} {value / GIB:8.2f}" for name, value in self.phases.items()]
        device = "unknown" if self.device_bytes is None else f"{self.device_bytes / GIB:.1f} GiB"
        verdict = {True: "fits", False: "does NOT fit", None: "cannot be checked (no device size)"}[self.fits]
        lines.append(f"peak {self.peak / GIB:.2f} GiB on a device of {device}: {verdict}")
        lines += [f"note: {n}" for n in self.notes] + [f"to fit: {a}" for a in self.advice]
        return "\n".join(lines)


def _micro_tokens(batching: Batching, section: str, token_key: str, rows_key: str, max_len: int,
                  per_rank_rows: int) -> tuple[int, str]:
    """Tokens of the largest micro-batch of a phase and how that was decided."""
    if batching.max_token_len is not None:
        budget = batching.max_token_len
        whole = per_rank_rows * max_len  # a micro-batch never holds more than its mini-batch
        if whole < budget:
            return max(whole, max_len), f"the whole mini-batch ({per_rank_rows} x {max_len} tokens) is under " \
                                        f"{section}.{token_key}={budget}"
        return max(budget, max_len), f"{section}.{token_key}={budget}"
    rows = batching.micro_batch_size
    return min(rows, per_rank_rows) * max_len, f"{section}.{rows_key}_per_gpu={rows} x {max_len} tokens"


def plan_memory(config, device_bytes: int | None = None, shapes: dict[str, ModelShape] | None = None) -> Plan:
    """The estimate for a composed ``ppo_trainer`` config or its `RunSpec` (an unset gradient checkpointing
    counts as on). ``shapes`` (``actor``, ``critic``) skips reading the model folders (tests)."""
    spec = config if isinstance(config, RunSpec) else resolve_run(config, choose_checkpointing=False)
    ar = "actor_rollout_ref"
    policy, model, trainer = spec.actor_rollout_ref, spec.actor_rollout_ref.model, spec.trainer
    shapes = dict(shapes or {})
    if "actor" not in shapes:
        shapes["actor"] = model_shape(model.path, config_key=f"{ar}.model.path",
                                      trust_remote_code=model.trust_remote_code, override_config=model.override_config)
    actor = shapes["actor"]
    n_gpus = spec.world_size("actor_rollout")
    n = policy.rollout.n
    max_len = spec.data.max_prompt_length + spec.data.max_response_length
    rows = spec.data.train_batch_size * n // n_gpus
    mini_rows = policy.actor.ppo_mini_batch_size * n // n_gpus
    plan = Plan(device_bytes=device_bytes)
    on_cuda = trainer.device == "cuda"
    resident: dict[str, int] = {}  # per role, what stays on the device between phases

    def trained(role: str, shape: ModelShape, section: str, model_section: str, model_config, role_config, fsdp,
                batching: Batching, per_rank_rows: int) -> None:
        tokens, why = _micro_tokens(batching, section, "ppo_max_token_len_per_gpu", "ppo_micro_batch_size", max_len,
                                    per_rank_rows)
        offloaded = "; optimizer offloaded to CPU" if fsdp.optimizer_offload else ""
        plan.notes.append(f"{section} micro-batch: {why}{offloaded}")
        adapter = _lora_params(model_config, model_section, value_head=role == "critic")
        if adapter is not None:
            plan.notes.append(f"{model_section}: LoRA, {adapter:,} trainable parameters")
        parts = plan.components[role] = training_components(
            shape, tokens, checkpointing=model_config.enable_gradient_checkpointing is not False,
            compiled=role_config.use_torch_compile and on_cuda, logits=role == "actor", n_gpus=n_gpus,
            master_bytes=_DTYPE_BYTES.get(str(fsdp.model_dtype), 4), optimizer_on_gpu=not fsdp.optimizer_offload,
            reduce_bytes=mixed_precision_policy(fsdp, torch.device(trainer.device)).reduce_dtype.itemsize,
            trainable=adapter)
        resident[role] = sum(v for k, v in parts.items() if k.startswith(("weights", "optimizer")))

    trained("actor", actor, f"{ar}.actor", f"{ar}.model", model, policy.actor, policy.actor.fsdp_config,
            policy_phase(policy, "update", n_gpus), mini_rows)
    if spec.use_reference_policy:
        lp_tokens, _ = _micro_tokens(policy_phase(policy, "ref_log_prob", n_gpus), f"{ar}.ref",
                                     "log_prob_max_token_len_per_gpu", "log_prob_micro_batch_size", max_len, rows)
        # With LoRA the reference is the actor with its adapter off: no weights of its own.
        offload = policy.ref.fsdp_config.param_offload or _uses_lora(model)
        ref_forward = (actor.forward_bytes(lp_tokens) + min(LOGPROB_CHUNK, lp_tokens) * actor.vocab * COMPUTE_BYTES
                       + actor.unsharded_bytes)
        resident["reference"] = 0 if offload else COMPUTE_BYTES * actor.params // n_gpus
        plan.components["reference"] = {"weights (bf16, sharded)": resident["reference"],
                                        f"forward ({lp_tokens} tokens)": ref_forward}
    if spec.use_critic:
        critic = spec.critic
        if "critic" not in shapes:
            shapes["critic"] = model_shape(critic.model.path, config_key="critic.model.path", value_head=True,
                                           trust_remote_code=critic.model.trust_remote_code)
        trained("critic", shapes["critic"], "critic", "critic.model", critic.model, critic, critic.model.fsdp_config,
                spec.critic_batching.update, spec.critic_batching.mini_batch_size)

    # Generation: the actor's full bf16 weights (gathered, or the rollout's own copy), the KV cache and the
    # sampler's logits. A rollout that decodes during the update (colocate_async.overlap_generation) keeps them all.
    slots = max(1, min(rows, policy.rollout.max_num_seqs))
    kv = slots * 2 * actor.layers * actor.kv_dim * max_len * COMPUTE_BYTES
    util = policy.rollout.gpu_memory_utilization
    overlapping = spec.colocated_rollout_copy
    rollout = {"weights (bf16, own copy)" if overlapping else "weights (bf16, gathered)": COMPUTE_BYTES * actor.params,
               f"KV cache ({slots} sequences x {max_len} tokens)": kv,
               "sampling logits (fp32)": 4 * slots * actor.vocab * 4}
    if device_bytes is not None:
        free = max(0, device_bytes - sum(resident.values()))
        if kv > util * free:
            rollout[f"KV cache ({slots} sequences x {max_len} tokens)"] = int(util * free)
            plan.notes.append(f"the KV cache is capped at rollout.gpu_memory_utilization={util} of the free memory; "
                              "generation runs in waves")
    plan.components["rollout"] = rollout
    if overlapping:
        resident["rollout"] = sum(rollout.values())
        plan.notes.append("colocate_async.overlap_generation: the rollout's weights, KV cache and sampling buffers stay "
                          "on the device through every phase")

    base = sum(resident.values())
    plan.phases["generation"] = base + (0 if overlapping else sum(rollout.values()))
    if spec.use_reference_policy:
        plan.phases["reference log-probs"] = base + ref_forward
    for role in ("actor", "critic"):
        if role in plan.components:
            plan.phases[f"{role} update"] = base - resident[role] + sum(plan.components[role].values())

    if plan.fits is False:
        for role, section, model_section, model_config, fsdp_key, fsdp in (
                ("actor", f"{ar}.actor", f"{ar}.model", model, f"{ar}.actor.fsdp_config", policy.actor.fsdp_config),
                ("critic", "critic", "critic.model", spec.critic.model, "critic.model.fsdp_config",
                 spec.critic.model.fsdp_config)):
            if plan.phases.get(f"{role} update", device_bytes) > device_bytes:
                if model_config.enable_gradient_checkpointing is False:
                    plan.advice.append(f"{model_section}.enable_gradient_checkpointing=true")
                plan.advice.append(f"a smaller {section}.ppo_max_token_len_per_gpu (or micro batch)")
                if not fsdp.optimizer_offload:
                    plan.advice.append(f"{fsdp_key}.optimizer_offload=true")
        if plan.phases["generation"] > device_bytes:
            plan.advice.append(f"a smaller {ar}.rollout.max_num_seqs or gpu_memory_utilization")
        plan.advice.append("more GPUs (trainer.n_gpus_per_node / trainer.nnodes): weights, gradients and optimizer "
                           "state are sharded over them")
    return plan


def _uses_lora(model_config: ModelConfig) -> bool:
    return bool(model_config.lora_rank or model_config.lora_adapter_path)


def _lora_params(model_config: ModelConfig, model_section: str, *, value_head: bool) -> int | None:
    """The trainable parameters of the LoRA adapter ``model_config`` configures (None without LoRA),
    counted by injecting it into the model built on the meta device."""
    if not _uses_lora(model_config):
        return None
    from verl.models.loader import load_hf_config
    from verl.models.lora import LoraSettings, meta_model_with_adapter

    settings = LoraSettings.from_config(model_config, model_section)
    hf_config = load_hf_config(model_config.path, config_key=f"{model_section}.path",
                               trust_remote_code=model_config.trust_remote_code)
    model = meta_model_with_adapter(hf_config, settings, value_head=value_head)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def device_memory(device: str) -> int | None:
    """Total memory of one GPU when this process can see one and the run uses CUDA (``trainer.device``)."""
    if device != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory


def resolve_gradient_checkpointing(spec: RunSpec, log=print, device_bytes: int | None = None) -> RunSpec:
    """``spec`` with ``enable_gradient_checkpointing`` chosen where it is unset (null) for the actor and critic:
    off when the step is estimated to fit in 80% of the GPU without it (faster: no recomputation), else on; on
    when the device size is unknown (CPU runs, a driver without a GPU). ``device_bytes`` overrides the size
    of the GPU this process sees."""
    unset = spec.unset_checkpointing()
    if not unset:
        return spec
    device = device_bytes if device_bytes is not None else device_memory(spec.trainer.device)
    choice = True
    if device is not None:
        try:
            choice = plan_memory(spec.with_checkpointing(unset, False), device).peak > 0.8 * device
        except Exception as err:  # noqa: BLE001 -- an estimate that fails must not stop the run
            log(f"[plan] could not estimate memory ({type(err).__name__}: {err}); gradient checkpointing stays on")
    where = "no GPU visible to estimate with" if device is None else f"estimated peak vs {device / GIB:.0f} GiB"
    log(f"[plan] {', '.join(s + '.enable_gradient_checkpointing' for s in unset)} unset: "
        f"{'on' if choice else 'off'} ({where}); set it to true/false to choose")
    return spec.with_checkpointing(unset, choice)


def main(argv: list[str] | None = None) -> int:
    from verl.trainer.config_validation import ConfigError, compose_ppo_config

    try:
        config = compose_ppo_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    try:
        spec = resolve_run(config)
        plan = plan_memory(spec, device_memory(spec.trainer.device))
    except (OSError, ValueError) as err:
        print(err, file=sys.stderr)
        return 2
    print(plan.render())
    return 0 if plan.fits is not False else 1


if __name__ == "__main__":
    sys.exit(main())
