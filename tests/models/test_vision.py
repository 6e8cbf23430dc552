"""Vision-language forwards (tiny random Qwen2.5-VL): M-RoPE positions, packed == padded with images, the tower."""

import pytest
import torch
from PIL import Image

from tests.models.vlm_models import save_tiny_qwen2_5_vl
from verl.models import forward_logprobs, load_causal_lm
from verl.models.packed import pack
from verl.models.vision import load_processor, multi_modal_batch, pixels_in_row_order, rope_index, vision_tower


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory, tiny_tokenizer_dir):
    return save_tiny_qwen2_5_vl(str(tmp_path_factory.mktemp("tiny_qwen2_5_vl")), tiny_tokenizer_dir)


def _prompt(processor, text: str, sizes):
    content = [{"type": "image"} for _ in sizes] + [{"type": "text", "text": text}]
    rendered = processor.tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                                       add_generation_prompt=True, tokenize=False)
    images = [Image.new("RGB", size, (40 * i, 200, 90)) for i, size in enumerate(sizes)]
    return processor(rendered, images)


def _batch(processor, response_length=5):
    """Three left-padded rows (two images / one image / none) with responses, as the trainer lays them out."""
    rows = [_prompt(processor, "Find x.", [(56, 56), (84, 56)]), _prompt(processor, "What is the angle?", [(56, 84)]),
            _prompt(processor, "No picture here.", [])]
    return _layout(processor, rows, response_length)


def _layout(processor, rows, response_length):
    width = max(len(ids) for ids, _ in rows)
    generator = torch.Generator().manual_seed(0)
    input_ids, masks, positions = [], [], []
    for ids, inputs in rows:
        pad = width - len(ids)
        prompt = torch.tensor([0] * pad + ids)
        mask = torch.tensor([0] * pad + [1] * len(ids))
        prompt_positions = rope_index(processor.config, prompt, mask, inputs.get("image_grid_thw"))
        response = torch.randint(3, 300, (response_length,), generator=generator)
        input_ids.append(torch.cat([prompt, response]))
        masks.append(torch.cat([mask, torch.ones(response_length, dtype=torch.long)]))
        positions.append(torch.cat([prompt_positions, prompt_positions[:, -1:] + torch.arange(1, response_length + 1)],
                                   dim=-1))
    masks[2][-2:] = 0  # a response that ended early
    return (torch.stack(input_ids), torch.stack(masks), torch.stack(positions),
            multi_modal_batch([inputs for _, inputs in rows]), response_length)


def test_rope_index_matches_the_model_own_positions(vlm_dir):
    """Our (3, T) positions are what the model computes for itself from the image grid."""
    processor = load_processor(vlm_dir)
    model = load_causal_lm(vlm_dir).eval()
    ids, inputs = _prompt(processor, "Find x.", [(56, 56), (84, 56)])
    input_ids = torch.tensor([ids])
    mask = torch.ones_like(input_ids)
    ours = rope_index(processor.config, input_ids[0], mask[0], inputs["image_grid_thw"])
    assert ours.shape == (3, len(ids))
    assert not torch.equal(ours[0], ours[1])  # image tokens take grid coordinates
    with torch.no_grad():
        token_type = (input_ids == processor.image_token_id).int()
        theirs = model(input_ids=input_ids, attention_mask=mask, mm_token_type_ids=token_type, **inputs).logits
        given = model(input_ids=input_ids, attention_mask=mask, position_ids=ours[:, None], **inputs).logits
    torch.testing.assert_close(given, theirs, rtol=0, atol=0)


def test_packed_logprobs_equal_padded_with_images(vlm_dir):
    """Log-probs of rows with images: packed equal padded, and both equal the model's own forward from the pixels
    (our forward hands the model embeddings with the features in place, whatever transformers version)."""
    processor = load_processor(vlm_dir)
    padded_model = load_causal_lm(vlm_dir).eval()
    packed_model = load_causal_lm(vlm_dir, remove_padding=True).eval()
    input_ids, mask, positions, multi_modal, response_length = _batch(processor)
    assert multi_modal["image_grid_thw"].shape == (3, 3)
    with torch.no_grad():
        padded, padded_entropy = forward_logprobs(padded_model, input_ids, mask, positions, response_length,
                                                  multi_modal_inputs=multi_modal)
        packed, packed_entropy = forward_logprobs(packed_model, input_ids, mask, positions, response_length,
                                                  remove_padding=True, multi_modal_inputs=multi_modal)
        blind, _ = forward_logprobs(padded_model, input_ids, mask, positions, response_length)
        # transformers' own path: the model encodes the pixels itself and places their features.
        logits = padded_model(input_ids=input_ids, attention_mask=mask, position_ids=positions.transpose(0, 1),
                              pixel_values=multi_modal["pixel_values"],
                              image_grid_thw=multi_modal["image_grid_thw"]).logits[:, -response_length - 1:-1]
        own = torch.log_softmax(logits, -1).gather(-1, input_ids[:, -response_length:, None]).squeeze(-1)
    valid = mask[:, -response_length:].bool()
    torch.testing.assert_close(padded[valid], own[valid], rtol=0, atol=1e-5)
    torch.testing.assert_close(packed[valid], padded[valid], rtol=0, atol=1e-5)
    torch.testing.assert_close(packed_entropy[valid], padded_entropy[valid], rtol=0, atol=1e-5)
    assert (packed[~valid] == 0).all()
    assert not torch.allclose(blind[:2], padded[:2])  # the images do change the log-probs


def test_pack_keeps_three_positions_per_token():
    input_ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    positions = torch.stack([torch.tensor([[0, 0, 1], [0, 0, 2], [0, 0, 3]]),
                             torch.tensor([[0, 1, 2], [0, 1, 1], [0, 1, 0]])])
    batch = pack(input_ids, mask, positions)
    assert batch.position_ids.tolist() == [[[0, 1, 0, 1, 2]], [[0, 2, 0, 1, 1]], [[0, 3, 0, 1, 0]]]
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9]]


def test_vision_tower_found(vlm_dir, tiny_qwen2_dir):
    assert vision_tower(load_causal_lm(vlm_dir)) is not None
    assert vision_tower(load_causal_lm(tiny_qwen2_dir)) is None
    assert load_processor(tiny_qwen2_dir) is None


def test_a_vision_language_value_model_reads_the_images(vlm_dir, tmp_path):
    """The critic of a vision-language policy: the whole model plus a one-output ``score`` head. A value is the head
    on the final hidden state just before its response token (worked here from the backbone's own output), the images
    change it, packed equals padded, the seeded head is the same on every load, and a saved value model gives its
    head back."""
    from verl.models import forward_values, load_value_model

    processor = load_processor(vlm_dir)
    model = load_value_model(vlm_dir).eval()
    assert model.score.weight.shape == (1, 64) and model.score.bias is None
    torch.testing.assert_close(load_value_model(vlm_dir).score.weight, model.score.weight, rtol=0, atol=0)
    input_ids, mask, positions, multi_modal, response_length = _batch(processor)
    with torch.no_grad():
        values = forward_values(model, input_ids, mask, positions, response_length, multi_modal_inputs=multi_modal)
        hidden = model.model(input_ids=input_ids, attention_mask=mask, position_ids=positions.transpose(0, 1),
                             **pixels_in_row_order(multi_modal)).last_hidden_state
        by_hand = (hidden[:, -response_length - 1:-1] @ model.score.weight[0]).float()
        packed = forward_values(load_value_model(vlm_dir, remove_padding=True).eval(), input_ids, mask, positions,
                                response_length, remove_padding=True, multi_modal_inputs=multi_modal)
        blind = forward_values(model, input_ids, mask, positions, response_length)
    valid = mask[:, -response_length:].bool()
    torch.testing.assert_close(values, by_hand, rtol=0, atol=1e-6)
    torch.testing.assert_close(packed[valid], values[valid], rtol=0, atol=1e-5)
    assert not torch.allclose(blind[:2], values[:2])  # the images do change the values

    with torch.no_grad():
        model.score.weight.mul_(3.0)
    model.save_pretrained(tmp_path / "critic")
    assert torch.equal(load_value_model(str(tmp_path / "critic")).score.weight, model.score.weight)


def test_rows_with_the_same_images_are_encoded_once(vlm_dir):
    """A prompt's samples share its images: the vision tower encodes each distinct row's images once (the same
    tensors, or equal ones after a copy), and the log-probs and the vision tower's gradients equal those of
    encoding every row's copy."""
    import copy

    processor = load_processor(vlm_dir)
    a = _prompt(processor, "Find x.", [(56, 56), (84, 56)])
    b = _prompt(processor, "What is the angle?", [(56, 84)])
    a_other = _prompt(processor, "Find y.", [(56, 56), (84, 56)])  # the same sizes
    a_other[1]["pixel_values"] = a_other[1]["pixel_values"] + 0.5  # other pixels
    rows = [a, a, b, copy.deepcopy(a), a_other, _prompt(processor, "No picture here.", []), b]
    input_ids, mask, positions, multi_modal, response_length = _layout(processor, rows, 4)
    mm_rows = [inputs for _, inputs in rows]
    # Worked by hand: distinct rows a (images 0, 1), b (2), a_other (3, 4), in the order they first come.
    assert multi_modal["image_index"].tolist() == [0, 1, 0, 1, 2, 0, 1, 3, 4, 2]
    assert torch.equal(multi_modal["pixel_values"], torch.cat([a[1]["pixel_values"], b[1]["pixel_values"],
                                                               a_other[1]["pixel_values"]]))
    every_copy = {key: torch.cat([r[key] for r in mm_rows if r]) for key in ("pixel_values", "image_grid_thw")}
    assert all(torch.equal(every_copy[k], v) for k, v in pixels_in_row_order(multi_modal).items())

    model = load_causal_lm(vlm_dir, remove_padding=True)
    patches = []
    vision_tower(model).register_forward_pre_hook(lambda module, args: patches.append(args[0].shape[0]))
    results = []
    for inputs in (multi_modal, every_copy):
        model.zero_grad()
        log_probs, _ = forward_logprobs(model, input_ids, mask, positions, response_length, remove_padding=True,
                                        multi_modal_inputs=inputs)
        log_probs.sum().backward()
        results.append((log_probs.detach(), [p.grad.clone() for p in vision_tower(model).parameters()]))
    # Patches (14 px, 2 frames a patch): a 16 + 24, b 24, a_other 40; every copy: 3 a, 2 b, a_other.
    assert patches == [40 + 24 + 40, 3 * 40 + 2 * 24 + 40]
    (once, grads_once), (each, grads_each) = results
    torch.testing.assert_close(once, each, rtol=0, atol=1e-5)
    for got, want in zip(grads_once, grads_each):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in grads_once)


@pytest.fixture
def vision_calls():
    """Spy on the vision implementation's attention calls: (query length, given cu_seqlens, is_causal). Through
    transformers' public ``AttentionInterface.register``; the packed attention is registered back afterwards."""
    from transformers import AttentionInterface

    from verl.models import packed

    calls = []

    def spy(module, query, *args, **kwargs):
        calls.append((query.shape[2], "cu_seq_lens_q" in kwargs, kwargs.get("is_causal")))
        return packed.packed_attention(module, query, *args, **kwargs)

    packed.register()
    AttentionInterface.register(packed.VISION_ATTN_IMPLEMENTATION, spy)
    yield calls
    AttentionInterface.register(packed.VISION_ATTN_IMPLEMENTATION, packed.packed_attention)


def _vision_inputs():
    g = torch.Generator().manual_seed(0)
    grid = torch.tensor([[1, 4, 4], [1, 8, 8], [1, 4, 8]])  # 16 + 64 + 32 patches; 4-patch windows of 56 px
    return torch.randn(112, 3 * 2 * 14 * 14, generator=g), grid


def test_packed_vision_tower_attends_each_block_in_one_varlen_call(vlm_dir, vision_calls):
    """Loaded for packed forwards, the vision tower's attention takes each block's windows (or whole images) in one
    call on cu_seqlens, bidirectional, instead of one SDPA call per window; its features equal SDPA's."""
    from verl.models.packed import VISION_ATTN_IMPLEMENTATION

    calls = vision_calls
    model = load_causal_lm(vlm_dir, remove_padding=True).eval()
    reference = load_causal_lm(vlm_dir).eval()
    tower = vision_tower(model)
    assert tower.config._attn_implementation == VISION_ATTN_IMPLEMENTATION
    assert model.config.get_text_config()._attn_implementation != VISION_ATTN_IMPLEMENTATION
    pixels, grid = _vision_inputs()
    with torch.no_grad():
        got = tower(pixels, grid_thw=grid).pooler_output
        want = vision_tower(reference)(pixels, grid_thw=grid).pooler_output
    assert calls == [(112, True, False)] * len(tower.blocks)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_packed_vision_tower_varlen_on_cuda_matches_sdpa(vlm_dir, vision_calls):
    """On CUDA in bf16 the one call per block is PyTorch's varlen flash attention, bidirectional: its features
    and gradients match the per-window SDPA loop's within bf16 rounding."""
    calls = vision_calls
    results = []
    for packed_forward in (True, False):
        model = load_causal_lm(vlm_dir, remove_padding=packed_forward, dtype=torch.bfloat16).cuda()
        tower = vision_tower(model)
        pixels, grid = (t.cuda() for t in _vision_inputs())
        out = tower(pixels.bfloat16(), grid_thw=grid).pooler_output
        out.float().square().sum().backward()
        results.append((out.float(), tower.blocks[0].attn.qkv.weight.grad.float()))
    assert len(calls) == len(tower.blocks) and all(cu and causal is False for _, cu, causal in calls)
    (got, got_grad), (want, want_grad) = results
    torch.testing.assert_close(got, want, rtol=0.02, atol=0.02 * want.abs().max().item())
    torch.testing.assert_close(got_grad, want_grad, rtol=0.05, atol=0.05 * want_grad.abs().max().item())
