"""NativeRollout on CUDA with graphs: exact against transformers in fp32, close in bf16 on the
Qwen2.5-0.5B layer shapes (fewer layers), continuous batching under graphs."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from verl.protocol import DataProto
from verl.workers.rollout import NativeRollout
from verl.workers.rollout.native.sampling import filter_logits

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

QWEN25 = {"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
          "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "tie_word_embeddings": True,
          "max_position_embeddings": 4096, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
SMALL = {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3,
         "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 4096,
         "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def build(config, dtype, std=None):
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    if std:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0, std)
    return model.eval()


def prompts(vocab, lengths, **meta):
    width = max(lengths)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (len(lengths), width), generator=g)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n:] = 1
    ids = ids.masked_fill(mask == 0, 0)
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    meta = {"eos_token_id": [], "pad_token_id": 0, "do_sample": False, **meta}
    return DataProto.from_dict({"input_ids": ids.cuda(), "attention_mask": mask.cuda(), "position_ids": pos.cuda()},
                               meta_info=meta)


def config(**kw):
    return {"response_length": 24, "n": 1, "temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": True,
            "max_num_seqs": 1024, "gpu_memory_utilization": 0.3, **kw}


def hf_greedy(model, batch, steps):
    out = model.generate(input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"],
                         do_sample=False, max_new_tokens=steps, pad_token_id=0, top_k=None, top_p=None,
                         temperature=None)
    return out[:, batch.batch["input_ids"].shape[1]:]


def recomputed(model, out):
    """transformers' log-softmax over the vocabulary at each response position of ``out``."""
    P = out["prompts"].shape[1]
    logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                   position_ids=out["position_ids"]).logits[:, P - 1:-1].float()
    return torch.log_softmax(logits, -1)


def chosen(log_probs, out):
    return log_probs.gather(-1, out["responses"][..., None]).squeeze(-1)


def _mismatch(out, ref):
    return (out != ref).float().mean().item(), (out.float() - ref.float()).abs().max().item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@torch.no_grad()
def test_triton_kernels_match_torch(dtype):
    """The fused decode kernels against the torch ops they replace (same roundings; fused multiply-adds may
    move a rare last bit)."""
    from verl.workers.rollout.native import triton_ops

    x = torch.empty(1, device="cuda")
    assert triton_ops.enabled(x)
    g = torch.Generator(device="cuda").manual_seed(0)
    b, H, HKV, D, slots, L = 37, 14, 2, 64, 50, 96
    q = torch.randn(b, H, D, device="cuda", generator=g).to(dtype)
    k = torch.randn(b, HKV, D, device="cuda", generator=g).to(dtype)
    v = torch.randn(b, HKV, D, device="cuda", generator=g).to(dtype)
    cos = torch.randn(L, D, device="cuda", generator=g).to(dtype)
    sin = torch.randn(L, D, device="cuda", generator=g).to(dtype)
    pos = torch.randint(0, L, (b,), device="cuda", generator=g)
    wpos = torch.randint(0, L, (b,), device="cuda", generator=g)
    slot = torch.randperm(slots, device="cuda", generator=g)[:b]
    keys = torch.zeros(slots, HKV, L, D, dtype=dtype, device="cuda")
    values = torch.zeros_like(keys)
    out = triton_ops.rope_kv_write(q, k, v, cos, sin, pos, wpos, slot, keys, values)

    def rot(t):
        return torch.addcmul(t * cos[pos][:, None], t.roll(D // 2, dims=-1), sin[pos][:, None])

    ref_k, ref_v = torch.zeros_like(keys), torch.zeros_like(values)
    ref_k[slot, :, wpos] = rot(k)
    ref_v[slot, :, wpos] = v
    frac_q, diff_q = _mismatch(out, rot(q))
    frac_k, diff_k = _mismatch(keys, ref_k)
    gate = torch.randn(b, 4864, device="cuda", generator=g).to(dtype) * 3
    up = torch.randn(b, 4864, device="cuda", generator=g).to(dtype)
    frac_s, diff_s = _mismatch(triton_ops.silu_mul(gate, up), torch.nn.functional.silu(gate) * up)
    print(f"{dtype}: rope q mismatch {frac_q:.2e} (max {diff_q:.2e}), k {frac_k:.2e} (max {diff_k:.2e}), "
          f"silu*up {frac_s:.2e} (max {diff_s:.2e})")
    assert torch.equal(values, ref_v)
    if dtype == torch.bfloat16:  # bf16 rounding hides the fused multiply-adds: seen bit-identical on an H200
        assert frac_q < 2e-3 and frac_k < 2e-3 and frac_s < 2e-3
        assert diff_q < 0.05 and diff_k < 0.05 and diff_s < 0.2
    else:  # fp32: last-bit differences (seen: max 1e-6 for RoPE, 4e-6 for SiLU-and-multiply)
        assert diff_q < 1e-5 and diff_k < 1e-5 and diff_s < 4e-5


@torch.no_grad()
def test_triton_gemma_norm_and_gelu_match_torch():
    """Gemma's RMSNorm kernel (float32 norm with the 1 + weight scale, rounded to bf16, then the residual add), its
    tanh-GELU-and-multiply and its logit soft-cap give the torch ops' bf16 values, but where float32 results round
    differently: then one unit in the last place (of a rounding)."""
    import torch.nn.functional as F

    from verl.workers.rollout.native import triton_ops

    g = torch.Generator(device="cuda").manual_seed(0)
    h = 2304
    x = (torch.randn(256, h, device="cuda", generator=g) * 4).bfloat16()
    res = (torch.randn(256, h, device="cuda", generator=g) * 4).bfloat16()
    scale = 1.0 + 0.3 * torch.randn(h, device="cuda", generator=g)
    norm = F.rms_norm(x.float(), (h,), scale, 1e-6).bfloat16()
    for residual, want in ((None, norm), (res, res + norm)):
        got = triton_ops.scaled_rms_norm(x, scale, 1e-6, residual)
        same = (got == want).float().mean().item()
        ulp = 2.0 ** -7 * (norm.float().abs() + (0 if residual is None else res.float().abs() + want.float().abs()))
        assert same > 0.99 and ((got.float() - want.float()).abs() <= ulp).all(), same
    # The MLP's tanh-GELU-and-multiply, likewise.
    gate, up = x, res
    want = F.gelu(gate, approximate="tanh") * up
    got = triton_ops.gelu_tanh_mul(gate, up)
    ulp = 2.0 ** -7 * (gate.float().abs() * up.float().abs() + want.float().abs())
    # Below a gate of about -2, 1 + tanh cancels in torch's float32 formula as in ours (16% of these gates are
    # under -4, where it keeps few bits): equal values are expected only above, a unit of the bound everywhere.
    kept = gate > -2
    assert (got == want)[kept].float().mean() > 0.99 and ((got.float() - want.float()).abs() <= ulp).all()
    # The logit soft-cap, likewise (its three roundings: the quotient, the tanh, the product).
    logits = (torch.randn(256, 4096, device="cuda", generator=g) * 40).bfloat16()
    want = torch.tanh(logits / 30.0) * 30.0
    got = triton_ops.softcap(logits, 30.0)
    assert (got == want).float().mean() > 0.99 and ((got.float() - want.float()).abs() <= 0.25).all()


@pytest.mark.parametrize("shape", ["qwen25", "gemma2"])
@torch.no_grad()
def test_triton_decode_attention_matches_torch(shape):
    """The fused decode attention in bf16 is at least as close to the fp32 result as the bf16 torch path it replaces
    (every column, masked by ``model.decode_bias``), with the splits the wrapper picks and with forced ones: Qwen2.5's 14/2 heads of 64, and Gemma 2's 8/4 heads
    of 256 with its soft-cap and a sliding window shorter than some rows."""
    from types import SimpleNamespace

    from verl.workers.rollout.native import triton_ops
    from verl.workers.rollout.native.model import _attend, decode_bias

    hkv, groups, head_dim, softcap, windows = {"qwen25": (2, 7, 64, None, [None]),
                                               "gemma2": (4, 2, 256, 50.0, [None, 300])}[shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    b, slots, max_len = 45, 48, 700
    q = torch.randn(b, hkv, groups, head_dim, device="cuda", generator=g).bfloat16()
    keys = torch.randn(slots, hkv, max_len, head_dim, device="cuda", generator=g).bfloat16()
    values = torch.randn_like(keys)
    start = torch.randint(0, 300, (b,), device="cuda", generator=g)
    write_pos = (start + torch.randint(0, 400, (b,), device="cuda", generator=g)).clamp(max=max_len - 1)
    scale = head_dim ** -0.5 * (4.0 if softcap else 1.0)  # scores near the cap
    w = SimpleNamespace(attn_softcap=softcap, attn_scale=scale)
    columns = torch.arange(max_len, device="cuda")
    for window in windows:
        bias = decode_bias(columns, start, write_pos, window, torch.float32)
        exact = _attend(w, q.float(), keys[:b].float(), values[:b].float(), bias)
        torch_err = (_attend(w, q, keys[:b], values[:b], bias.bfloat16()).float() - exact).abs().max().item()
        for splits in (None, 1, 5):
            got = triton_ops.decode_attention(q, keys, values, start, write_pos, window, scale, softcap, splits=splits)
            err = (got.float() - exact).abs().max().item()
            print(f"{shape} window {window} splits {splits}: max |diff| to fp32 {err:.2e} (torch bf16 {torch_err:.2e})")
            assert got.dtype == torch.bfloat16 and err <= max(torch_err, 1e-2), (window, splits, err, torch_err)


@pytest.mark.parametrize("shape", ["qwen25", "gemma2"])
@torch.no_grad()
def test_triton_decode_attention_shared_prompts_on_cuda(shape):
    """The shared-prompt decode attention in bf16, compiled (loops over loaded column bounds, up to 64 stacked query
    heads): 45 rows of 48 slots in groups of 5 and 11 (chunks of 8 and 3), one group cut by the batch (its leader
    and a member below it, a member past it), rows alone, and a row that is not running (zeroed state). Against
    the fp32 result from each row's intact copy, after every copy but each chunk's first was overwritten with
    noise, with NaN-filled partial buffers: as close as the bf16 torch path, with the splits the wrapper picks and
    forced ones; Gemma 2 with its soft-cap and a window that hides part of some prompts."""
    from types import SimpleNamespace

    import numpy as np

    from verl.workers.rollout.native import triton_ops
    from verl.workers.rollout.native.model import _attend, decode_bias
    from verl.workers.rollout.native.scheduler import shared_prefix_table

    hkv, groups, head_dim, softcap, windows = {"qwen25": (2, 7, 64, None, [None]),
                                               "gemma2": (4, 2, 256, 50.0, [None, 300])}[shape]
    chunk = triton_ops.shared_prefix_chunk(8, groups, head_dim)
    assert chunk == 8
    g = torch.Generator(device="cuda").manual_seed(1)
    b, slots, max_len, width = 45, 48, 700, 384
    slot_group = -1 - np.arange(slots)
    slot_group[:5] = 0
    slot_group[5:16] = 1
    slot_group[[20, 30, 44, 46]] = 2
    zeroed = 17
    q = torch.randn(b, hkv, groups, head_dim, device="cuda", generator=g).bfloat16()
    keys = torch.randn(slots, hkv, max_len, head_dim, device="cuda", generator=g).bfloat16()
    values = torch.randn_like(keys)
    group_start = torch.randint(0, 200, (slots,), device="cuda", generator=g)
    start = torch.stack([group_start[grp] if grp >= 0 else group_start[i] for i, grp in enumerate(slot_group)])
    write_pos = width + torch.randint(0, max_len - width, (slots,), device="cuda", generator=g)
    end = torch.full((slots,), width, device="cuda")
    start[zeroed] = write_pos[zeroed] = end[zeroed] = 0
    start, write_pos, end = start[:b], write_pos[:b], end[:b]
    table = shared_prefix_table(slot_group, chunk, triton_ops.SHARED_TABLE_WIDTH)
    assert sorted(len(t[t >= 0]) for t in table if t[0] >= 0 and len(t[t >= 0]) > 1) == [3, 4, 5, 8]
    for leader in np.flatnonzero(table[:, 0] >= 0):
        for member in table[leader][table[leader] >= 0]:
            keys[member, :, :width] = keys[leader, :, :width]
            values[member, :, :width] = values[leader, :, :width]
    scale = head_dim ** -0.5 * (4.0 if softcap else 1.0)
    w = SimpleNamespace(attn_softcap=softcap, attn_scale=scale)
    columns = torch.arange(max_len, device="cuda")
    wants = {}
    for window in windows:
        bias = decode_bias(columns, start, write_pos, window, torch.float32)
        exact = _attend(w, q.float(), keys[:b].float(), values[:b].float(), bias)
        torch_err = (_attend(w, q, keys[:b], values[:b], bias.bfloat16()).float() - exact).abs().max().item()
        wants[window] = exact, torch_err
    for leader in np.flatnonzero(table[:, 0] >= 0):
        for member in table[leader][table[leader] >= 0]:
            if member != leader:
                keys[member, :, :width] = torch.randn_like(keys[member, :, :width]) * 4
                values[member, :, :width] = torch.randn_like(values[member, :, :width]) * 4
    shared = (torch.from_numpy(table).cuda(), end, chunk)
    running = torch.arange(b, device="cuda") != zeroed
    empty, empty_like = torch.empty, torch.empty_like

    def nan_filled(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    try:  # a partial softmax or an output that no program writes stays NaN
        torch.empty = lambda *a, **k: nan_filled(empty(*a, **k))
        torch.empty_like = lambda *a, **k: nan_filled(empty_like(*a, **k))
        for window in windows:
            exact, torch_err = wants[window]
            for prefix_splits, splits in ((None, None), (1, 1), (3, 2)):
                got = triton_ops.decode_attention(q, keys, values, start, write_pos, window, scale, softcap,
                                                  splits=splits, shared=shared, prefix_splits=prefix_splits)
                err = (got.float() - exact)[running].abs().max().item()
                print(f"{shape} window {window} splits {prefix_splits}/{splits}: max |diff| {err:.2e} "
                      f"(torch {torch_err:.2e})")
                assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
                assert err <= max(torch_err, 1e-2), (window, splits, err, torch_err)
    finally:
        torch.empty, torch.empty_like = empty, empty_like


def reference_keep_from(logits, temperature, top_k, top_p):
    """The lowest raw logit that ``sampling.filter_logits`` (the torch path) keeps, per row."""
    raw = logits.float()
    kept = filter_logits(raw, raw / temperature, top_k, top_p) > float("-inf")
    return raw.masked_fill(~kept, float("inf")).min(dim=-1).values.to(logits.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@torch.no_grad()
def test_triton_sampler_matches_torch_filters(dtype):
    """The sort-free sampler keeps exactly the tokens the torch filters keep (ties included), draws with
    the filtered softmax's frequencies, returns the unfiltered log-softmax of the choice, and is keyed by
    its seed."""
    from verl.workers.rollout.native import triton_ops

    g = torch.Generator(device="cuda").manual_seed(0)
    V = 151936
    logits = torch.randn(48, V, device="cuda", generator=g) * 2
    logits[16:32] *= 6  # peaked rows: a few tokens hold most of the mass
    logits[32:40, :5000] = logits[32:40, :1].clone()  # a wide tie at a random height
    logits = logits.to(dtype)
    for top_k, top_p, temperature in [(50, 1.0, 1.0), (0, 0.9, 1.0), (50, 0.9, 0.7), (1, 1.0, 1.0), (0, 0.3, 1.3),
                                      (20000, 0.95, 1.0), (V + 5, 0.5, 1.0)]:
        tokens, log_probs, keep_from = triton_ops._sample(logits, temperature, top_k, top_p, 11)
        ref = reference_keep_from(logits, temperature, top_k, top_p)
        differ = keep_from != triton_ops.order_key(ref)
        if dtype == torch.bfloat16:  # bf16: seen identical on an H200
            assert not differ.any(), (top_k, top_p)
        else:  # fp32: the two sums of ~1e5 probabilities may round to different sides of top_p, rarely
            assert differ.sum() <= 2, (top_k, top_p, differ.sum())
            keys = triton_ops.order_key(logits)
            probs = filter_logits(logits.double(), logits.double() / temperature, top_k, 1.0).softmax(-1)
            ours = (probs * (keys >= keep_from[:, None])).sum(-1)
            theirs = (probs * (logits >= ref[:, None])).sum(-1)
            assert ((ours - theirs).abs() < 1e-5).all()
        assert (triton_ops.order_key(logits.gather(-1, tokens[:, None]).squeeze(-1)) >= keep_from).all()
        expected = torch.log_softmax(logits.float() / temperature, -1).gather(-1, tokens[:, None]).squeeze(-1)
        assert (log_probs - expected).abs().max() < 1e-4

    V, rows = 300, 16384
    small = (torch.randn(1, V, device="cuda", generator=g) * 2).to(dtype).expand(rows, V).contiguous()
    for top_k, top_p, temperature in [(0, 1.0, 0.8), (30, 1.0, 1.0), (0, 0.8, 1.2), (40, 0.7, 1.0)]:
        # several chunks per row, so the chunk choice and the walk inside a chunk are both exercised
        tokens, log_probs = triton_ops.sample(small, temperature, top_k, top_p, 1234, chunk=64, block=32)
        raw = small[:1].float()
        probs = filter_logits(raw, raw / temperature, top_k, top_p).softmax(-1)[0]
        freq = torch.bincount(tokens, minlength=V).float() / rows
        print(f"{dtype} top_k {top_k} top_p {top_p}: frequency |diff| max {(freq - probs).abs().max():.4f}")
        assert freq[probs == 0].sum() == 0
        assert (freq - probs).abs().max() < 0.015
    tokens, _ = triton_ops.sample(small, 1.0, 0, 0.9, 5)
    again, _ = triton_ops.sample(small, 1.0, 0, 0.9, 5)
    other, _ = triton_ops.sample(small, 1.0, 0, 0.9, 6)
    assert torch.equal(tokens, again) and not torch.equal(tokens, other)


@torch.no_grad()
def test_bf16_sampled_log_probs_match_recomputation():
    model = build(Qwen2Config(num_hidden_layers=4, **QWEN25), torch.bfloat16, std=0.05)
    batch = prompts(151936, [64, 20, 50, 64, 7, 33, 64, 45], do_sample=True, seed=3)
    out = NativeRollout(config(), model, None).generate_sequences(batch).batch
    again = NativeRollout(config(), model, None).generate_sequences(batch).batch
    diff = (out["rollout_log_probs"] - chosen(recomputed(model, out), out)).abs()
    print(f"bf16 sampled log-prob |diff| mean {diff.mean():.4f} max {diff.max():.4f}")
    assert torch.equal(out["responses"], again["responses"])
    assert diff.mean() < 0.05


@torch.no_grad()
def test_bf16_shared_prompts_with_refills_match_recomputation():
    """n=4 samples per prompt through 10 slots (refills, packing, eos stops): the decode attention reads each
    prompt once per chunk of its samples, and the sampled log-probs still match a full forward's."""
    model = build(Qwen2Config(num_hidden_layers=4, **QWEN25), torch.bfloat16, std=0.05)
    batch = prompts(151936, [64, 20, 50, 64, 7, 33, 64, 45], do_sample=True, seed=4)
    batch.meta_info.update(eos_token_id=list(range(1000, 4000)))  # 2% of the vocabulary: a third of rows stop early
    rollout = NativeRollout(config(n=4, max_num_seqs=10), model, None)
    out = rollout.generate_sequences(batch).batch
    assert rollout.last_stats["shared_prompt_chunk"] == 4 and rollout.last_stats["graph_captures"] >= 1
    mask = out["response_mask"].bool()
    assert mask.sum(dim=1).min() < 24 and mask.sum(dim=1).max() == 24  # some rows stopped early
    diff = (out["rollout_log_probs"] - chosen(recomputed(model, out), out)).abs()[mask]
    print(f"bf16 shared-prompt sampled log-prob |diff| mean {diff.mean():.4f} max {diff.max():.4f}")
    assert diff.mean() < 0.05


@pytest.mark.parametrize("arch", ["qwen2.5-4layers", "qwen3", "llama3"])
@torch.no_grad()
def test_fp32_graphs_exact(arch):
    if arch == "qwen2.5-4layers":
        model = build(Qwen2Config(num_hidden_layers=4, **QWEN25), torch.float32, std=0.05)
    elif arch == "qwen3":
        model = build(Qwen3Config(head_dim=32, **SMALL), torch.float32, std=0.1)
    else:
        model = build(LlamaConfig(rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
                                                   "rope_theta": 500000.0}, **SMALL), torch.float32, std=0.1)
    batch = prompts(model.config.vocab_size, [40, 17, 33, 5, 40, 28])
    rollout = NativeRollout(config(), model, None)
    out = rollout.generate_sequences(batch).batch
    assert rollout.last_stats["graph_captures"] >= 1
    expected = hf_greedy(model, batch, 24)
    assert torch.equal(out["responses"], expected)
    assert (out["rollout_log_probs"] - chosen(recomputed(model, out), out)).abs().max() < 1e-3


@torch.no_grad()
def test_fp32_continuous_batching_under_graphs():
    model = build(Qwen3Config(head_dim=32, **SMALL), torch.float32, std=0.1)
    lengths = [40, 17, 33, 5, 40, 28]
    batch = prompts(512, lengths)
    alone = []
    for i, n in enumerate(lengths):
        ids = batch.batch["input_ids"][i:i + 1, -n:]
        one = DataProto.from_dict({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                   "position_ids": torch.arange(n, device="cuda")[None]}, meta_info=batch.meta_info)
        alone.append(NativeRollout(config(), model, None).generate_sequences(one).batch["responses"][0])
    alone = torch.stack(alone)
    eos = int(alone[0, 3])
    batch.meta_info.update(eos_token_id=eos)
    rollout = NativeRollout(config(n=3, max_num_seqs=5), model, None)
    out = rollout.generate_sequences(batch).batch
    mask = out["response_mask"].bool()
    expected = alone.repeat_interleave(3, dim=0)
    assert torch.equal(out["responses"][mask], expected[mask])
    assert mask[0].sum() <= 4


@torch.no_grad()
def test_bf16_qwen25_close_to_generate():
    model = build(Qwen2Config(num_hidden_layers=4, **QWEN25), torch.bfloat16, std=0.05)
    batch = prompts(151936, [64, 20, 50, 64, 7, 33, 64, 45] * 2)
    eager = NativeRollout(config(enforce_eager=True), model, None).generate_sequences(batch).batch
    graphed = NativeRollout(config(), model, None).generate_sequences(batch).batch
    expected = hf_greedy(model, batch, 24)
    agree = (graphed["responses"] == expected).cumprod(dim=1).sum(dim=1).float()  # tokens before a divergence
    reference = recomputed(model, graphed)
    # bf16 rounds differently in our fused ops than in transformers', which flips near-ties: so each of
    # our greedy tokens must be a near-argmax of transformers' own forward over the same sequence.
    gap = reference.max(dim=-1).values - chosen(reference, graphed)
    diff = (graphed["rollout_log_probs"] - chosen(reference, graphed)).abs()
    print(f"bf16 greedy vs generate: rows identical {(agree == 24).float().mean():.2f}, mean matching prefix "
          f"{agree.mean():.1f}/24; gap to transformers' argmax: mean {gap.mean():.4f} max {gap.max():.4f}; "
          f"log-prob |diff| mean {diff.mean():.4f} max {diff.max():.4f}; "
          f"graph==eager {torch.equal(eager['responses'], graphed['responses'])}")
    assert torch.equal(eager["responses"], graphed["responses"])
    assert gap.max() < 0.15 and diff.mean() < 0.05


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_episodes_under_graphs_match_rounds_and_recomputation(dtype):
    """Multi-turn episodes with CUDA graphs: continuations prefilled on top of the cached context; fp32
    greedy equals the round-based default token for token, and the log-probs match transformers."""
    import concurrent.futures

    from verl.workers.rollout.base import BaseRollout

    model = build(Qwen2Config(num_hidden_layers=4, **QWEN25), dtype, std=0.05)
    stops = list(range(0, 151936, 4))  # 1 in 4 tokens ends a turn

    def on_turn(row, ids, log_probs, used):
        future = concurrent.futures.Future()
        future.set_result(list(range(100 + row, 100 + row + 5 + row % 7)) if used < 80 else None)
        return future

    greedy = dtype == torch.float32
    batch = prompts(151936, [64, 20, 50, 64, 7, 33, 64, 45], do_sample=not greedy, seed=3, eos_token_id=stops,
                    response_length=128)
    engine = NativeRollout(config(response_length=128), model, None)
    out = engine.generate_episodes(batch, on_turn)
    assert engine.last_stats["turns"] > 8 and engine.last_stats["extend_s"] > 0
    P = batch.batch["input_ids"].shape[1]
    valid = (torch.arange(128)[None] < out.lengths[:, None]).long().cuda()
    mask = torch.cat([batch.batch["attention_mask"], valid], 1)
    ids = torch.cat([batch.batch["input_ids"], out.responses.cuda()], 1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    log_probs = torch.log_softmax(logits[:, P - 1:-1].float(), -1).gather(-1, ids[:, P:, None]).squeeze(-1).cpu()
    generated = out.generated.bool()
    diff = (out.log_probs - log_probs)[generated].abs()
    print(f"{dtype} episodes: {engine.last_stats['turns']} turns, log-prob |diff| mean {diff.mean():.2e} "
          f"max {diff.max():.2e}")
    if greedy:
        assert diff.max() < 1e-3
        rounds = BaseRollout.generate_episodes(engine, batch, on_turn)
        assert torch.equal(rounds.responses, out.responses) and torch.equal(rounds.generated, out.generated)
    else:
        assert diff.mean() < 0.05


@torch.no_grad()
def test_episodes_with_more_rows_than_slots_under_graphs_equal_eager():
    """Rows wait for slots, so prefills (admissions) run between captured decode steps: the graphs must
    keep reading valid RoPE tables (a table freed by a prefill once corrupted them: NaN log-probs)."""
    import concurrent.futures

    model = build(Qwen2Config(num_hidden_layers=4, **QWEN25), torch.float32, std=0.05)
    stops = list(range(0, 151936, 4))

    def on_turn(row, ids, log_probs, used):
        future = concurrent.futures.Future()
        future.set_result([100 + row % 50, 7, 8] if used < 60 else None)
        return future

    lengths = [64, 20, 50, 64, 7, 33, 64, 45] * 4
    outs = []
    for eager in (True, False):
        batch = prompts(151936, lengths, do_sample=False, eos_token_id=stops, response_length=96)
        engine = NativeRollout(config(response_length=96, max_num_seqs=4, enforce_eager=eager), model, None)
        outs.append(engine.generate_episodes(batch, on_turn))
        assert engine.last_stats["slots"] == 4 and (eager or engine.last_stats["graph_captures"] > 0)
    assert torch.equal(outs[0].responses, outs[1].responses) and torch.equal(outs[0].generated, outs[1].generated)
    assert torch.isfinite(outs[1].log_probs).all()
    torch.testing.assert_close(outs[1].log_probs, outs[0].log_probs, atol=1e-4, rtol=0)
