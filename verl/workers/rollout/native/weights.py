"""Which decoders the native engine runs, and references to their weights.

:class:`DecoderWeights` reads a Hugging Face causal LM's config once (the family's constants: norms, activation,
attention scale and soft-capping, sliding windows, RoPE frequencies) and keeps references to the module's
parameter tensors (no copy). ``bind`` walks the module again, which is how a generation call picks up weights
that FSDP unsharded into fresh storage or that an optimizer step changed in place. Fused projections (Phi-3's
``qkv_proj`` and ``gate_up_proj``) are kept whole: the forward runs one GEMM and splits its output, so nothing
derived from a weight can go stale. So are the experts of a mixture-of-experts layer: transformers stores them as 3-D
parameters ``gate_up_proj (E, 2I, H)`` and ``down_proj (E, H, I)``, which the forward multiplies group by group.

Families, as transformers computes them:

- llama, qwen2, qwen3, mistral, phi3: RMSNorm ``weight * x``, SwiGLU, RoPE (Phi-3's may be partial: only the
  first ``rotary_dim`` features of a head rotate), sliding windows where the config sets them (Mistral and
  Phi-3: every layer; Qwen: the layers ``layer_types`` marks).
- gemma2, gemma3_text, gemma3 (the text decoder of ``Gemma3ForConditionalGeneration``): RMSNorm ``(1 + weight)
  * x`` computed in float32, embeddings times ``sqrt(hidden_size)`` (rounded to the weights' dtype), GeGLU with
  the tanh GELU, norms after attention and after the MLP too, queries scaled by ``query_pre_attn_scalar**-0.5``,
  local (sliding) layers alternating with global ones, Gemma 2's tanh soft-capping of attention scores and
  final logits; Gemma 3's q/k norms and a RoPE base of its own for local layers. As in transformers, Gemma 3
  ignores ``attn_logit_softcapping``, and its multimodal class applies no final soft-capping.
- qwen3_moe, qwen2_moe: the Qwen attention (Qwen 3's q/k norms, Qwen 2's q/k/v biases) with a mixture of experts
  in place of the MLP: a router ``(E, H)`` whose float32 softmax picks ``num_experts_per_tok`` experts per token
  (their probabilities renormalised when ``norm_topk_prob``, then rounded to the hidden dtype), each expert a
  SwiGLU MLP. Qwen2-MoE adds a shared expert, a dense SwiGLU MLP scaled by ``sigmoid(shared_expert_gate(x))``.
  Layers listed in ``mlp_only_layers`` or off the ``decoder_sparse_step`` stride keep a dense MLP. Qwen3-MoE's
  ``use_sliding_window`` windows every layer; Qwen2-MoE's ``layer_types`` marks its sliding layers.
- qwen2_vl, qwen2_5_vl: the language model of Qwen2-VL / Qwen2.5-VL (Qwen 2's attention with q/k/v biases) with
  M-RoPE: the rotary frequencies split into ``mrope_section`` temporal/height/width sections, each turned by that
  coordinate of the token's position (the prompt's from the data's ``position_ids``; a generated token's three
  are equal). The vision tower runs once per prompt, outside these weights (``verl.models.vision.encode_images``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DecoderWeights", "LayerWeights", "SUPPORTED_MODEL_TYPES", "UnsupportedModelError"]

LLAMA_LIKE = ("llama", "qwen2", "qwen3", "mistral", "phi3")
MOE = ("qwen3_moe", "qwen2_moe")
GEMMA = ("gemma2", "gemma3_text", "gemma3")
VISION_LANGUAGE = ("qwen2_vl", "qwen2_5_vl")  # their language model; the engine runs the vision tower per prompt
SUPPORTED_MODEL_TYPES = LLAMA_LIKE + MOE + GEMMA + VISION_LANGUAGE
# Families whose attention applies config.sliding_window in every layer (when set).
WINDOWED_EVERY_LAYER = ("mistral", "phi3", "qwen3_moe")
# RoPE variants whose frequencies do not depend on the sequence length (dynamic/longrope do).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


class UnsupportedModelError(ValueError):
    """The native engine cannot run this model; the message says to use ``rollout.name=hf``. ``what``: the
    feature it lacks, as the message names it."""

    def __init__(self, message: str, what: str):
        super().__init__(message)
        self.what = what


def _unsupported(what: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"rollout.name=native does not support {what}; it runs {', '.join(LLAMA_LIKE + MOE + GEMMA[:2])} and "
        f"{GEMMA[-1]} (text only) decoders (RMSNorm, static RoPE, gated MLP or mixture of gated experts, full or "
        f"sliding-window attention) and the vision-language {' and '.join(VISION_LANGUAGE)}. Set "
        "actor_rollout_ref.rollout.name=hf to generate with transformers instead.", what)


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    q: torch.Tensor | None  # None where ``qkv`` holds q, k and v in one matrix (Phi-3)
    q_bias: torch.Tensor | None
    k: torch.Tensor | None
    k_bias: torch.Tensor | None
    v: torch.Tensor | None
    v_bias: torch.Tensor | None
    qkv: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    attn_out_norm: torch.Tensor | None  # Gemma: on the attention output, before the residual add
    mlp_norm: torch.Tensor  # before the MLP (``post_attention_layernorm`` in Llama, ``pre_feedforward`` in Gemma)
    # The dense MLP; in a mixture-of-experts layer the shared expert (Qwen2-MoE), or None (Qwen3-MoE).
    gate: torch.Tensor | None  # None where ``gate_up`` holds both (Phi-3)
    gate_bias: torch.Tensor | None
    up: torch.Tensor | None
    up_bias: torch.Tensor | None
    gate_up: torch.Tensor | None
    down: torch.Tensor | None
    down_bias: torch.Tensor | None
    mlp_out_norm: torch.Tensor | None  # Gemma: on the MLP output, before the residual add
    # Mixture of experts (None in a dense layer): router (E, H), experts' gate_up (E, 2I, H) and down (E, H, I).
    router: torch.Tensor | None = None
    experts_gate_up: torch.Tensor | None = None
    experts_down: torch.Tensor | None = None
    shared_expert_gate: torch.Tensor | None = None  # (1, H): the shared expert's sigmoid scale (Qwen2-MoE)


def _tensor(t, where: str) -> torch.Tensor | None:
    if t is None:
        return None
    if type(t).__name__ == "DTensor" or (hasattr(t, "full_tensor") and hasattr(t, "placements")):
        raise RuntimeError(f"{where} is still sharded (a DTensor): the native rollout must run inside the "
                           "training engine's gathered_params() block, which unshards the weights")
    return t.detach()


def _rope_key(model_type: str, kind: str) -> str:
    """The config key that names a RoPE variant (``rope_scaling`` in older config files)."""
    return f"rope_parameters[{kind!r}]['rope_type']" if model_type.startswith("gemma3") else \
        "rope_parameters['rope_type']"


class DecoderWeights:
    """References to a supported HF causal LM's weights plus the model constants the forward needs."""

    def __init__(self, module: torch.nn.Module):
        config = getattr(module, "config", None)
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise _unsupported(f"model_type {model_type!r} ({type(module).__name__})")
        multimodal = model_type == "gemma3" or model_type in VISION_LANGUAGE
        text = config.get_text_config() if multimodal else config
        self.decoder = module.model.language_model if multimodal else module.model
        # Qwen2-VL's M-RoPE: the rotary frequencies in three sections, turned by a token's temporal, height and
        # width positions (equal for text, so a generated token's rotation is plain RoPE at its text position).
        self.mrope_section = (list(self.decoder.rotary_emb.mrope_section) if model_type in VISION_LANGUAGE
                              else None)  # as transformers resolved it (a config may leave it to the default)
        # A vision-language model's image/video placeholders and vision-start mark: written by the processor only,
        # never sampled (verl.models.vision.placeholder_token_ids).
        self.image_token_id = int(config.image_token_id) if model_type in VISION_LANGUAGE else None
        self.gemma = model_type in GEMMA
        act_key = "hidden_activation" if self.gemma else "hidden_act"  # the key the family's MLP reads
        act = getattr(text, act_key, "silu")
        if act not in ACTIVATIONS:
            raise _unsupported(f"{act_key}={act!r}")
        if getattr(text, "use_bidirectional_attention", False):
            raise _unsupported("use_bidirectional_attention=true (an encoder, not a causal decoder)")
        self.gelu = act == "gelu_pytorch_tanh"
        self.model_type = model_type
        self.num_heads = text.num_attention_heads
        self.num_kv_heads = text.num_key_value_heads
        self.head_dim = getattr(text, "head_dim", None) or text.hidden_size // self.num_heads
        self.hidden_size = text.hidden_size
        self.eps = float(text.rms_norm_eps)
        num_layers = text.num_hidden_layers
        self.windows = self._windows(text, num_layers)
        # Gemma's constants; None where the family has none (SDPA's default 1/sqrt(head_dim) scale).
        self.attn_scale = float(text.query_pre_attn_scalar) ** -0.5 if self.gemma else None
        cap = getattr(text, "attn_logit_softcapping", None) if model_type == "gemma2" else None
        self.attn_softcap = float(cap) if cap else None
        cap = getattr(text, "final_logit_softcapping", None) if model_type in ("gemma2", "gemma3_text") else None
        self.final_softcap = float(cap) if cap else None
        self.moe = model_type in MOE
        self.top_k = int(text.num_experts_per_tok) if self.moe else 0
        self.norm_topk_prob = bool(getattr(text, "norm_topk_prob", False)) if self.moe else False
        self.embed_scale: float | None = None  # set by bind: sqrt(hidden_size) rounded to the weights' dtype
        self._read_rope(self.decoder.rotary_emb, text, num_layers)
        self.module = module
        self._norm_scales: dict[str, torch.Tensor] = {}  # Gemma's float32 1 + weight, by parameter name (bind)
        # The last few tables made (a generation call uses one set: its cache length). Captured CUDA graphs read
        # a table by address, so the engine keys its graphs on the tables too (see rope_pointers).
        self._rope_cache: dict[tuple, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.layers: list[LayerWeights] = []

    def _windows(self, text, num_layers: int) -> list[int | None]:
        """Each layer's sliding window (keys at most ``window - 1`` positions back are seen), or None."""
        if self.model_type in WINDOWED_EVERY_LAYER:  # their attention reads config.sliding_window in every layer
            window = getattr(text, "sliding_window", None)
            return [int(window) if window else None] * num_layers
        layer_types = getattr(text, "layer_types", None) or ["full_attention"] * num_layers
        windows = []
        for kind in layer_types[:num_layers]:
            if kind not in ("full_attention", "sliding_attention"):
                raise _unsupported(f"attention layer type {kind!r} (config key layer_types)")
            window = getattr(text, "sliding_window", None) if kind == "sliding_attention" else None
            windows.append(int(window) if window else None)
        return windows

    def _read_rope(self, rotary, text, num_layers: int) -> None:
        """Frequencies and scaling of each RoPE variant the layers use (Gemma 3: one per layer type)."""
        if isinstance(getattr(rotary, "rope_type", None), dict):
            layer_types = list(text.layer_types[:num_layers])
            kinds = {kind: (getattr(rotary, f"{kind}_inv_freq"), getattr(rotary, f"{kind}_attention_scaling"),
                            rotary.rope_type[kind]) for kind in sorted(set(layer_types))}
            self.layer_rope = layer_types
        else:
            kinds = {"default": (rotary.inv_freq, getattr(rotary, "attention_scaling", 1.0),
                                 getattr(rotary, "rope_type", "default"))}
            self.layer_rope = ["default"] * num_layers
        self.ropes: dict[str, tuple[torch.Tensor, float]] = {}
        for kind, (inv_freq, scaling, rope_type) in kinds.items():
            if rope_type not in STATIC_ROPE_TYPES:
                raise _unsupported(
                    f"rope type {rope_type!r} (config key {_rope_key(self.model_type, kind)}, rope_scaling in older "
                    f"config files): its frequencies depend on the sequence length; static types are "
                    f"{', '.join(STATIC_ROPE_TYPES)}")
            self.ropes[kind] = (inv_freq.detach().float().clone(), float(scaling))
        dims = {2 * inv_freq.numel() for inv_freq, _ in self.ropes.values()}
        self.rotary_dim = dims.pop()
        if dims or self.rotary_dim > self.head_dim:
            raise _unsupported("rotary embeddings wider than a head or of different widths per layer")

    def bind(self) -> None:
        """(Re)read the module's current parameter tensors (references only). Called at the start of
        every generation: the weights are sharded outside the worker's ``gathered_params()`` block.

        Gemma's RMSNorm scales by ``1 + weight`` in float32: those scales are computed here, once per binding,
        into buffers of this object that keep their addresses (refreshed in place, so captured CUDA graphs stay
        valid), instead of two more kernels per normalisation in every forward; a Gemma norm field holds the
        float32 scale, not the parameter."""
        module = self.module
        self.embed = _tensor(module.get_input_embeddings().weight, "the input embedding")
        self.lm_head = _tensor(module.get_output_embeddings().weight, "lm_head")
        self.norm = self._norm_scale(_tensor(self.decoder.norm.weight, "model.norm"), "model.norm")
        if self.gemma:  # transformers multiplies by the scale as a tensor of the weights' dtype
            self.embed_scale = torch.tensor(self.hidden_size**0.5).to(self.embed.dtype).item()
        self.layers = [self._layer(i, layer) for i, layer in enumerate(self.decoder.layers)]

    def _layer(self, i: int, layer: torch.nn.Module) -> LayerWeights:
        attn, mlp = layer.self_attn, layer.mlp

        def w(part, name):
            return None if part is None else _tensor(part.weight, f"layers.{i}.{name}")

        def norm(part, name):
            return None if part is None else self._norm_scale(_tensor(part.weight, f"layers.{i}.{name}"),
                                                              f"layers.{i}.{name}")

        def b(part, name):
            return None if part is None else _tensor(getattr(part, "bias", None), f"layers.{i}.{name}.bias")

        parts = {name: getattr(attn, name, None) for name in ("q_proj", "k_proj", "v_proj", "qkv_proj", "q_norm",
                                                                "k_norm")}
        moe = self._experts(i, mlp)
        dense = getattr(mlp, "shared_expert", None) if moe else mlp  # a MoE layer's dense part: its shared expert
        parts.update({name: getattr(dense, name, None) for name in ("gate_proj", "up_proj", "gate_up_proj",
                                                                      "down_proj")})
        if self.gemma:
            attn_out_norm, mlp_norm = layer.post_attention_layernorm, layer.pre_feedforward_layernorm
            mlp_out_norm = layer.post_feedforward_layernorm
        else:
            attn_out_norm, mlp_norm, mlp_out_norm = None, layer.post_attention_layernorm, None
        return LayerWeights(
            input_norm=norm(layer.input_layernorm, "input_layernorm"),
            q=w(parts["q_proj"], "q_proj"), q_bias=b(parts["q_proj"], "q_proj"),
            k=w(parts["k_proj"], "k_proj"), k_bias=b(parts["k_proj"], "k_proj"),
            v=w(parts["v_proj"], "v_proj"), v_bias=b(parts["v_proj"], "v_proj"),
            qkv=w(parts["qkv_proj"], "qkv_proj"), o=w(attn.o_proj, "o_proj"), o_bias=b(attn.o_proj, "o_proj"),
            q_norm=norm(parts["q_norm"], "q_norm"), k_norm=norm(parts["k_norm"], "k_norm"),
            attn_out_norm=norm(attn_out_norm, "post_attention_layernorm"), mlp_norm=norm(mlp_norm, "mlp norm"),
            gate=w(parts["gate_proj"], "gate_proj"), gate_bias=b(parts["gate_proj"], "gate_proj"),
            up=w(parts["up_proj"], "up_proj"), up_bias=b(parts["up_proj"], "up_proj"),
            gate_up=w(parts["gate_up_proj"], "gate_up_proj"), down=w(parts["down_proj"], "down_proj"),
            down_bias=b(parts["down_proj"], "down_proj"),
            mlp_out_norm=norm(mlp_out_norm, "post_feedforward_layernorm"),
            **moe)

    def _norm_scale(self, weight: torch.Tensor, name: str) -> torch.Tensor:
        """The normalisation's scale as the forward uses it: the weight itself, or Gemma's ``1 + weight`` in float32
        in a buffer of its own that keeps its address from one binding to the next."""
        if not self.gemma:
            return weight
        scale = self._norm_scales.get(name)
        if scale is None or scale.shape != weight.shape or scale.device != weight.device:
            scale = self._norm_scales[name] = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
        with torch.no_grad():
            return scale.copy_(weight).add_(1.0)

    def _experts(self, i: int, mlp: torch.nn.Module) -> dict:
        """A mixture-of-experts layer's router, experts and shared-expert gate ({} for a dense MLP)."""
        experts = getattr(mlp, "experts", None) if self.moe else None
        if experts is None:
            return {}
        if getattr(getattr(experts, "gate_up_proj", None), "dim", lambda: 0)() != 3:
            raise _unsupported(f"the experts of layer {i} as {type(experts).__name__} stores them (the native engine "
                               "reads transformers 5's 3-D gate_up_proj/down_proj expert parameters)")
        shared_gate = getattr(mlp, "shared_expert_gate", None)
        where = f"layers.{i}.mlp"
        return {"router": _tensor(mlp.gate.weight, f"{where}.gate"),
                "experts_gate_up": _tensor(experts.gate_up_proj, f"{where}.experts.gate_up_proj"),
                "experts_down": _tensor(experts.down_proj, f"{where}.experts.down_proj"),
                "shared_expert_gate": None if shared_gate is None else _tensor(shared_gate.weight,
                                                                               f"{where}.shared_expert_gate")}

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def qkv_sizes(self) -> tuple[int, int, int]:
        kv = self.num_kv_heads * self.head_dim
        return self.num_heads * self.head_dim, kv, kv

    def tensors(self) -> list[torch.Tensor]:
        out = [self.embed, self.lm_head, self.norm]
        for layer in self.layers:
            out.extend(t for t in vars(layer).values() if t is not None)
        return out

    def pointers(self) -> tuple[int, ...]:
        """Storage addresses of every weight: CUDA graphs captured over other addresses are stale."""
        return tuple(t.data_ptr() for t in self.tensors())

    def rope_pointers(self, max_len: int) -> tuple[int, ...]:
        return tuple(t.data_ptr() for pair in self.rope(max_len).values() for t in pair)

    def rope(self, max_len: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per RoPE variant (``layer_rope[i]`` names layer ``i``'s), cos and sign-folded sin tables
        ``(max_len, rotary_dim)``: rotate_half(x) * sin equals roll(x, rotary_dim/2) * cat(-sin, sin) because both
        halves of the RoPE angles are equal."""
        key = (max_len, self.device, self.dtype)
        if key in self._rope_cache:
            self._rope_cache[key] = self._rope_cache.pop(key)  # most recently used last
        else:
            while len(self._rope_cache) >= 4:
                self._rope_cache.pop(next(iter(self._rope_cache)))
            positions = torch.arange(max_len, device=self.device, dtype=torch.float32)
            tables = {}
            for kind, (inv_freq, scaling) in self.ropes.items():
                freqs = positions[:, None] * inv_freq.to(self.device)[None, :]
                cos = torch.cat((freqs, freqs), dim=-1).cos() * scaling
                sin = freqs.sin() * scaling
                tables[kind] = (cos.to(self.dtype), torch.cat((-sin, sin), dim=-1).to(self.dtype))
            self._rope_cache[key] = tables
        return self._rope_cache[key]
