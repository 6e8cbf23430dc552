"""The slot KV cache: one slot per running sequence, each long enough for prompt + response.

Why slots and not pages: RL rollouts generate up to a fixed ``response_length`` after prompts
padded to one width, so every sequence needs at most ``P + R`` columns and a slot wastes at most the
response a sequence does not use (nothing at all with fixed-length responses). Slots make the
decode attention a batched attention over a contiguous ``(slots, kv_heads, P + R, head_dim)`` tensor
with a column range per row (on CUDA a fused kernel that reads only that range; elsewhere SDPA with a
length mask): no page table, no gather, and shapes that CUDA graphs can capture once per batch-size
bucket. Pages would pay off for prefix sharing across calls or for
very uneven lengths; here the ``n`` samples of a prompt share its prefill (computed once, copied
into ``n`` slots), and the fused decode attention reads the copy of one of them for all (see
``triton_ops.decode_attention``'s ``shared``): the other copies cost memory, not bandwidth.

Layout: ``k``/``v`` are ``(layers, slots, kv_heads, max_len, head_dim)``. A sequence keeps the
padded column layout of its prompt (the prompt's real tokens end at column ``P - 1``), so no
prompt is shifted and the attention mask of a slot is the column range ``[start, write_pos]``.
"""

from __future__ import annotations

import torch

__all__ = ["SlotCache", "plan_slots"]


def slot_bytes(num_layers: int, num_kv_heads: int, head_dim: int, max_len: int, dtype: torch.dtype) -> int:
    """Bytes one slot takes: keys and values of every layer for ``max_len`` columns."""
    return 2 * num_layers * num_kv_heads * head_dim * max_len * torch.empty((), dtype=dtype).element_size()


def plan_slots(rows: int, max_num_seqs: int, per_slot: int, device: torch.device,
               gpu_memory_utilization: float, reserve_bytes: int = 0) -> int:
    """How many slots to allocate: at most one per output row and ``max_num_seqs``; on a GPU also
    no more than ``gpu_memory_utilization`` of the free device memory (what the caching allocator
    holds unused counts as free) minus ``reserve_bytes`` for activations. On CPU the cache is bounded
    by ``max_num_seqs`` slots of ``P + R`` tokens each: that is the token budget."""
    slots = max(1, min(rows, max_num_seqs))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        budget = int(gpu_memory_utilization * free) - reserve_bytes
        fits = budget // per_slot
        if fits < 1:
            raise RuntimeError(
                f"the native rollout's KV cache does not fit: {gpu_memory_utilization:.2f} of the free "
                f"{free / 2**30:.1f} GiB leaves room for no slot of {per_slot / 2**20:.0f} MiB. Raise "
                "actor_rollout_ref.rollout.gpu_memory_utilization or shorten prompt/response lengths")
        slots = min(slots, fits)
    return slots


class SlotCache:
    """Keys and values of ``num_slots`` sequences of up to ``max_len`` tokens."""

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (num_layers, num_slots, num_kv_heads, max_len, head_dim)
        # Zeros, not empty: masked columns get weight 0 in attention, and 0 * NaN garbage would be NaN.
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.columns = torch.arange(max_len, device=device)
        self.num_slots = num_slots
        self.max_len = max_len

    def fits(self, num_layers: int, num_kv_heads: int, max_len: int, head_dim: int, dtype, device) -> bool:
        """Whether this cache can serve a call of that shape (it is kept between calls when
        ``free_cache_engine`` is off)."""
        return (self.k.shape[0] == num_layers and self.k.shape[2] == num_kv_heads and self.k.shape[4] == head_dim
                and self.max_len == max_len and self.k.dtype == dtype and self.k.device == device)

    def pointers(self) -> tuple[int, int]:
        return self.k.data_ptr(), self.v.data_ptr()

    def store_prompt(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first_col: int) -> None:
        """Write prompt keys/values ``(len(slots), kv_heads, T, head_dim)`` at columns from ``first_col``."""
        end = first_col + k.shape[2]
        self.k[layer, :, :, first_col:end].index_copy_(0, slots, k)
        self.v[layer, :, :, first_col:end].index_copy_(0, slots, v)

    def move(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy whole slots ``src`` to ``dst`` (all layers), to pack running sequences into low slots."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]
