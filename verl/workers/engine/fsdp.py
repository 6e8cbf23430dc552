"""The FSDP2 training engine: one Hugging Face model sharded over every rank of the default process group.

Parameters are kept in fp32 (load the model in ``fsdp_config.model_dtype``) and sharded along dim 0
over a 1-D mesh; each decoder layer and then the root are ``fully_shard``-ed, so a forward all-gathers
one layer at a time in the mixed-precision ``param_dtype`` and reduce-scatters gradients in
``reduce_dtype`` (fp32). The same engine serves the actor, the critic (value model) and, without an
optimizer, the reference model.

Typical use from a worker (the process group is already initialised)::

    model = load_causal_lm(path, dtype=fsdp_config.model_dtype)
    engine = FSDPEngine(model, fsdp_config=fsdp_config, optim_config=optim, grad_clip=actor.grad_clip,
                        enable_gradient_checkpointing=True)
    with engine.on_device(optimizer=True):
        stats = engine.train_step(micro_batches, loss_fn)
    engine.lr_scheduler_step()
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from verl.models import loader
from verl.models.vision import vision_tower
from verl.workers.config.engine import FSDPConfig
from verl.workers.config.optimizer import OptimConfig
from verl.workers.engine import checkpoint as ckpt
from verl.workers.engine.optim import build_lr_scheduler, build_optimizer

logger = logging.getLogger(__name__)

LossFn = Callable[[torch.nn.Module, object], "torch.Tensor | tuple[torch.Tensor, dict]"]


def default_device() -> torch.device:
    """The current CUDA device (the worker sets it per rank) when the default process group can reach it
    (NCCL), else the CPU: a gloo-only group means a CPU run even on a machine with GPUs."""
    if torch.cuda.is_available() and "nccl" in str(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def mixed_precision_policy(fsdp_config: FSDPConfig, device: torch.device) -> MixedPrecisionPolicy:
    """Parameters gathered in ``mixed_precision.param_dtype``, else ``dtype`` (null: bf16 on CUDA, fp32 on CPU);
    gradients reduced in ``mixed_precision.reduce_dtype``, else fp32."""
    mixed = fsdp_config.mixed_precision or {}
    param_dtype = mixed.get("param_dtype") or fsdp_config.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    return MixedPrecisionPolicy(param_dtype=loader.resolve_dtype(param_dtype),
                                reduce_dtype=loader.resolve_dtype(mixed.get("reduce_dtype") or "float32"))


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of the classes ``model._no_split_modules`` names (its decoder layers; before
    ``fully_shard``, which renames their classes)."""
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in layer_classes]


def compile_decoder_layers(model: torch.nn.Module) -> bool:
    """Replace each decoder layer's ``forward`` with ``torch.compile(forward, dynamic=True)``: its
    elementwise work (RMSNorm, rotary, SwiGLU, residuals) becomes a few fused kernels. The FSDP hooks
    (on ``__call__``) and checkpointing's wrapper stay eager; token counts vary, hence dynamic shapes.
    One compiled graph serves all layers. Returns whether any layer was compiled.

    A vision-language model's vision blocks stay eager: each block reads its window and image boundaries from
    tensors (``.tolist()``, ``.item()``), graph breaks after which every new set of image sizes compiled again
    -- on the GPU, minutes of compiling inside the first steps of a geo3k run."""
    tower = vision_tower(model)
    in_tower = set(tower.modules()) if tower is not None else set()
    layers = [layer for layer in decoder_layers(model) if layer not in in_tower]
    # Layers share one code object; a generous cache keeps recompiles for new shapes/flags from
    # falling back to eager.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 8 * len(layers), 64)
    # Floats (the norms' epsilon, the attention scale) as constants: traced as symbolic floats, AOT autograd gives
    # up on them and dynamo restarts the frame's analysis after a whole trace, in every process, and the aborted
    # attempt is never cached (a warm start paid it each time). The layers share these values: no recompiles.
    torch._dynamo.config.specialize_float = True
    # Integer attributes of the layer's modules (head_dim, ...) as constants. Dynamo specialises ints read from
    # modules, except from FSDP-managed ones (``fully_shard``'s layers) while skip_fsdp_guards is on: with
    # dynamic=True, head_dim then became a symbol of unbounded range, and every reshape by it sent the shape
    # environment into sympy. Measured warm (every graph from the cache) on a CPU, a 2-layer Qwen2.5-0.5B-shaped
    # model sharded in bf16: dynamo's time went from 10.8 to 4.1 s (tracing 5.0 -> 1.6, guards 1.4 -> 0.1);
    # on an H100, warm torch.compile went from 11.1 to 1.8 s (docs/benchmarks.md). Off, the layers' submodules and
    # parameters are guarded as any module's are (on type and tensor properties, not identity: the layers still
    # share one graph).
    torch._dynamo.config.skip_fsdp_guards = False
    # A graph the compiler cannot build (a missing toolchain, an op it does not know) runs eager, with a
    # warning, instead of failing the step.
    torch._dynamo.config.suppress_errors = True
    for layer in layers:
        layer.forward = _compiled_unless_cached(layer.forward)
    return bool(layers)


def _compiled_unless_cached(eager):
    """``eager`` compiled, except for calls with a KV cache (transformers ``generate``, the hf rollout),
    whose cache objects change every step: those stay eager."""
    compiled = torch.compile(eager, dynamic=True)

    @functools.wraps(eager)
    def forward(*args, **kwargs):
        cached = any(kwargs.get(k) is not None for k in ("cache", "past_key_values", "past_key_value"))  # by version
        return eager(*args, **kwargs) if cached else compiled(*args, **kwargs)

    return forward


def shard_model(model: torch.nn.Module, mesh, *, mp_policy: MixedPrecisionPolicy, reshard_after_forward: bool,
                offload_policy: bool) -> torch.nn.Module:
    """``fully_shard`` each decoder layer (classes named in ``model._no_split_modules``), then the root.

    Embeddings and lm_head stay in the root unit, so tied weights stay one parameter.
    """
    kwargs = {"mesh": mesh, "mp_policy": mp_policy}
    if offload_policy:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    layers = decoder_layers(model)
    if not layers:
        logger.warning("%s names no decoder layer class in _no_split_modules; sharding the whole model as one "
                       "unit (every forward gathers all parameters at once).", type(model).__name__)
    for layer in layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward, **kwargs)
    # The root keeps FSDP's default: not resharded after forward, as its parameters are needed again in backward.
    fully_shard(model, **kwargs)
    return model


def _check_tied(model: torch.nn.Module) -> None:
    if not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        return
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if outputs is not None and inputs.weight is not outputs.weight:
        raise RuntimeError("tie_word_embeddings is set but the input and output embeddings are no longer one "
                           "parameter after sharding.")


def _to_floats(metrics: dict[str, list]) -> dict[str, list]:
    """Each list's 0-d tensors as Python floats, read from the device in one transfer."""
    tensors = [v for values in metrics.values() for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        return dict(metrics)
    floats = iter(torch.stack([t.detach().float().reshape(()) for t in tensors]).tolist())
    return {key: [next(floats) if isinstance(v, torch.Tensor) else v for v in values]
            for key, values in metrics.items()}


class FSDPEngine:
    """One FSDP2-sharded model with its optimizer, LR schedule, offload and checkpoint I/O.

    Args:
        model: a Hugging Face model (causal LM or value model), on the CPU, in the master dtype.
        fsdp_config: ``*.fsdp_config`` (`FSDPConfig`, or a dict of its keys).
        optim_config: ``*.optim`` (`OptimConfig`, or a dict of its keys); None builds no optimizer (a frozen
            reference model).
        grad_clip: max global grad norm (``actor.grad_clip``); <= 0 or None measures without clipping.
        enable_gradient_checkpointing: recompute each decoder layer in backward.
        compile_layers: ``torch.compile`` each decoder layer's forward (CUDA only; see :func:`compile_layers`).
        total_training_steps: overrides ``optim.total_training_steps`` for the LR schedule.
        lora_config: the PEFT config of an adapter injected into ``model`` (:mod:`verl.models.lora`); its
            frozen base weights then get no optimizer state and stay out of the checkpoints.
        device: defaults to the current CUDA device with an NCCL process group, else the CPU.
    """

    def __init__(self, model: torch.nn.Module, *, fsdp_config=None, optim_config=None, grad_clip: float | None = 1.0,
                 enable_gradient_checkpointing: bool = False, compile_layers: bool = False,
                 total_training_steps: int | None = None, device: torch.device | str | None = None,
                 lora_config: dict | None = None):
        if not dist.is_initialized():
            raise RuntimeError("FSDPEngine needs an initialised default process group (the Worker base does that; "
                               "in a script call torch.distributed.init_process_group first).")
        self.device = torch.device(device) if device is not None else default_device()
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        fsdp_config = FSDPConfig.from_config(fsdp_config)
        optim_config = None if optim_config is None else OptimConfig.from_config(optim_config)
        if 0 < fsdp_config.fsdp_size < self.world_size:
            logger.warning("fsdp_config.fsdp_size=%d is ignored: this engine shards over all %d ranks (1-D mesh).",
                           fsdp_config.fsdp_size, self.world_size)
        self.mesh = init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("fsdp",))
        self.reshard_after_forward = fsdp_config.reshard_after_forward
        self.offload_policy = fsdp_config.offload_policy and self.device.type != "cpu"
        # Moving states between phases only means something when the compute device is not the CPU.
        movable = self.device.type != "cpu" and not self.offload_policy
        self.param_offload = fsdp_config.param_offload and movable
        self.optimizer_offload = fsdp_config.optimizer_offload and movable
        self.grad_clip = grad_clip

        if enable_gradient_checkpointing:
            loader.enable_gradient_checkpointing(model)
        if getattr(model, "config", None) is not None:
            model.config.use_cache = False
        self.compiled = compile_layers and self.device.type == "cuda" and compile_decoder_layers(model)
        self.module = shard_model(model, self.mesh, mp_policy=mixed_precision_policy(fsdp_config, self.device),
                                  reshard_after_forward=self.reshard_after_forward, offload_policy=self.offload_policy)
        _check_tied(self.module)

        # Frozen parameters get no optimizer state. Under a LoRA adapter they (the base weights) are not checkpointed
        # either: they are what model.path holds. Other frozen parts (a frozen vision tower) stay in the
        # checkpoints, so that a merged export is a whole model.
        trainable = [p for p in self.module.parameters() if p.requires_grad]
        frozen = {name for name, p in self.module.named_parameters(remove_duplicate=False)
                  if not p.requires_grad and lora_config is not None}
        self.checkpointed_names = None if not frozen else \
            [name for name in self.module.state_dict(keep_vars=True) if name not in frozen]
        self.lora_config = lora_config  # written beside the checkpoints; the merger needs it
        self.optimizer = build_optimizer(trainable, optim_config) if optim_config is not None else None
        self.lr_scheduler = (build_lr_scheduler(self.optimizer, optim_config, total_training_steps)
                             if self.optimizer is not None else None)
        self._params_on_device = True
        self._optimizer_on_device = not self.optimizer_offload  # AdamW creates its states at the first step
        if self.param_offload:
            self.offload_params()

    def train_step(self, micro_batches: Iterable, loss_fn: LossFn) -> dict:
        """One optimizer step over ``micro_batches`` (gradient accumulation), collective over all ranks.

        ``loss_fn(module, micro_batch)`` returns ``loss`` or ``(loss, metrics)``; a metric may be a
        0-d tensor (read once after the last micro-batch, so the loop never waits on the device). The engine calls
        ``loss.backward()`` as is: the loss must already be scaled to its share of this rank's
        mini-batch (e.g. ``× micro_size / mini_size``, or its share of the tokens), so the accumulated
        gradient is the gradient of the rank's mini-batch loss; FSDP then averages it over ranks.
        Every rank must pass the same number of micro-batches.

        Returns ``loss`` (sum of the micro-batch losses), ``grad_norm`` (before clipping), ``lr`` (used
        by this step), ``update_skipped`` (True when the grad norm was not finite: no update, a
        warning is logged) and each metric key of ``loss_fn`` as a list, one entry per micro-batch.
        The LR scheduler is not stepped here: call ``lr_scheduler_step()`` once per trainer step.
        """
        if self.optimizer is None:
            raise RuntimeError("This engine has no optimizer (built without optim_config), so it cannot train.")
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        results: dict = defaultdict(list)
        losses = []
        for micro_batch in micro_batches:
            out = loss_fn(self.module, micro_batch)
            loss, metrics = out if isinstance(out, tuple) else (out, {})
            loss.backward()
            losses.append(loss.detach())
            for key, value in metrics.items():
                results[key].append(value)
        # Metrics may be device tensors: read them all with one host sync, after the last backward.
        total_loss = float(torch.stack(losses).sum()) if losses else 0.0
        results = _to_floats(results)
        grad_norm = self.clip_grad_norm()
        skipped = not math.isfinite(grad_norm)
        if skipped:
            logger.warning("grad_norm is %s: skipping this optimizer step (rank %d).", grad_norm, self.rank)
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        results.update(loss=total_loss, grad_norm=grad_norm, lr=self.get_lr(), update_skipped=skipped)
        return dict(results)

    def clip_grad_norm(self) -> float:
        """Global L2 norm of the gradients (all ranks); scales them to ``grad_clip`` when it is exceeded.

        Collective. Not finite norms are returned without touching the gradients.
        """
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if isinstance(total, DTensor):
            # Reduce on the compute device: with CPU offload the local grads live on the CPU.
            total = total.to(self.device).full_tensor()
        grad_norm = float(total)
        if self.grad_clip is not None and self.grad_clip > 0 and math.isfinite(grad_norm):
            coef = self.grad_clip / (grad_norm + 1e-6)
            if coef < 1.0:
                for grad in grads:
                    grad.mul_(coef)
        return grad_norm

    def get_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else 0.0

    def lr_scheduler_step(self) -> float:
        """Advance the LR schedule by one trainer step; returns the lr the next update will use."""
        if self.lr_scheduler is None:
            raise RuntimeError("This engine has no optimizer (built without optim_config), so no LR schedule.")
        self.lr_scheduler.step()
        return self.get_lr()

    def offload_params(self) -> None:
        """Move the sharded parameters (and any grads) to the CPU. No-op on a CPU engine."""
        if self.device.type == "cpu" or self.offload_policy:
            return
        self.module.to("cpu")
        self._params_on_device = False
        torch.cuda.empty_cache()

    def load_params(self) -> None:
        """Bring the sharded parameters back to the device. No-op on a CPU engine."""
        if self.device.type == "cpu" or self.offload_policy:
            return
        self.module.to(self.device)
        self._params_on_device = True

    def offload_optimizer(self) -> None:
        """Move the optimizer states (AdamW moments) to the CPU. No-op on a CPU engine."""
        self._move_optimizer_states(torch.device("cpu"))
        self._optimizer_on_device = False

    def load_optimizer(self) -> None:
        """Bring the optimizer states back to the device. No-op on a CPU engine."""
        self._move_optimizer_states(self.device)
        self._optimizer_on_device = True

    def _move_optimizer_states(self, target: torch.device) -> None:
        if self.optimizer is None or self.device.type == "cpu" or self.offload_policy:
            return
        for group in self.optimizer.param_groups:
            # The step count stays on the CPU, except for the fused AdamW, which reads it on the device.
            move_step = bool(group.get("fused")) or target.type == "cpu"
            for param in group["params"]:
                for key, value in self.optimizer.state.get(param, {}).items():
                    if isinstance(value, torch.Tensor) and (key != "step" or move_step):
                        self.optimizer.state[param][key] = value.to(target, non_blocking=True)
        if target.type == "cpu":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    @contextlib.contextmanager
    def on_device(self, optimizer: bool = False) -> Iterator[None]:
        """Within the block, what ``param_offload`` (and, with ``optimizer=True``, ``optimizer_offload``)
        keeps on the CPU is on the device; it goes back to the CPU afterwards."""
        load_params = self.param_offload and not self._params_on_device
        load_optim = optimizer and self.optimizer_offload and not self._optimizer_on_device
        if load_params:
            self.load_params()
        if load_optim:
            self.load_optimizer()
        try:
            yield
        finally:
            if load_optim:
                self.offload_optimizer()
            if load_params:
                self.offload_params()

    @contextlib.contextmanager
    def gathered_params(self) -> Iterator[torch.nn.Module]:
        """Every FSDP unit unsharded (in ``param_dtype``) for the whole block; yields the module.

        Forwards inside run without any collective, so ranks may run different numbers of them (a
        rollout whose ranks stop generating at different times). Collective on entry and exit. Meant for
        inference (no backward inside). Parameters are sharded again afterwards.
        """
        units = [m for m in self.module.modules() if isinstance(m, FSDPModule)]
        with self.on_device():
            for unit in units:
                unit.set_reshard_after_forward(False, recurse=False)
                unit.unshard()
            try:
                yield self.module
            finally:
                for unit in units:
                    unit.reshard()
                    if unit is not self.module:  # the root never reshards after forward (see shard_model)
                        unit.set_reshard_after_forward(self.reshard_after_forward, recurse=False)

    def full_tensors(self) -> Iterator[tuple[str, torch.Tensor, list[str]]]:
        """Each tensor of the model's state dict whole, on the compute device in the master dtype, one at a time:
        ``(name, tensor, other names of a tied tensor)``. Each one is a collective: every rank must iterate it
        to the end."""
        state = self.module.state_dict(keep_vars=True)
        names: dict[int, list[str]] = {}
        for name, value in state.items():
            names.setdefault(id(value), []).append(name)
        with self.on_device():
            for first, *tied in names.values():
                tensor = state[first].detach()
                if isinstance(tensor, DTensor):
                    tensor = tensor.to(self.device).full_tensor()
                yield first, tensor, tied

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full model state dict on CPU in the master dtype on rank 0 ({} elsewhere). Collective.

        Tied weights map to one tensor under both names.
        """
        full: dict[str, torch.Tensor] = {}
        for name, tensor, tied in self.full_tensors():
            if self.rank == 0:
                full[name] = tensor.to("cpu", copy=True)
                full.update(dict.fromkeys(tied, full[name]))
        return full

    def save_checkpoint(self, local_path: str, *, save_contents: Iterable[str] = ("model", "optimizer", "extra"),
                        tokenizer=None) -> None:
        """Write this engine's state to ``local_path`` (e.g. ``.../global_step_N/actor``). Collective.

        See :mod:`verl.workers.engine.checkpoint` for the layout. ``tokenizer`` (an object with
        ``save_pretrained`` or a folder) goes into ``huggingface/``.
        """
        ckpt.save_checkpoint(self, local_path, contents=save_contents, tokenizer=tokenizer)

    def load_checkpoint(self, local_path: str, *,
                        load_contents: Iterable[str] = ("model", "optimizer", "extra")) -> None:
        """Restore what ``save_checkpoint`` wrote; the world size must be the one it was saved with."""
        ckpt.load_checkpoint(self, local_path, contents=load_contents)
        if not self._optimizer_on_device:  # loaded next to the parameters; keep them where offload wants them
            self.offload_optimizer()
