"""Per-token log-probs and entropy of a causal LM, without the full fp32 (tokens x vocab) logits.

The logits of a chunk of rows are computed from the final hidden states, reduced to one log-prob and
one entropy per row, and dropped. In training each chunk runs under activation checkpointing, so
backward recomputes that chunk's logits instead of keeping every chunk's alive: peak memory holds one
chunk of logits, whatever the sequence length. The reduction is one Triton kernel each way on CUDA
(:mod:`verl.models.logprob_kernels`: the logits are read once in their own dtype, nothing of size
vocab is written in fp32) and torch ops elsewhere (upcast to fp32, log-softmax, entropy).

Position convention: the logits at position t predict token t+1, so for a sequence of P prompt and R
response tokens (T = P + R) the response log-probs come from the hidden states at positions
P-1 .. T-2, scored against the tokens at P .. T-1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from verl.models.moe import RouterSpec, router_load
from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

KERNELS = ("auto", "torch", "triton")


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_kernel(kernel: str, device: torch.device) -> str:
    """``torch`` or ``triton``: the implementation of the log-prob/entropy reduction for tensors on ``device``.

    ``auto`` is Triton (:mod:`verl.models.logprob_kernels`) on CUDA when Triton is installed, torch ops
    otherwise; ``triton`` on a CPU falls back to torch (the kernels need CUDA).
    """
    if kernel not in KERNELS:
        raise ValueError(f"log-prob kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "torch" or device.type != "cuda":
        return "torch"
    if not _triton_available():
        if kernel == "triton":
            raise ImportError("fused_kernel_options.impl_backend=triton needs the triton package; install it or "
                              "set impl_backend=torch")
        return "torch"
    return "triton"


def _chunk_logprobs(hidden, weight, bias, labels, temperature: float, compute_entropy: bool, kernel: str):
    logits = F.linear(hidden, weight, bias)
    if kernel == "triton":
        from verl.models.logprob_kernels import logprob_entropy

        log_probs, entropy = logprob_entropy(logits, labels, temperature)
        return (log_probs, entropy) if compute_entropy else (log_probs,)
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = logprobs_from_logits(logits, labels)
    return (log_probs, entropy_from_logits(logits)) if compute_entropy else (log_probs,)


def logprobs_and_entropy_from_hidden(hidden_states: torch.Tensor, lm_head_weight: torch.Tensor,
                                     labels: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024,
                                     compute_entropy: bool = True, lm_head_bias: torch.Tensor | None = None,
                                     kernel: str = "auto"):
    """log softmax(z/τ)[label] and entropy of softmax(z/τ), with z = hidden · Wᵀ (+ b), per row.

    ``hidden_states`` (..., H), ``lm_head_weight`` (V, H), ``labels`` (...) → ``(log_probs, entropy)``,
    both float32 of shape ``labels.shape``; entropy is None unless ``compute_entropy``.
    Rows are processed ``chunk_size`` at a time; differentiable in ``hidden_states`` and the weight.
    ``kernel`` (see :func:`resolve_kernel`) picks the reduction of each chunk's logits.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    out_shape = labels.shape
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
    flat_labels = labels.reshape(-1).long()
    needs_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or lm_head_weight.requires_grad
        or (lm_head_bias is not None and lm_head_bias.requires_grad)
    )
    kernel = resolve_kernel(kernel, hidden.device)
    pieces = []
    for start in range(0, hidden.shape[0], chunk_size):
        args = (hidden[start:start + chunk_size], lm_head_weight, lm_head_bias,
                flat_labels[start:start + chunk_size], float(temperature), compute_entropy, kernel)
        if needs_grad:
            pieces.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(*args))
    if not pieces:  # no rows at all
        empty = hidden.new_zeros(out_shape, dtype=torch.float32)
        return empty, (empty.clone() if compute_entropy else None)
    log_probs = torch.cat([p[0] for p in pieces]).reshape(out_shape)
    entropy = torch.cat([p[1] for p in pieces]).reshape(out_shape) if compute_entropy else None
    return log_probs, entropy


def call_as_forward(module: torch.nn.Module, fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` in place of ``module.forward``, through ``module.__call__``.

    Why: under FSDP2 the root module's hooks unshard the parameters it owns directly (embeddings, final
    norm, lm_head) and set up backward. Calling ``model.model`` and ``model.lm_head`` from outside would
    skip those hooks; running our function as the root's forward keeps them. On a plain module this is
    just ``fn(*args, **kwargs)``.
    """
    previous = module.__dict__.get("forward")
    module.forward = fn
    try:
        return module(*args, **kwargs)
    finally:
        if previous is None:
            del module.forward
        else:
            module.forward = previous


def encoded_images(model, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The vision encoder's features (one ``(tokens, hidden)`` tensor per image) of a batch's images in row order,
    from ``inputs`` as :func:`verl.models.vision.multi_modal_batch` joins them (each distinct row's images once):
    ``image_index`` (when given) repeats their features for every row that shows them."""
    backbone = getattr(model, model.base_model_prefix)
    features = backbone.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"],
                                           return_dict=True).pooler_output
    index = inputs.get("image_index")
    return tuple(features) if index is None else tuple(features[i] for i in index.tolist())


def _run_backbone(model, input_ids, attention_mask, position_ids, packed: bool, multi_modal: dict | None = None,
                  **kwargs):
    """The backbone's (``model.model``'s) output and, packed, the `Packed` batch it ran on (else None).

    ``multi_modal``: a vision-language model's image inputs of these rows (``pixel_values``, ``image_grid_thw``;
    see :mod:`verl.models.vision`), with M-RoPE ``position_ids`` (B, 3, T)."""
    backbone = getattr(model, model.base_model_prefix)
    batch = None
    if packed:
        from verl.models.packed import pack

        batch = pack(input_ids, attention_mask, position_ids)
        inputs = batch.model_kwargs()
    else:
        if position_ids.dim() == 3:  # M-RoPE: the batch holds (B, 3, T), the model takes (3, B, T)
            position_ids = position_ids.transpose(0, 1)
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    if multi_modal:
        # The vision encoder runs on its own, once per micro-batch (in a packed forward the language model's
        # sequence boundaries would otherwise reach the vision tower's attention as well), and its features
        # replace the image placeholders' embeddings: the model gets embeddings, not pixels (every transformers
        # version takes them; its own argument for precomputed features came late).
        inputs["inputs_embeds"] = embed_with_features(model, inputs.pop("input_ids"), encoded_images(model, multi_modal))
    return backbone(**inputs, use_cache=False, **kwargs), batch


def embed_with_features(model, input_ids: torch.Tensor, features: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The model's token embeddings of ``input_ids`` with the image ``features`` (one ``(tokens, hidden)`` tensor
    per image, in row order) in place of the image placeholder tokens (:func:`place_image_features`)."""
    embeds = model.get_input_embeddings()(input_ids)
    return place_image_features(embeds, input_ids, model.config.image_token_id, torch.cat(features) if features else None)


def place_image_features(embeds: torch.Tensor, input_ids: torch.Tensor, image_token_id: int,
                         features: torch.Tensor | None) -> torch.Tensor:
    """``embeds`` (..., H) of ``input_ids`` with the image features ``(tokens, H)`` (None: no image) in place of the
    image placeholder tokens, in row-major order, as transformers' Qwen2-VL models scatter them. The trainer's
    forward and the native rollout's prefill both place them here."""
    places = input_ids == image_token_id
    count, encoded = int(places.sum()), 0 if features is None else features.shape[0]
    if count != encoded:
        raise ValueError(f"the prompts hold {count} image tokens but their images encode to {encoded}: each "
                         "image's placeholder must be expanded to its grid's merged patches, as verl's RL dataset "
                         "does with the model's processor")
    return embeds.masked_scatter(places[..., None], features.to(embeds.dtype)) if count else embeds


def backbone_hidden(model, input_ids, attention_mask, position_ids, packed: bool, multi_modal: dict | None = None):
    """The backbone's (``model.model``'s) final hidden states: padded, (B, T, H) and None; packed (see
    :mod:`verl.models.packed`), (N, H) for the N valid tokens and the `Packed` batch that places them."""
    output, batch = _run_backbone(model, input_ids, attention_mask, position_ids, packed, multi_modal)
    return _last_hidden(output, batch), batch


def _last_hidden(output, batch) -> torch.Tensor:
    """Padded: (B, T, H); packed: (N, H), the one packed row's."""
    return output.last_hidden_state if batch is None else output.last_hidden_state[0]


def _hidden_states(model, input_ids, attention_mask, position_ids, response_length: int, packed: bool,
                   routing: RouterSpec | None = None, multi_modal: dict | None = None):
    """Final hidden states at the positions that predict the last ``response_length`` tokens, and the
    routers' (aux_loss, loads) of this forward with ``routing`` (see :func:`verl.models.moe.router_load`).

    Padded: (B, R, H) at columns T-R-1 .. T-2, with ``None`` as the mask. Packed: (n, H) for the n valid
    response tokens only, with the (B, R) mask that places them (row-major) back into the batch.
    """
    extra = {} if routing is None else {"output_router_logits": True}
    output, batch = _run_backbone(model, input_ids, attention_mask, position_ids, packed, multi_modal, **extra)
    hidden, router = _last_hidden(output, batch), None
    if routing is not None:
        # Packed rows are all real tokens; padded ones are masked by the attention mask.
        valid = None if batch is not None else attention_mask.reshape(-1).bool()
        with torch.set_grad_enabled(torch.is_grad_enabled() and routing.add_aux_loss):
            router = router_load(output.router_logits, routing.num_experts, routing.top_k, valid)
    if batch is None:
        return hidden[:, -response_length - 1:-1], None, router
    valid, before = batch.response_positions(response_length)
    return hidden[before], valid, router


def _unpack(values: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """(n,) values of the valid response tokens back to (B, R), zero elsewhere; a copy either way
    (FSDP2 warns when a root forward returns views)."""
    if valid is None:
        return values.clone()
    return values.new_zeros(valid.shape).masked_scatter(valid, values)


def _check_response_length(response_length: int, input_ids: torch.Tensor) -> None:
    if not 0 < response_length < input_ids.shape[1]:
        raise ValueError(f"response_length={response_length} must be in [1, sequence length {input_ids.shape[1]})")


def _scored_forward(model, input_ids, attention_mask, position_ids, response_length: int, temperature: float,
                    chunk_size: int, compute_entropy: bool, remove_padding: bool, kernel: str,
                    routing: RouterSpec | None, multi_modal: dict | None):
    def scored_forward(input_ids, attention_mask, position_ids, multi_modal):
        hidden, valid, router = _hidden_states(model, input_ids, attention_mask, position_ids, response_length,
                                               remove_padding, routing, multi_modal)
        labels = input_ids[:, -response_length:]
        lm_head = model.get_output_embeddings()
        log_probs, entropy = logprobs_and_entropy_from_hidden(
            hidden, lm_head.weight, labels if valid is None else labels[valid],
            temperature=temperature, chunk_size=chunk_size, compute_entropy=compute_entropy,
            lm_head_bias=getattr(lm_head, "bias", None), kernel=kernel,
        )
        scored = _unpack(log_probs, valid), (_unpack(entropy, valid) if entropy is not None else None)
        return scored if router is None else (*scored, *router)

    _check_response_length(response_length, input_ids)
    return call_as_forward(model, scored_forward, input_ids, attention_mask, position_ids, multi_modal)


def forward_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                     response_length: int, temperature: float = 1.0, chunk_size: int = 1024,
                     compute_entropy: bool = True, remove_padding: bool = False, kernel: str = "auto",
                     multi_modal_inputs: dict | None = None):
    """Log-probs (B, R) of the last ``response_length`` tokens of ``input_ids`` (B, T), and entropy (B, R).

    Runs the backbone (``model.model``) for hidden states, then scores only the response positions
    (hidden states at T-R-1 .. T-2) against the lm_head in chunks. Works on a plain HF causal LM and on
    one wrapped by FSDP2. Entropy is None unless ``compute_entropy``.

    ``remove_padding``: run the backbone on the valid tokens only, packed (the model must use
    :data:`verl.models.packed.ATTN_IMPLEMENTATION`), and score valid response tokens only; padded
    response positions then hold 0. ``kernel``: see :func:`resolve_kernel`.

    A vision-language model takes its rows' image inputs as ``multi_modal_inputs`` (``pixel_values``,
    ``image_grid_thw`` of the distinct rows and ``image_index``, as :func:`verl.models.vision.multi_modal_batch`
    joins them; or all rows' in row order without an index) and M-RoPE
    ``position_ids`` (B, 3, T); the vision encoder runs once per call.
    """
    return _scored_forward(model, input_ids, attention_mask, position_ids, response_length, temperature, chunk_size,
                           compute_entropy, remove_padding, kernel, routing=None, multi_modal=multi_modal_inputs)


def forward_logprobs_and_routing(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                 position_ids: torch.Tensor, response_length: int, routing: RouterSpec,
                                 temperature: float = 1.0, chunk_size: int = 1024, compute_entropy: bool = True,
                                 remove_padding: bool = False, kernel: str = "auto",
                                 multi_modal_inputs: dict | None = None):
    """:func:`forward_logprobs` of a mixture-of-experts model (``routing``: :func:`verl.models.moe.router_spec`),
    plus its routers' auxiliary loss (0-d; differentiable when ``routing.add_aux_loss``) and expert loads
    (L, E) over every valid token of the batch, prompts included: ``(log_probs, entropy, aux_loss, loads)``."""
    return _scored_forward(model, input_ids, attention_mask, position_ids, response_length, temperature, chunk_size,
                           compute_entropy, remove_padding, kernel, routing=routing, multi_modal=multi_modal_inputs)


def forward_values(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                   response_length: int, remove_padding: bool = False,
                   multi_modal_inputs: dict | None = None) -> torch.Tensor:
    """Values (B, R) float32 of a value model for the last ``response_length`` tokens.

    The value of response token t is read at position t-1 (the state before emitting it), the same
    positions ``forward_logprobs`` uses; the head runs on those positions only. ``remove_padding`` as
    in :func:`forward_logprobs` (padded response positions hold 0), and so is ``multi_modal_inputs``.
    """
    def value_forward(input_ids, attention_mask, position_ids, multi_modal):
        hidden, valid, _ = _hidden_states(model, input_ids, attention_mask, position_ids, response_length,
                                          remove_padding, multi_modal=multi_modal)
        head = model.score if hasattr(model, "score") else model.classifier
        return _unpack(head(hidden).squeeze(-1).float(), valid)

    _check_response_length(response_length, input_ids)
    return call_as_forward(model, value_forward, input_ids, attention_mask, position_ids, multi_modal_inputs)
