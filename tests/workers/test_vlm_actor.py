"""A vision-language policy (tiny random Qwen2.5-VL) on one rank: the hf rollout generates with images (the
vision encoder once per prompt), and the FSDP2 actor's packed update reads the images with M-RoPE positions,
with the vision tower frozen by actor.freeze_vision_tower."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from tests.models.test_vision import _batch, vlm_dir  # noqa: F401 - the module-scoped model fixture
from verl.models import forward_logprobs, load_causal_lm
from verl.models.vision import load_processor, vision_tower
from verl.protocol import DataProto, object_array
from verl.workers.actor import DataParallelPPOActor
from verl.workers.engine import FSDPEngine
from verl.workers.fsdp_workers import _freeze_vision_tower
from verl.workers.rollout.hf_rollout import HFRollout

FSDP_FP32 = {"dtype": "float32", "reshard_after_forward": True}
OPTIM = {"lr": 1e-2, "weight_decay": 0.0, "total_training_steps": 2}


def _rows(processor):
    """The three rows of tests/models/test_vision.py, as a trainer batch with per-row multi_modal_inputs."""
    from tests.models.test_vision import _prompt

    rows = [_prompt(processor, "Find x.", [(56, 56), (84, 56)])[1], _prompt(processor, "What is the angle?",
                                                                             [(56, 84)])[1], {}]
    input_ids, mask, positions, _, response = _batch(processor)
    return input_ids, mask, positions, object_array(rows), response


def _hf_rollout_inputs(vlm_dir, **sampling):
    """The model, the three rows' prompts (and their multi_modal_inputs) and an hf rollout config of 4 tokens."""
    processor = load_processor(vlm_dir)
    model = load_causal_lm(vlm_dir).eval()
    input_ids, mask, positions, mm, response = _rows(processor)
    prompts = DataProto.from_dict({"input_ids": input_ids[:, :-response], "attention_mask": mask[:, :-response],
                                   "position_ids": positions[:, :, :-response]},
                                  non_tensors={"multi_modal_inputs": mm}, meta_info={"eos_token_id": [], "seed": 1})
    config = OmegaConf.create({"name": "hf", "top_k": -1, "top_p": 1.0, "prompt_length": input_ids.shape[1] - response,
                               "response_length": 4, "ignore_eos": True, **sampling,
                               "val_kwargs": {"top_k": -1, "top_p": 1.0, "temperature": 0, "n": 1, "do_sample": False}})
    return processor, model, mm, prompts, config


def test_hf_rollout_encodes_each_prompt_images_once(vlm_dir):  # noqa: F811
    processor, model, mm, prompts, config = _hf_rollout_inputs(vlm_dir, temperature=1.0, do_sample=True, n=3,
                                                               micro_batch_size=4)
    calls = []
    vision_tower(model).register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    out = HFRollout(config, model, processor.tokenizer).generate_sequences(prompts)
    assert calls == [int(sum(len(r["pixel_values"]) for r in mm if r))]  # one encoder pass for the batch
    assert out.batch["position_ids"].shape == (9, 3, prompts.batch["input_ids"].shape[1] + 4)
    assert len(out.non_tensor_batch["multi_modal_inputs"]) == 9
    # The rollout's log-probs are the model's own with the images (recomputed in one padded forward).
    with torch.no_grad():
        rows = out.non_tensor_batch["multi_modal_inputs"]
        from verl.models.vision import multi_modal_batch

        recomputed, _ = forward_logprobs(model, out.batch["input_ids"], out.batch["attention_mask"],
                                         out.batch["position_ids"], 4, multi_modal_inputs=multi_modal_batch(rows))
    torch.testing.assert_close(out.batch["rollout_log_probs"], recomputed, rtol=0, atol=1e-4)


def test_hf_rollout_on_a_transformers_without_encoder_outputs_passes_the_pixels(vlm_dir, monkeypatch):  # noqa: F811
    """Models of transformers before ``mm_encoder_outputs`` encode the pixels in their own prefill: each sample is
    given its prompt's pixels, and greedy decoding gives the ids and log-probs of the encoded-once path."""
    processor, model, mm, prompts, config = _hf_rollout_inputs(vlm_dir, temperature=0.0, do_sample=False, n=2,
                                                               micro_batch_size=3)
    encoded = HFRollout(config, model, processor.tokenizer).generate_sequences(prompts).batch
    takes = HFRollout._takes
    monkeypatch.setattr(HFRollout, "_takes", lambda self, name: name != "mm_encoder_outputs" and takes(self, name))
    pixels = []
    vision_tower(model).register_forward_hook(lambda module, args, out: pixels.append(args[0].shape[0]))
    legacy = HFRollout(config, model, processor.tokenizer).generate_sequences(prompts).batch
    # micro-batches of 3 over the 6 samples (prompts 0, 0, 1 | 1, 2, 2): the model encodes each sample's pixels
    per_prompt = [len(r["pixel_values"]) if r else 0 for r in mm]
    assert pixels == [2 * per_prompt[0] + per_prompt[1], per_prompt[1]]
    assert torch.equal(legacy["responses"], encoded["responses"])
    torch.testing.assert_close(legacy["rollout_log_probs"], encoded["rollout_log_probs"], rtol=0, atol=1e-5)


def test_hf_rollout_never_samples_the_image_placeholders(vlm_dir):  # noqa: F811
    """A policy that favours the image/video placeholders (a hook adds 30 to their logits, so they are its argmax)
    still never writes one: the actor's forward over the responses would fail on an image token without an image.
    The recorded log-probs stay the model's own (placeholders included in the normalisation)."""
    from verl.models.vision import multi_modal_batch, pixels_in_row_order, placeholder_token_ids

    processor = load_processor(vlm_dir)
    model = load_causal_lm(vlm_dir).eval()
    placeholders = placeholder_token_ids(model.config)
    assert {model.config.image_token_id, model.config.video_token_id} <= set(placeholders)
    model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: out.index_add_(-1, torch.tensor(placeholders), torch.full(
            (*out.shape[:-1], len(placeholders)), 30.0)))
    input_ids, mask, positions, mm, response = _rows(processor)
    prompts = DataProto.from_dict({"input_ids": input_ids[:, :-response], "attention_mask": mask[:, :-response],
                                   "position_ids": positions[:, :, :-response]},
                                  non_tensors={"multi_modal_inputs": mm}, meta_info={"eos_token_id": [], "seed": 1})
    with torch.no_grad():  # the hook makes a placeholder the model's own first choice
        logits = model(input_ids=prompts.batch["input_ids"], attention_mask=prompts.batch["attention_mask"],
                       position_ids=prompts.batch["position_ids"].transpose(0, 1),
                       **pixels_in_row_order(multi_modal_batch(mm))).logits[:, -1]
    assert set(logits.argmax(-1).tolist()) <= set(placeholders)
    config = OmegaConf.create({"name": "hf", "temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": True, "n": 2,
                               "prompt_length": input_ids.shape[1] - response, "response_length": 4,
                               "ignore_eos": True, "micro_batch_size": 4,
                               "val_kwargs": {"top_k": -1, "top_p": 1.0, "temperature": 0, "n": 1, "do_sample": False}})
    out = HFRollout(config, model, processor.tokenizer).generate_sequences(prompts)
    assert not torch.isin(out.batch["responses"], torch.tensor(placeholders)).any()
    # top_k=1 keeps the best token that can be sampled (filtering first would keep only a placeholder: no token left)
    top1 = HFRollout(OmegaConf.merge(config, {"top_k": 1}), model, processor.tokenizer).generate_sequences(prompts)
    assert not torch.isin(top1.batch["responses"], torch.tensor(placeholders)).any()
    with torch.no_grad():  # through the lm_head module (and its hook), as generate's logits are
        logits = model(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                       position_ids=out.batch["position_ids"].transpose(0, 1),
                       **pixels_in_row_order(multi_modal_batch(out.non_tensor_batch["multi_modal_inputs"])),
                       ).logits[:, -5:-1]
    recomputed = torch.log_softmax(logits, -1).gather(-1, out.batch["responses"][..., None]).squeeze(-1)
    torch.testing.assert_close(out.batch["rollout_log_probs"], recomputed, rtol=0, atol=1e-4)
    assert (recomputed < -20).all()  # each chosen token lost to the favoured placeholders


def test_packed_update_with_images_and_a_frozen_vision_tower(single_rank, vlm_dir):  # noqa: F811
    processor = load_processor(vlm_dir)
    model = load_causal_lm(vlm_dir, remove_padding=True)
    _freeze_vision_tower(model, vlm_dir)
    frozen = {name: p.detach().clone() for name, p in vision_tower(model).named_parameters()}
    engine = FSDPEngine(model, fsdp_config=FSDP_FP32, optim_config=OPTIM, enable_gradient_checkpointing=True)
    trained = {id(p) for group in engine.optimizer.param_groups for p in group["params"]}
    tower = vision_tower(engine.module)
    assert not any(id(p) in trained for p in tower.parameters()) and trained
    assert engine.checkpointed_names is None  # the frozen tower stays in the checkpoints

    input_ids, mask, positions, mm, response = _rows(processor)
    response_mask = mask[:, -response:]
    data = DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask, "position_ids": positions,
                                "responses": input_ids[:, -response:], "response_mask": response_mask,
                                "advantages": torch.tensor([[1.0], [-1.0], [0.5]]) * response_mask},
                               non_tensors={"multi_modal_inputs": mm, "uid": np.array(["a", "b", "c"], dtype=object)})
    actor = DataParallelPPOActor({"ppo_epochs": 1, "loss_agg_mode": "token-mean"}, engine, mini_batch_size=3,
                                 micro_batch_size=2, remove_padding=True)
    with torch.no_grad():
        before = actor.compute_log_prob(data, temperature=1.0, micro_batch_size=2)[0]
    metrics, recorded = actor.update_policy(data, temperature=1.0)
    torch.testing.assert_close(recorded.batch["old_log_probs"], before, rtol=0, atol=1e-5)
    assert metrics["actor/grad_norm"][0] > 0
    with engine.gathered_params() as module:
        for name, p in vision_tower(module).named_parameters():
            torch.testing.assert_close(p.detach(), frozen[name], rtol=0, atol=0)
    after = actor.compute_log_prob(data, temperature=1.0, micro_batch_size=2)[0]
    assert not torch.allclose(after, before)


def test_freezing_a_text_model_names_the_key(tiny_qwen2_dir):
    with pytest.raises(ValueError, match="freeze_vision_tower=True.*no vision tower"):
        _freeze_vision_tower(load_causal_lm(tiny_qwen2_dir), tiny_qwen2_dir)
