"""The memory estimate (verl.trainer.plan): components worked out by hand, the checkpointing choice, the CLI."""

import pytest

from verl.trainer import plan as plan_module
from verl.trainer.config.spec import resolve_run
from verl.trainer.config_validation import compose_ppo_config
from verl.trainer.plan import GIB, ModelShape, plan_memory

# 1000 parameters, 4 layers of 100 (600 outside them), hidden 8, MLP 16, kv 4, vocab 50.
SHAPE = ModelShape(params=1000, layer_params=100, layers=4, hidden=8, intermediate=16, kv_dim=4, vocab=50)


def config(*overrides, path="/unused"):
    return compose_ppo_config([
        f"actor_rollout_ref.model.path={path}", "trainer.n_gpus_per_node=2", "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "data.max_prompt_length=24", "data.max_response_length=8", "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64", "trainer.device=cpu", *overrides])


def test_actor_components_by_hand():
    plan = plan_memory(config("actor_rollout_ref.model.enable_gradient_checkpointing=true"), None,
                       shapes={"actor": SHAPE})
    actor = plan.components["actor"]
    assert actor["weights (sharded master)"] == 1000 * 4 // 2
    assert actor["gradients (sharded)"] == 2000
    assert actor["optimizer (AdamW moments)"] == 1000 * 8 // 2
    assert actor["unsharded bf16 (root + 2 layers)"] == 2 * (600 + 2 * 100)
    # 64 tokens x (4 layer inputs x 2h bytes + 3 MLP intermediates x 2 bytes) = 64 x (64 + 96)
    assert actor["activations (64 tokens, ckpt)"] == 10240
    assert actor["log-prob chunk logits + grad"] == 64 * 50 * 2 * 2
    # One layer's gradients in bf16 (2 bytes), their fp32 reduce-scatter input (4) and its shard on 2 GPUs (4 / 2).
    assert actor["gradient reduction (one layer)"] == 100 * 2 + 100 * 4 + 100 * 4 // 2
    bf16_reduce = plan_memory(config("actor_rollout_ref.model.enable_gradient_checkpointing=true",
                                     "actor_rollout_ref.actor.fsdp_config.mixed_precision={reduce_dtype:bfloat16}"),
                              None, shapes={"actor": SHAPE})
    assert bf16_reduce.components["actor"]["gradient reduction (one layer)"] == 100 * 2 + 100 * 2 + 100 * 2 // 2
    # Without checkpointing each layer keeps 2 x (13h + 4kv + 4I) = 2 x (104 + 16 + 64) bytes per token.
    plan = plan_memory(config("actor_rollout_ref.model.enable_gradient_checkpointing=false"), None,
                       shapes={"actor": SHAPE})
    assert plan.components["actor"]["activations (64 tokens, no ckpt)"] == 64 * 4 * 2 * 184
    # Compiled layers on CUDA (use_torch_compile, the default there): 2 x (7h + 4kv + 3I) = 2 x (56 + 16 + 48).
    plan = plan_memory(config("actor_rollout_ref.model.enable_gradient_checkpointing=false", "trainer.device=cuda"),
                       None, shapes={"actor": SHAPE})
    assert plan.components["actor"]["activations (64 tokens, no ckpt, compiled)"] == 64 * 4 * 2 * 120
    # Rows instead of tokens: micro-batch 3 rows of up to 24 + 8 tokens.
    plan = plan_memory(config("actor_rollout_ref.model.enable_gradient_checkpointing=true",
                              "actor_rollout_ref.actor.use_dynamic_bsz=false",
                              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"), None, shapes={"actor": SHAPE})
    assert "activations (96 tokens, ckpt)" in plan.components["actor"]
    # A mini-batch smaller than the token budget is one micro-batch: 8 rows per GPU x 32 tokens = 256 < 1000.
    plan = plan_memory(config("actor_rollout_ref.model.enable_gradient_checkpointing=true",
                              "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1000"), None, shapes={"actor": SHAPE})
    assert "activations (256 tokens, ckpt)" in plan.components["actor"]


def test_phases_reference_rollout_and_fit():
    overrides = ("actor_rollout_ref.model.enable_gradient_checkpointing=true",
                 "actor_rollout_ref.actor.use_kl_loss=true")
    plan = plan_memory(config(*overrides), None, shapes={"actor": SHAPE})
    resident = 2000 + 4000 + 2 * 1000 // 2  # actor master + moments, reference bf16 weights
    # 8 rows per GPU (8 prompts x 2 / 2 GPUs): 8 slots x 2 (k, v) x 4 layers x kv 4 x 32 tokens x 2 bytes
    rollout = plan.components["rollout"]
    assert rollout["KV cache (8 sequences x 32 tokens)"] == 8 * 2 * 4 * 4 * 32 * 2
    assert plan.phases["generation"] == resident + 2 * 1000 + 8 * 2 * 4 * 4 * 32 * 2 + 4 * 8 * 50 * 4
    assert plan.phases["actor update"] == resident - 6000 + sum(plan.components["actor"].values())
    assert plan.fits is None and plan.peak == max(plan.phases.values())
    small = plan_memory(config(*overrides), plan.peak - 1, shapes={"actor": SHAPE})
    assert small.fits is False and any("optimizer_offload" in a for a in small.advice)
    assert plan_memory(config(*overrides), plan.peak, shapes={"actor": SHAPE}).fits is True


def test_a_rollout_that_decodes_during_the_update_stays_resident_in_every_phase():
    overrides = ("actor_rollout_ref.model.enable_gradient_checkpointing=true", "actor_rollout_ref.actor.use_kl_loss=true",
                 "trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.overlap_generation=true")
    plan = plan_memory(config(*overrides), None, shapes={"actor": SHAPE})
    # its own bf16 copy (2 x 1000), the KV cache as above, the sampling logits: 4 x 8 rows x vocab 50 x 4 bytes
    rollout = 2 * 1000 + 8 * 2 * 4 * 4 * 32 * 2 + 4 * 8 * 50 * 4
    assert plan.components["rollout"]["weights (bf16, own copy)"] == 2000
    resident = 2000 + 4000 + 2 * 1000 // 2 + rollout  # actor master + moments, reference weights, the rollout
    assert plan.phases["generation"] == resident
    assert plan.phases["actor update"] == resident - 6000 + sum(plan.components["actor"].values())
    alternating = plan_memory(config(*overrides[:2], "trainer.v1.trainer_mode=colocate_async"), None,
                              shapes={"actor": SHAPE})
    assert alternating.phases["generation"] == plan.phases["generation"]  # generation alone: the same bytes
    assert plan.phases["actor update"] - alternating.phases["actor update"] == rollout


def test_critic_reads_its_own_fsdp_keys_and_a_full_device_leaves_no_cache():
    base = ("algorithm.adv_estimator=gae", "actor_rollout_ref.model.enable_gradient_checkpointing=true",
            "critic.model.enable_gradient_checkpointing=true")
    plan = plan_memory(config(*base), None, shapes={"actor": SHAPE, "critic": SHAPE})
    assert plan.components["critic"]["optimizer (AdamW moments)"] == 4000
    assert "log-prob chunk logits + grad" not in plan.components["critic"]
    plan = plan_memory(config(*base, "critic.model.fsdp_config.optimizer_offload=true"), 100,
                       shapes={"actor": SHAPE, "critic": SHAPE})
    assert plan.components["critic"]["optimizer (AdamW moments)"] == 0
    assert plan.components["rollout"]["KV cache (8 sequences x 32 tokens)"] == 0  # resident > device: no room
    assert "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true" in plan.advice


def test_unset_checkpointing_is_chosen_by_the_estimate(monkeypatch, tiny_qwen2_dir):
    messages = []
    cfg = config(path=tiny_qwen2_dir)
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is None  # the default: unset
    monkeypatch.setattr(plan_module, "device_memory", lambda _: None)
    spec = resolve_run(cfg, log=messages.append)
    assert spec.actor_rollout_ref.model.enable_gradient_checkpointing is True and "no GPU" in messages[0]
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is None  # the config is left as written
    for device, expected in ((80 * GIB, False), (1024, True)):
        monkeypatch.setattr(plan_module, "device_memory", lambda _, device=device: device)
        spec = resolve_run(config(path=tiny_qwen2_dir), log=messages.append)
        assert spec.actor_rollout_ref.model.enable_gradient_checkpointing is expected
    cfg = config("actor_rollout_ref.model.enable_gradient_checkpointing=false", path=tiny_qwen2_dir)
    monkeypatch.setattr(plan_module, "device_memory", lambda _: 1024)
    spec = resolve_run(cfg, log=messages.append)  # set by the user: left alone
    assert spec.actor_rollout_ref.model.enable_gradient_checkpointing is False


def test_cli_reads_the_model_folder(tiny_qwen2_dir, capsys):
    assert plan_module.main([f"actor_rollout_ref.model.path={tiny_qwen2_dir}", "trainer.n_gpus_per_node=1",
                             "trainer.device=cpu"]) == 0
    out = capsys.readouterr().out
    assert "actor update" in out and "critic" in out  # gae by default: a critic
    assert plan_module.main(["actor_rollout_ref.model.path=/no/such/model"]) == 2
    assert "no such folder" in capsys.readouterr().err


@pytest.mark.parametrize("params", [494_032_768])
def test_shape_of_a_real_architecture_on_the_meta_device(tmp_path, params):
    from transformers import Qwen2Config

    Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True).save_pretrained(tmp_path)
    shape = plan_module.model_shape(str(tmp_path), config_key="actor_rollout_ref.model.path")
    assert shape.params == params  # Qwen2.5-0.5B's published count
    assert (shape.layers, shape.kv_dim, shape.root_params) == (24, 128, 151936 * 896 + 896)


# Mixtral gives an expert's width as intermediate_size.
@pytest.mark.parametrize("family,intermediate", [("qwen3_moe", 2 * 16), ("qwen2_moe", 2 * 16 + 24),
                                                 ("mixtral", 2 * 16)])
def test_mixture_of_experts_counts_the_chosen_experts_and_their_dispatch(tmp_path, family, intermediate):
    """A mixture of experts' MLP width is its top-k experts' (2 x 16) plus a shared expert's (Qwen2-MoE: 24), and
    each token's copies sent to its k experts and their outputs are kept: 2 x 2 x k x h bytes per token."""
    from tests.models.moe_models import save_moe_model

    shape = plan_module.model_shape(save_moe_model(tmp_path / family, family),
                                    config_key="actor_rollout_ref.model.path")
    assert (shape.routed, shape.intermediate, shape.hidden, shape.layers) == (2, intermediate, 32, 2)
    moe = ModelShape(params=1000, layer_params=100, layers=4, hidden=8, intermediate=12, kv_dim=4, vocab=50, routed=2)
    # checkpointed: 64 tokens x (4 layer inputs x 2h + one layer's 2 x (3I + 2kh)) = 64 x (64 + 2 x (36 + 32))
    assert moe.activation_bytes(64, checkpointing=True) == 64 * (64 + 136)
    # kept per layer: 2 x (13h + 4kv + 4I + 2kh) = 2 x (104 + 16 + 48 + 32)
    assert moe.activation_bytes(64, checkpointing=False) == 64 * 4 * 2 * 200
    assert moe.forward_bytes(64) == 64 * 2 * (36 + 32 + 32)


def test_lora_adapter_shrinks_gradients_and_optimizer_and_drops_reference_weights(tiny_qwen2_dir):
    pytest.importorskip("peft")
    from verl.trainer.config_validation import compose_ppo_config
    from verl.trainer.plan import plan_memory

    common = [f"actor_rollout_ref.model.path={tiny_qwen2_dir}", "data.train_batch_size=4",
              "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.use_kl_loss=True",
              "algorithm.adv_estimator=grpo", "trainer.device=cpu", "trainer.n_gpus_per_node=1"]
    full = plan_memory(compose_ppo_config(common)).components
    lora = plan_memory(compose_ppo_config([*common, "actor_rollout_ref.model.lora_rank=4"])).components
    # Tiny Qwen2 (hidden 64, 4 heads of 16, 2 kv heads, intermediate 128, 2 layers), rank 4 on all 7 linears:
    # q, o: 4·(64+64) each; k, v: 4·(64+32) each; gate, up, down: 4·(64+128) each -> 4·(256+192+576) = 4096
    # per layer, 8192 in all; fp32 gradients 4 bytes each, AdamW 8.
    assert lora["actor"]["gradients (sharded)"] == 8192 * 4
    assert lora["actor"]["optimizer (AdamW moments)"] == 8192 * 8
    assert lora["actor"]["weights (sharded master)"] == full["actor"]["weights (sharded master)"] + 8192 * 4
    assert lora["reference"]["weights (bf16, sharded)"] == 0 < full["reference"]["weights (bf16, sharded)"]


def test_shape_of_a_vision_language_model_counts_its_vision_tower(tmp_path, tiny_tokenizer_dir):
    """A Qwen2.5-VL folder is built with the class the loader uses (AutoModelForCausalLM has none for it): its
    parameters include the vision tower, its layers are the language model's."""
    import transformers

    from tests.models.vlm_models import save_tiny_qwen2_5_vl

    path = save_tiny_qwen2_5_vl(str(tmp_path / "vlm"), tiny_tokenizer_dir)
    shape = plan_module.model_shape(path, config_key="actor_rollout_ref.model.path")
    model = transformers.AutoModelForImageTextToText.from_pretrained(path)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.layers == model.config.text_config.num_hidden_layers
    from verl.models import load_value_model  # its critic: the same model and a head of one output

    critic = plan_module.model_shape(path, config_key="critic.model.path", value_head=True)
    assert critic.params == sum(p.numel() for p in load_value_model(path).parameters()) == shape.params + 64
