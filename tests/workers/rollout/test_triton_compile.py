"""Every Triton kernel of the native engine compiles for the H100/H200 (sm_90) on a machine without a GPU
(Triton's wheel carries ptxas): catches what the interpreter does not check (types, layouts, lowering)."""

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (make test installs it on Linux x86-64)")

SAMPLER_ARGS = {"x_ptr": None, "stride": "i32", "stats_ptr": "*fp32", "bkeys_ptr": "*i64", "hist_ptr": "*fp32",
                "stf_ptr": "*fp32", "sti_ptr": "*i64", "above_ptr": "*fp32", "tok_ptr": "*i64", "lp_ptr": "*fp32",
                "kf_ptr": "*i64", "temperature": "fp32", "top_k": "i32", "top_p": "fp32", "step": "i32",
                "shift": "i32", "seed": "i32", "last": "i32", "B": "i32", "V": "i32", "NC": "i32"}


def signature(fn, pointer, constexprs):
    names = fn.arg_names
    return {n: "constexpr" if n in constexprs else (pointer if n == "x_ptr" else SAMPLER_ARGS[n]) for n in names}


def compile_for_sm90(fn, sig, constexprs):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    out = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 4})
    assert len(out.asm["cubin"]) > 0


@pytest.mark.parametrize("pointer,key_bits", [("*bf16", 16), ("*fp16", 16), ("*fp32", 32)])
def test_sampler_kernels_compile(pointer, key_bits, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    from verl.workers.rollout.native import triton_kernels as K

    shapes = {"KB": key_bits, "C": 8192, "BLOCK": 1024}
    const = {**shapes, "BLOCK_KEYS": True}
    compile_for_sm90(K.sample_stats_kernel, signature(K.sample_stats_kernel, pointer, const), const)
    for prev, mode in [(0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]:
        const = {**shapes, "DB": 2, "PREV_MODE": prev, "MODE": mode, "NCP": 32, "NBLKP": 256}
        compile_for_sm90(K.sample_digit_kernel, signature(K.sample_digit_kernel, pointer, const), const)
    for prev in (0, 1, 2):
        const = {**shapes, "DB": 2, "PREV_MODE": prev, "NCP": 32}
        compile_for_sm90(K.sample_final_kernel, signature(K.sample_final_kernel, pointer, const), const)


def test_decode_kernels_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    from verl.workers.rollout.native import triton_kernels as K

    compile_for_sm90(K.silu_mul_kernel, {"g_ptr": "*bf16", "u_ptr": "*bf16", "o_ptr": "*bf16", "n": "i32",
                                         "BLOCK": "constexpr"}, {"BLOCK": 2048})
    sig = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "cos_ptr", "sin_ptr", "qo_ptr", "kc_ptr", "vc_ptr")}
    sig.update({"pos_ptr": "*i64", "wpos_ptr": "*i64", "slot_ptr": "*i64", "max_len": "i32"})
    const = {"H": 14, "HKV": 2, "D": 64, "BH": 16, "BKV": 2}
    sig.update({n: "constexpr" for n in const})
    compile_for_sm90(K.rope_kv_kernel, {n: sig[n] for n in K.rope_kv_kernel.arg_names}, const)
