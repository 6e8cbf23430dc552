"""Checks of the fused decode attention kernel (``triton_ops.decode_attention``) on a CPU through Triton's
interpreter (``TRITON_INTERPRET=1``, set before Triton is imported), against the engine's torch attention
(``model._attend`` with ``model.decode_bias``, the mask of ``model.decode``'s torch path). Run as a script by
``test_triton_attention_interpreter.py``; exits non-zero on the first failed check.

Rows with different starts and write positions (one row sees a single column), kv heads shared by groups of
query heads, a sliding window shorter and longer than a row, Gemma's soft-cap, and one to several splits of a
row's columns (a split may see no column). Float32 only: the interpreter multiplies bf16 tiles as raw integers;
the GPU tests run the bf16 kernel. Also Gemma's RMSNorm, tanh-GELU-and-multiply and logit soft-cap kernels
(``triton_ops.scaled_rms_norm``, ``gelu_tanh_mul``, ``softcap``), float32 and bf16 (elementwise: no tile
product), against the torch ops they replace."""

import contextlib
import os
import sys
from unittest import mock

import numpy as np
from types import SimpleNamespace

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from verl.workers.rollout.native import triton_ops  # noqa: E402
from verl.workers.rollout.native.model import _attend, decode_bias  # noqa: E402


def reference(q, keys, values, start, write_pos, window, scale, softcap):
    """The torch path of ``model.decode``: every column of the slots, masked to the visible ones."""
    bias = decode_bias(torch.arange(keys.shape[2]), start, write_pos, window, q.dtype)
    return _attend(SimpleNamespace(attn_softcap=softcap, attn_scale=scale), q, keys[:q.shape[0]],
                   values[:q.shape[0]], bias)


def check(dtype, groups, head_dim, window, softcap, splits, tol):
    g = torch.Generator().manual_seed(groups * 100 + head_dim + (window or 0) + splits)
    b, hkv, max_len = 3, 2, 150
    q = torch.randn(b, hkv, groups, head_dim, generator=g).to(dtype)
    keys = torch.randn(b + 1, hkv, max_len, head_dim, generator=g).to(dtype)  # one slot more than rows
    values = torch.randn(b + 1, hkv, max_len, head_dim, generator=g).to(dtype)
    start = torch.tensor([0, 37, 90])
    write_pos = torch.tensor([149, 120, 90])  # the last row sees one column
    scale = head_dim ** -0.5 * 3.0  # large scores, so the soft-cap bites
    got = triton_ops.decode_attention(q, keys, values, start, write_pos, window, scale, softcap, splits=splits)
    want = reference(q, keys, values, start, write_pos, window, scale, softcap)
    assert got.shape == want.shape and got.dtype == dtype, (got.shape, got.dtype)
    err = (got.float() - want.float()).abs().max().item()
    assert err <= tol, (dtype, groups, head_dim, window, softcap, splits, err)
    if softcap is not None:  # the cap changes the result: the check would see a kernel that skipped it
        plain = reference(q, keys, values, start, write_pos, window, scale, None)
        assert (plain.float() - want.float()).abs().max().item() > 10 * tol


@contextlib.contextmanager
def nan_filled_buffers():
    """``torch.empty``/``empty_like`` return floating tensors full of NaN (on a CPU they are often zeros, and a
    partial softmax left at zeros only rescales the combined sums together: a missed write would go unseen)."""
    def filled(make):
        def wrapper(*args, **kwargs):
            t = make(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t
        return wrapper

    with mock.patch.object(torch, "empty", filled(torch.empty)), \
            mock.patch.object(torch, "empty_like", filled(torch.empty_like)):
        yield


def check_shared(groups, head_dim, window, softcap, chunk, prefix_splits, splits):
    """Rows that share a prompt read it once per chunk: the keys and values of a row's shared columns come from
    its chunk's first slot only. The other members' copies are overwritten with noise after the reference is
    computed from the intact cache, so a kernel that read them would be far off. Rows: a prompt of 5 samples
    (chunks of ``chunk``), one of 2 whose second row is past the batch (a finished slot), a lone row, and a row
    that is not running (zeroed state: start and write position 0); windows that cut into the prompt of some rows."""
    from verl.workers.rollout.native.scheduler import shared_prefix_table

    g = torch.Generator().manual_seed(groups * 10 + head_dim + chunk + (window or 0))
    hkv, max_len, width, b = 2, 160, 70, 9
    slot_group = np.array([4, 4, 4, 1, 4, 4, 9, -8, 1, -10])  # slot 9 (of group 1) is past the batch
    start = torch.tensor([12, 12, 12, 30, 12, 12, 0, 0, 30, 30])
    write_pos = torch.tensor([70, 95, 159, 71, 70, 120, 100, 0, 80, 77])
    end = torch.tensor([width] * 7 + [0, width, width])
    q = torch.randn(b, hkv, groups, head_dim, generator=g)
    keys = torch.randn(len(slot_group), hkv, max_len, head_dim, generator=g)
    values = torch.randn(len(slot_group), hkv, max_len, head_dim, generator=g)
    table = shared_prefix_table(slot_group, chunk, triton_ops.SHARED_TABLE_WIDTH)
    leader_of = {}
    for leader in np.flatnonzero(table[:, 0] >= 0):
        for member in table[leader][table[leader] >= 0]:
            leader_of[int(member)] = int(leader)
    for member, leader in leader_of.items():  # identical prompt copies, as a prefill writes them
        keys[member, :, :width] = keys[leader, :, :width]
        values[member, :, :width] = values[leader, :, :width]
    scale = head_dim ** -0.5 * 3.0
    want = reference(q, keys, values, start[:b], write_pos[:b], window, scale, softcap)
    for member, leader in leader_of.items():
        if member != leader:
            keys[member, :, :width] = torch.randn(hkv, width, head_dim, generator=g) * 5
            values[member, :, :width] = torch.randn(hkv, width, head_dim, generator=g) * 5
    shared = (torch.from_numpy(table), end[:b], chunk)
    with nan_filled_buffers():  # a partial softmax or an output that no program writes stays NaN
        got = triton_ops.decode_attention(q, keys, values, start[:b], write_pos[:b], window, scale, softcap,
                                          splits=splits, shared=shared, prefix_splits=prefix_splits)
    running = torch.tensor([True] * 7 + [False, True])  # row 7 is not running: its output is not used
    err = (got[running] - want[running]).abs().max().item()
    assert torch.isfinite(got).all() and err <= 1e-5, (groups, head_dim, window, softcap, chunk, err)
    unshared = triton_ops.decode_attention(q, keys, values, start[:b], write_pos[:b], window, scale, softcap,
                                           splits=splits)
    assert (unshared[running] - want[running]).abs().max() > 0.1  # each row reading its own (noisy) copy is wrong


def check_norm(dtype, h, residual):
    """Gemma's RMSNorm kernel against the torch path of ``model._norm`` (float32 norm, rounded, then the add)."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(h)
    x = (torch.randn(5, 3, h, generator=g) * 4).to(dtype)
    scale = 1.0 + torch.randn(h, generator=g) * 0.3
    res = (torch.randn(5, 3, h, generator=g) * 4).to(dtype) if residual else None
    got = triton_ops.scaled_rms_norm(x, scale, 1e-6, res)
    norm = F.rms_norm(x.float(), (h,), scale, 1e-6).to(dtype)
    want = res + norm if residual else norm
    assert got.shape == want.shape and got.dtype == dtype, (got.shape, got.dtype)
    # float32: to rounding. bf16: the interpreter's casts to bf16 do not round to nearest as the GPU's do, so only
    # within a unit in the last place of each rounding (of the norm, and of the sum): 2^-7 of the magnitudes.
    terms = norm.float().abs() + (res.float().abs() + (res + norm).float().abs() if residual else 0)
    tol = 1e-5 * terms + 1e-6 if dtype == torch.float32 else 2.0 ** -7 * terms
    err = (got.float() - want.float()).abs()
    assert (err <= tol).all(), (dtype, h, residual, err.max().item())
    plain = F.rms_norm(x.float(), (h,), torch.ones(h), 1e-6).to(dtype)  # without the scale: far off
    assert (plain.float() - norm.float()).abs().max() > 0.1


def check_gelu(dtype):
    """Gemma's tanh-GELU-and-multiply kernel against ``F.gelu(gate, approximate="tanh") * up``."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(3)
    gate, up = ((torch.randn(7, 333, generator=g) * 3).to(dtype) for _ in range(2))
    got = triton_ops.gelu_tanh_mul(gate, up)
    act = F.gelu(gate, approximate="tanh")
    want = act * up
    exact = F.gelu(gate, approximate="none") * up  # the erf GELU differs: the check would see the wrong formula
    assert got.shape == want.shape and got.dtype == dtype
    # float32: the kernel's tanh is a few units in the last place from torch's, which 0.5 x (1 + tanh) scales
    # by |x|; bf16: a unit in the last place of each rounding.
    terms = gate.float().abs() * up.float().abs() + want.float().abs()
    tol = 1e-5 * terms + 1e-6 if dtype == torch.float32 else 2.0 ** -7 * terms
    err = (got.float() - want.float()).abs()
    assert (err <= tol).all(), (dtype, err.max().item())
    assert (exact.float() - want.float()).abs().max() > 1e-4


def check_tanh():
    """The kernels' float32 tanh (through ``softcap`` with a cap of 1) within 4 units in the last place of the
    true value's float32, from 1e-6 to saturation and for both signs, densely around the switch from the series
    to the exponential: no cancellation near 0 or near +-1."""
    mag = torch.cat([torch.logspace(-6, 1.3, 4001, dtype=torch.float64),
                     torch.linspace(0.2, 1.0, 40001, dtype=torch.float64)])
    x = torch.cat([mag, -mag, torch.zeros(1, dtype=torch.float64)]).float()
    got = triton_ops.softcap(x, 1.0).double()
    want = torch.tanh(x.double())
    nearest = want.float()
    ulp = (torch.nextafter(nearest.abs(), torch.tensor(float("inf"))) - nearest.abs()).double()
    err = (got - want).abs() / ulp
    assert (err <= 4).all() and got[-1] == 0, err.max().item()


def check_softcap(dtype):
    """Gemma's logit soft-cap kernel against ``torch.tanh(x / cap) * cap``."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(5, 1000, generator=g) * 40).to(dtype)
    got = triton_ops.softcap(x, 30.0)
    want = torch.tanh(x / 30.0) * 30.0
    assert got.shape == want.shape and got.dtype == dtype
    tol = 1e-5 * 30.0 if dtype == torch.float32 else 2.0 ** -7 * 3 * 30.0 * want.float().abs().clamp(min=1.0) / 30.0
    err = (got.float() - want.float()).abs()
    assert (err <= tol).all(), (dtype, err.max().item())
    assert want.float().abs().max() <= 30.0 and (x.float().abs() - want.float().abs()).max() > 1.0  # the cap bites


def main():
    check_tanh()
    for dtype in (torch.float32, torch.bfloat16):
        check_gelu(dtype)
        check_softcap(dtype)
    for dtype, h, residual in ((torch.float32, 48, False), (torch.float32, 2304, True), (torch.bfloat16, 2304, True),
                               (torch.bfloat16, 100, False)):
        check_norm(dtype, h, residual)
    print("norm, gelu, softcap: ok")
    cases = [
        # dtype, groups, head_dim, window, softcap, splits, tolerance
        (torch.float32, 2, 32, None, None, 1, 1e-5),
        (torch.float32, 7, 16, None, None, 3, 1e-5),  # Qwen's 14/2 heads; three splits
        (torch.float32, 2, 32, 40, 5.0, 4, 1e-5),  # Gemma: windowed and capped; most splits of a window empty
        (torch.float32, 1, 64, 200, 5.0, 2, 1e-5),  # a window longer than every row
        (torch.float32, 4, 32, None, 5.0, 2, 1e-5),
    ]
    for case in cases:
        check(*case)
        print(f"{case}: ok")
    shared_cases = [
        # groups, head_dim, window, softcap, chunk, prefix splits, splits
        (2, 32, None, None, 2, 1, 1),
        (7, 16, None, None, 8, 2, 3),  # Qwen's 14/2 heads: 56 stacked query rows; the prompt cut in two
        (2, 32, 60, 5.0, 3, 3, 2),  # Gemma: windowed (some rows see part of their prompt, one none) and capped
    ]
    for case in shared_cases:
        check_shared(*case)
        print(f"shared {case}: ok")


if __name__ == "__main__":
    sys.exit(main())
