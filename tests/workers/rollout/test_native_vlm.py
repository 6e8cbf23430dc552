"""The native engine on a vision-language model (tiny random Qwen2.5-VL, CPU, fp32): each prompt's images go
through the vision tower once, their features replace the placeholder tokens in the prefill, M-RoPE positions
come from the data, and decoding continues at the text positions after them. Checked against the hf engine
(transformers' ``generate``, which the hf tests check against the model's own forward) and against the model's
forward over the finished sequences, as the trainer computes log-probs."""

import numpy as np
import pytest
import torch
from PIL import Image

from tests.models.vlm_models import save_tiny_qwen2_5_vl
from verl.models import forward_logprobs, load_causal_lm
from verl.models.vision import load_processor, multi_modal_batch, placeholder_token_ids, rope_index
from verl.protocol import DataProto
from verl.workers.rollout import HFRollout, NativeRollout

from .test_native_rollout import make_config

RESPONSE_LENGTH = 10


@pytest.fixture(scope="module")
def vlm(tmp_path_factory, tiny_tokenizer_dir):
    path = save_tiny_qwen2_5_vl(str(tmp_path_factory.mktemp("tiny_qwen2_5_vl")), tiny_tokenizer_dir)
    model = load_causal_lm(path).eval()
    with torch.no_grad():  # larger weights than the default init, so that greedy outputs vary with the input
        for name, p in model.named_parameters():
            if p.dim() == 2 and "visual" not in name:
                p.normal_(0, 0.15)
    return model, load_processor(path)


def prompts(processor, **meta_info) -> DataProto:
    """Three left-padded prompts as verl's RL dataset lays them out: two images, one image, none."""
    cases = [("Find x.", [(56, 56), (84, 56)]), ("What is the angle?", [(56, 84)]), ("No picture here.", [])]
    rows = []
    for i, (text, sizes) in enumerate(cases):
        content = [{"type": "image"} for _ in sizes] + [{"type": "text", "text": text}]
        rendered = processor.tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                                           add_generation_prompt=True, tokenize=False)
        rows.append(processor(rendered, [Image.new("RGB", s, (60 * i + 30 * j, 200 - 50 * j, 90))
                                         for j, s in enumerate(sizes)]))
    width = max(len(ids) for ids, _ in rows)
    input_ids, masks, positions = [], [], []
    for ids, inputs in rows:
        pad = width - len(ids)
        input_ids.append(torch.tensor([processor.tokenizer.pad_token_id] * pad + ids))
        masks.append(torch.tensor([0] * pad + [1] * len(ids)))
        positions.append(rope_index(processor.config, input_ids[-1], masks[-1], inputs.get("image_grid_thw")))
    multi_modal = np.empty(len(rows), dtype=object)
    multi_modal[:] = [inputs for _, inputs in rows]
    return DataProto.from_dict({"input_ids": torch.stack(input_ids), "attention_mask": torch.stack(masks),
                                "position_ids": torch.stack(positions)},
                               {"uid": np.array([f"u{i}" for i in range(len(rows))], dtype=object),
                                "multi_modal_inputs": multi_modal}, {"eos_token_id": [], **meta_info})


def trainer_log_probs(model, batch, multi_modal_inputs) -> torch.Tensor:
    rows = [multi_modal_inputs[i // (len(batch["input_ids"]) // len(multi_modal_inputs))]
            for i in range(len(batch["input_ids"]))]
    with torch.no_grad():
        log_probs, _ = forward_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                        RESPONSE_LENGTH, multi_modal_inputs=multi_modal_batch(rows, batch["input_ids"].device))
    return log_probs


@pytest.mark.parametrize("do_sample", [False, True])
def test_native_matches_hf_and_the_trainer_forward(vlm, do_sample):
    model, processor = vlm
    config = make_config(response_length=RESPONSE_LENGTH, n=2)
    batch = prompts(processor, do_sample=do_sample, seed=7)
    ours = NativeRollout(config, model, processor.tokenizer).generate_sequences(batch).batch
    trainer = trainer_log_probs(model, ours, batch.non_tensor_batch["multi_modal_inputs"])
    assert (ours["rollout_log_probs"] - trainer).abs().max() < 1e-4
    assert torch.equal(ours["position_ids"][:, :, -RESPONSE_LENGTH:],  # text positions after the images' M-RoPE
                       ours["position_ids"][:, :, -RESPONSE_LENGTH - 1:-1] + 1)
    if not do_sample:
        hf = HFRollout(config, model, processor.tokenizer).generate_sequences(batch).batch
        assert torch.equal(ours["responses"], hf["responses"])
        assert (ours["rollout_log_probs"] - hf["rollout_log_probs"]).abs().max() < 1e-4
        # The images matter: the same prompts without them (placeholders as plain tokens) decode otherwise.
        blind = prompts(processor, do_sample=False)
        blind.non_tensor_batch["multi_modal_inputs"][:] = [{}, {}, {}]
        with pytest.raises(ValueError, match="image tokens but their images encode to 0"):
            NativeRollout(config, model, processor.tokenizer).generate_sequences(blind)


def test_placeholders_are_never_sampled_and_log_probs_stay_the_models(vlm):
    """A placeholder the model prefers above all (its output row boosted) is still never generated; the recorded
    log-probs are the model's own (the trainer's forward), not those of the distribution without placeholders."""
    model, processor = vlm
    config = make_config(response_length=RESPONSE_LENGTH)
    batch = prompts(processor, do_sample=True, seed=3)
    video = processor.config.video_token_id  # no prompt holds it: the inputs are unchanged
    saved = model.lm_head.weight[video].clone()
    with torch.no_grad():
        model.lm_head.weight[video] = model.lm_head.weight.abs().max() * 3 * torch.sign(torch.randn_like(saved))
    try:
        ours = NativeRollout(config, model, processor.tokenizer).generate_sequences(batch).batch
        assert not torch.isin(ours["responses"], torch.tensor(placeholder_token_ids(model.config))).any()
        trainer = trainer_log_probs(model, ours, batch.non_tensor_batch["multi_modal_inputs"])
        assert (ours["rollout_log_probs"] - trainer).abs().max() < 1e-4
        assert trainer.mean() < -1.0  # the placeholder took much of the mass: the correction was needed
    finally:
        with torch.no_grad():
            model.lm_head.weight[video] = saved


def test_prompts_with_image_tokens_but_text_positions_are_refused(vlm):
    """A multi-turn agent loop hands the rollout text prompts (2-D positions, no pixels): with image placeholders
    in them the engine stops instead of generating from placeholder embeddings."""
    model, processor = vlm
    batch = prompts(processor, do_sample=False)
    batch.batch["position_ids"] = batch.batch["position_ids"][:, 0]
    batch.non_tensor_batch.pop("multi_modal_inputs")
    with pytest.raises(ValueError, match="image placeholder tokens but no 3-row M-RoPE position_ids"):
        NativeRollout(make_config(response_length=RESPONSE_LENGTH), model, processor.tokenizer).generate_sequences(batch)


def test_the_asynchronous_stream_suspends_and_resumes_rows_with_images(vlm):
    """The asynchronous modes' stream: rows of a group still running when a call returns are suspended, then
    prefilled again (prompt with its image features at M-RoPE positions, generated tokens at text positions) and
    finish as the synchronous call does, greedy ids and log-probs alike."""
    model, processor = vlm
    batch = prompts(processor, do_sample=False)
    width = batch.batch["input_ids"].shape[1]
    config = make_config(response_length=RESPONSE_LENGTH, n=2, do_sample=False, prompt_length=width)
    full = NativeRollout(make_config(response_length=RESPONSE_LENGTH, ignore_eos=True), model,
                         processor.tokenizer).generate_sequences(batch).batch["responses"].tolist()
    # An eos that stops the first prompt's rows within 3 steps while another prompt's run past step 6.
    eos = next(t for t in full[0][1:4] if max(r.index(t) if t in r else RESPONSE_LENGTH for r in full) >= 7)
    batch.meta_info["eos_token_id"] = [eos]
    whole = NativeRollout(config, model, processor.tokenizer).generate_sequences(batch)

    rollout = NativeRollout(config, model, processor.tokenizer)
    rollout.default_eos_token_ids = [eos]
    first, _ = rollout.generate_stream(batch, version=0, until_groups=1)
    suspended = list(rollout.stream.resuming)
    assert suspended and all(0 < rollout.stream.row_steps[r] < RESPONSE_LENGTH for r in suspended)
    rest, stats = rollout.generate_stream(None, version=0, until_groups=3)
    assert stats["resumed"] == len(suspended) and stats["in_flight_groups"] == 0
    got = DataProto.concat([first, rest])
    uids = list(whole.non_tensor_batch["uid"])
    for uid in set(uids):
        mine = [i for i, u in enumerate(got.non_tensor_batch["uid"]) if u == uid]
        theirs = [i for i, u in enumerate(uids) if u == uid]
        assert torch.equal(got.batch["responses"][mine], whole.batch["responses"][theirs]), uid
        torch.testing.assert_close(got.batch["rollout_log_probs"][mine], whole.batch["rollout_log_probs"][theirs],
                                   atol=1e-5, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_with_images_match_hf(vlm):
    """On CUDA (fp32, so exact comparisons hold): decode under CUDA graphs, each slot's M-RoPE offset read from
    the graphs' state (the fused RoPE/cache-write kernel); greedy ids equal the hf engine's and log-probs the
    trainer's forward, sampled ones too (the Triton sampler, placeholders at -inf)."""
    model, processor = vlm
    model = model.cuda()
    try:
        config = make_config(response_length=RESPONSE_LENGTH, n=2, gpu_memory_utilization=0.3)
        batch = prompts(processor, do_sample=False)
        rollout = NativeRollout(config, model, processor.tokenizer)
        ours = rollout.generate_sequences(batch).batch
        assert rollout.last_stats["graph_captures"] >= 1
        hf = HFRollout(config, model, processor.tokenizer).generate_sequences(batch).batch
        assert torch.equal(ours["responses"].cpu(), hf["responses"].cpu())
        trainer = trainer_log_probs(model, ours.to("cuda"), batch.non_tensor_batch["multi_modal_inputs"])
        assert (ours["rollout_log_probs"].cuda() - trainer).abs().max() < 1e-3
        # Sampled by the Triton sampler, with the placeholders' logits at -inf: log-probs still the trainer's.
        sampled = rollout.generate_sequences(prompts(processor, do_sample=True, seed=5)).batch
        assert not torch.isin(sampled["responses"].cpu(), torch.tensor(placeholder_token_ids(model.config))).any()
        trainer = trainer_log_probs(model, sampled.to("cuda"), batch.non_tensor_batch["multi_modal_inputs"])
        assert (sampled["rollout_log_probs"].cuda() - trainer).abs().max() < 1e-3
    finally:
        model.cpu()
