"""Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE): the router's auxiliary loss and expert loads, and packed
forwards that equal padded ones (fp32 on CPU, 1e-5)."""

import math
from types import SimpleNamespace

import pytest
import torch

from tests.models.moe_models import FAMILIES, OTHER_FAMILIES, moe_config, ragged_batch, save_moe_model
from verl.models import forward_logprobs, load_causal_lm
from verl.models.logprob import forward_logprobs_and_routing
from verl.models.moe import ExpertLoad, RouterSpec, load_balance_metrics, router_load, router_spec
from verl.models.packed import register

# Two layers, three experts, top-2; tokens t1, t2 and a padding token t3. Logits are log-probabilities,
# so softmax gives back these rows exactly.
LAYER_1 = [[0.5, 0.3, 0.2], [0.1, 0.2, 0.7], [0.9, 0.06, 0.04]]
LAYER_2 = [[0.25, 0.15, 0.6], [0.6, 0.3, 0.1], [0.1, 0.15, 0.75]]


def _logits():
    return [torch.tensor(rows).log().requires_grad_() for rows in (LAYER_1, LAYER_2)]


def test_aux_loss_and_loads_by_hand():
    """Valid t1, t2 (n = 2, L = 2, so L n = 4). Top-2: layer 1 {0,1} {2,1}, layer 2 {2,0} {0,1}; loads
    [1,2,1] and [2,1,1], f = [3,3,2]/4. Probabilities summed: [0.6,0.5,0.9] + [0.85,0.45,0.7], P = [1.45,
    0.95,1.6]/4. aux = 3 (0.75·0.3625 + 0.75·0.2375 + 0.5·0.4) = 3 · 0.65 = 1.95."""
    logits = _logits()
    aux, loads = router_load(logits, num_experts=3, top_k=2, valid=torch.tensor([True, True, False]))
    assert aux.item() == pytest.approx(1.95, abs=1e-6)
    assert loads.tolist() == [[1.0, 2.0, 1.0], [2.0, 1.0, 1.0]]
    aux.backward()
    # d aux / d p_e = E f_e / (L n) = [0.5625, 0.5625, 0.375] for every valid token; through the softmax,
    # t1 of layer 1 (p = [0.5, 0.3, 0.2], p·g = 0.525): p (g - p·g) = [0.01875, 0.01125, -0.03].
    torch.testing.assert_close(logits[0].grad[0], torch.tensor([0.01875, 0.01125, -0.03]), atol=1e-6, rtol=0)
    assert (logits[0].grad[2] == 0).all() and (logits[1].grad[2] == 0).all()  # padding takes no gradient


def test_padding_counts_unless_masked():
    """All three tokens (L n = 6): layer 1 adds {0,1}, layer 2 adds {2,1}: loads [2,3,1], [2,2,2];
    f = [4,5,3]/6, P = [2.45,1.16,2.39]/6, aux = 3/36 (4·2.45 + 5·1.16 + 3·2.39) = 1.8975."""
    aux, loads = router_load(_logits(), num_experts=3, top_k=2)
    assert aux.item() == pytest.approx(1.8975, abs=1e-6)
    assert loads.tolist() == [[2.0, 3.0, 1.0], [2.0, 2.0, 2.0]]


def test_load_balance_metrics_by_hand():
    """Loads [2,3,1] and [2,2,2]: share x 3 - 1 is [0, 0.5, -0.5] and [0, 0, 0]."""
    metrics = load_balance_metrics(torch.tensor([[2.0, 3.0, 1.0], [2.0, 2.0, 2.0], [0.0, 0.0, 0.0]]))
    expected = {"max_vio/max": 0.5, "max_vio/avg": 0.25, "min_vio/max": 0.0, "min_vio/avg": -0.25,
                "avg_vio/max": 1 / 3, "avg_vio/avg": 1 / 6}  # the empty third layer is left out
    assert metrics == pytest.approx({f"actor/moe/{k}": v for k, v in expected.items()})
    load = ExpertLoad()
    load.add(torch.tensor([[2.0, 1.0, 1.0], [1.0, 1.0, 1.0]]))
    load.add(torch.tensor([[0.0, 2.0, 0.0], [1.0, 1.0, 1.0]]))  # summed over forwards: the loads above
    assert load.metrics() == metrics


def test_router_spec_reads_the_hf_keys():
    plain = router_spec(SimpleNamespace(config=moe_config("qwen3_moe")))
    assert plain == RouterSpec(num_experts=4, top_k=2, aux_loss_coef=0.001, add_aux_loss=False)
    asked = router_spec(SimpleNamespace(config=moe_config("qwen2_moe", output_router_logits=True,
                                                          router_aux_loss_coef=0.02)))
    assert asked.add_aux_loss and asked.aux_loss_coef == 0.02
    from transformers import DeepseekV3Config, Qwen2Config

    assert router_spec(SimpleNamespace(config=Qwen2Config())) is None
    assert router_spec(SimpleNamespace(config=DeepseekV3Config())) is None  # trains, without router figures
    with pytest.raises(ValueError, match="output_router_logits=true.*not 'deepseek_v3'"):
        router_spec(SimpleNamespace(config=DeepseekV3Config(output_router_logits=True)))


def _model(family, **overrides):
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    config = moe_config(family, **overrides)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=register())


@pytest.mark.parametrize("family", FAMILIES + OTHER_FAMILIES)
def test_aux_loss_matches_transformers_padded_and_packed(family):
    """transformers' own aux_loss (attention mask given), and its gradient, for our padded and packed forwards;
    packed log-probs equal padded ones."""
    model = _model(family, output_router_logits=True)
    input_ids, mask, positions, response = ragged_batch(model.config.vocab_size)
    output = model(input_ids=input_ids, attention_mask=mask, position_ids=positions)
    output.aux_loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    spec = router_spec(model)
    loads, log_probs = [], []
    for remove_padding in (False, True):
        model.zero_grad()
        lp, _, aux, load = forward_logprobs_and_routing(model, input_ids, mask, positions, response, spec,
                                                        remove_padding=remove_padding)
        log_probs.append(lp.detach())
        assert aux.item() == pytest.approx(output.aux_loss.item(), abs=1e-6)
        aux.backward()
        got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert got.keys() == expected.keys()  # the routers (and what feeds them), not the experts
        for name, grad in expected.items():
            torch.testing.assert_close(got[name], grad, atol=1e-6, rtol=1e-5, msg=name)
        loads.append(load)
    assert torch.equal(loads[0], loads[1])
    valid = mask[:, -response:].bool()
    torch.testing.assert_close(log_probs[1][valid], log_probs[0][valid], atol=1e-5, rtol=0)
    assert loads[0].sum().item() == int(mask.sum()) * 2 * 2  # every valid token, 2 layers, top-2


@pytest.mark.parametrize("family,checkpointing", [("qwen3_moe", False), ("qwen2_moe", False), ("qwen3_moe", True)])
def test_packed_logprobs_and_gradients_equal_padded(family, checkpointing):
    """Log-probs, entropy and every gradient (the 3-D expert weights, the router, Qwen2-MoE's shared expert and its
    sigmoid gate) of a packed forward equal the padded forward's, with the aux loss in the loss."""
    model = _model(family, output_router_logits=True)
    if checkpointing:
        from verl.models.loader import enable_gradient_checkpointing

        enable_gradient_checkpointing(model)
    model.train()
    input_ids, mask, positions, response = ragged_batch(model.config.vocab_size)
    valid = mask[:, -response:].bool()
    weights = torch.randn(valid.shape, generator=torch.Generator().manual_seed(1))
    spec = router_spec(model)
    results = []
    for remove_padding in (False, True):
        model.zero_grad()
        lp, ent, aux, _ = forward_logprobs_and_routing(model, input_ids, mask, positions, response, spec,
                                                       remove_padding=remove_padding)
        ((lp * weights * valid).sum() + 0.3 * (ent * valid).sum() + 0.5 * aux).backward()
        results.append((lp, ent, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp_pad, ent_pad, grads_pad), (lp_packed, ent_packed, grads_packed) = results
    torch.testing.assert_close(lp_packed[valid], lp_pad[valid], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_packed[valid], ent_pad[valid], atol=1e-5, rtol=0)
    experts = [n for n, p in model.named_parameters() if p.dim() == 3]
    assert experts and all(grads_pad[n].abs().sum() > 0 for n in experts)
    if family == "qwen2_moe":
        assert grads_pad["model.layers.0.mlp.shared_expert_gate.weight"].abs().sum() > 0
    for name, grad in grads_pad.items():
        torch.testing.assert_close(grads_packed[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    # The plain log-prob path gives the same numbers (it records no router logits).
    with torch.no_grad():
        lp_plain, _ = forward_logprobs(model, input_ids, mask, positions, response, remove_padding=True)
    torch.testing.assert_close(lp_plain[valid], lp_packed[valid], atol=1e-6, rtol=0)


def test_loading_checks_packing_and_applies_the_router_overrides(tmp_path):
    path = save_moe_model(tmp_path / "qwen3_moe", "qwen3_moe")
    model = load_causal_lm(path, remove_padding=True,
                           override_config={"output_router_logits": True, "router_aux_loss_coef": 0.05})
    assert router_spec(model) == RouterSpec(num_experts=4, top_k=2, aux_loss_coef=0.05, add_aux_loss=True)
    # The request lives on the model: transformers' own forwards (generate) no longer compute the loss.
    assert model.config.output_router_logits is False
    with torch.no_grad():
        model.generate(torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
                       max_new_tokens=2, do_sample=False, pad_token_id=0)
    sliding = save_moe_model(tmp_path / "sliding", "qwen3_moe", use_sliding_window=True)
    with pytest.raises(ValueError, match="sliding-window.*use_remove_padding=false"):
        load_causal_lm(sliding, remove_padding=True)
    assert math.isfinite(router_load([], 4, 2)[0].item())  # no MoE layer (e.g. all in mlp_only_layers): aux 0


@pytest.mark.filterwarnings("ignore:The following (rank|alpha)_pattern keys did not match")  # peft's own patterns
def test_lora_on_expert_weights_is_refused_early():
    """peft's 'all-linear' also wraps Qwen3-MoE's 3-D experts and router, which generation cannot merge: refused
    when the adapter is injected (the driver's preflight builds this meta model), attention adapters accepted."""
    from verl.models.lora import LoraSettings, meta_model_with_adapter

    with pytest.raises(ValueError, match=r"target_modules='all-linear'.*mlp\.experts.*target_modules=\[q_proj"):
        meta_model_with_adapter(moe_config("qwen3_moe"), LoraSettings(rank=4, target_modules="all-linear"))
    model = meta_model_with_adapter(moe_config("qwen3_moe"), LoraSettings(rank=4, target_modules=["q_proj", "v_proj"]))
    assert all(p.dim() == 2 for n, p in model.named_parameters() if p.requires_grad)
