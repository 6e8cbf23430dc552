"""``python -m verl.trainer.fsdp_sft_trainer`` end to end on a tiny Qwen2 model (CPU, one process), through main()."""

import json
import os

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from verl.trainer import fsdp_sft_trainer
from verl.trainer.fsdp_sft_trainer import main

PAIRS = [(f"What is {a} + {b}?", f"It is {a + b}") for a, b in [(1, 2), (3, 4), (5, 6), (2, 7), (4, 4), (9, 1),
                                                                (6, 2), (8, 5)]]


@pytest.fixture(scope="module")
def memo_parquet(tmp_path_factory):
    """Eight fixed prompt -> response pairs in verl's SFT shape (``prompt``/``response`` columns)."""
    path = tmp_path_factory.mktemp("sft_data") / "train.parquet"
    pd.DataFrame({"prompt": [p for p, _ in PAIRS], "response": [r for _, r in PAIRS]}).to_parquet(path)
    return str(path)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls on a shared 2-core machine run many times faster on one thread than on two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def no_process_group():
    """main() makes (and removes) its own one-process group; nothing may be left over from other tests."""
    if dist.is_initialized():
        dist.destroy_process_group()
    yield
    assert not dist.is_initialized()


def command(model_dir, data, out, *extra):
    return [f"data.train_files={data}", "data.prompt_key=prompt", "data.response_key=response",
            "data.train_batch_size=8", "data.micro_batch_size_per_gpu=4", "data.max_length=32",
            f"model.partial_pretrain={model_dir}", "model.enable_gradient_checkpointing=false",
            "optim.lr=5e-3", "optim.weight_decay=0.0", "optim.lr_warmup_steps_ratio=0",
            "optim.lr_scheduler_type=constant", "trainer.device=cpu", "trainer.logger=[console,file]",
            f"trainer.default_local_dir={out}/ckpt", *extra]


def run(monkeypatch, out, *args) -> dict[int, dict]:
    """Run main() with the metrics file in ``out``; returns {step: metrics} of every line logged so far."""
    log = os.path.join(out, "metrics.jsonl")
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", log)
    assert main(list(args)) == 0
    with open(log) as f:
        return {line["step"]: line["data"] for line in map(json.loads, f)}


def hf_weights(folder):
    return load_file(os.path.join(folder, "huggingface", "model.safetensors"))


# ------------------------------------------------------------------------------------------------ learning
def test_memorises_pairs_and_exports_a_model_that_answers(tiny_qwen2_dir, memo_parquet, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    metrics = run(monkeypatch, tmp_path, *command(tiny_qwen2_dir, memo_parquet, tmp_path, f"data.val_files={memo_parquet}",
                                                  "trainer.total_training_steps=60", "trainer.test_freq=30"))
    assert sorted(metrics) == list(range(1, 61))
    for values in metrics.values():
        assert {"train/loss", "train/lr", "train/grad_norm", "train/global_tokens", "train/tokens_per_s",
                "train/epoch"} <= set(values)
    assert metrics[60]["train/loss"] < 0.1 * metrics[1]["train/loss"]
    assert [s for s in metrics if "val/loss" in metrics[s]] == [30, 60]
    assert metrics[60]["val/loss"] < metrics[30]["val/loss"]

    ckpt = tmp_path / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "60"
    assert sorted(os.listdir(ckpt)) == ["global_step_60", "latest_checkpointed_iteration.txt"]  # save_freq=-1
    folder = ckpt / "global_step_60" / "huggingface"
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    answered = 0
    for prompt, response in PAIRS:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=False)
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
        out = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
        answered += tokenizer.decode(out[0, ids.shape[1]:]) == response + tokenizer.eos_token
    assert answered == len(PAIRS)


# ------------------------------------------------------------------------------------------------ exactness
SGD_LIKE = ("optim.eps=1.0",)  # Adam with eps >> |g| updates by ~lr*g: smooth in the gradient


def test_micro_batches_accumulate_to_the_same_step(tiny_qwen2_dir, memo_parquet, tmp_path, monkeypatch):
    results = {}
    for micro in (1, 4):
        out = tmp_path / f"micro{micro}"
        metrics = run(monkeypatch, out, *command(tiny_qwen2_dir, memo_parquet, out, *SGD_LIKE,
                                                 f"data.micro_batch_size_per_gpu={micro}",
                                                 "trainer.total_training_steps=2",
                                                 "trainer.checkpoint.save_contents=[hf_model]"))
        results[micro] = metrics, hf_weights(out / "ckpt" / "global_step_2")
    (metrics_1, weights_1), (metrics_4, weights_4) = results[1], results[4]
    for step in (1, 2):
        assert metrics_1[step]["train/loss"] == pytest.approx(metrics_4[step]["train/loss"], rel=1e-6)
        assert metrics_1[step]["train/grad_norm"] == pytest.approx(metrics_4[step]["train/grad_norm"], rel=1e-5)
    assert weights_1.keys() == weights_4.keys()
    for name in weights_1:
        torch.testing.assert_close(weights_1[name], weights_4[name], rtol=0, atol=1e-6, msg=name)


class Interrupted(Exception):
    pass


def test_resume_continues_exactly_and_old_checkpoints_rotate(tiny_qwen2_dir, memo_parquet, tmp_path, monkeypatch):
    from verl.model_merger.__main__ import main as merger_main

    # 2 steps per epoch, so the interrupted run stops mid-epoch and the rest crosses an epoch boundary.
    args = ("data.train_batch_size=4", "data.micro_batch_size_per_gpu=2", "optim.lr_scheduler_type=cosine",
            "optim.lr_warmup_steps_ratio=0.34", "trainer.total_training_steps=6", "trainer.save_freq=3",
            "trainer.max_ckpt_to_keep=1")
    straight = run(monkeypatch, tmp_path / "a", *command(tiny_qwen2_dir, memo_parquet, tmp_path / "a", *args))

    real_step = fsdp_sft_trainer.FSDPSFTTrainer.training_step

    def stop_at_step_4(self, batch):
        if self.global_step == 4:
            raise Interrupted
        return real_step(self, batch)

    b = tmp_path / "b"
    monkeypatch.setattr(fsdp_sft_trainer.FSDPSFTTrainer, "training_step", stop_at_step_4)
    with pytest.raises(Interrupted):
        run(monkeypatch, b, *command(tiny_qwen2_dir, memo_parquet, b, *args))
    assert (b / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "3"
    monkeypatch.setattr(fsdp_sft_trainer.FSDPSFTTrainer, "training_step", real_step)
    resumed = run(monkeypatch, b, *command(tiny_qwen2_dir, memo_parquet, b, *args))

    assert sorted(resumed) == list(range(1, 7))
    for step in range(1, 7):
        for key in ("train/loss", "train/lr", "train/grad_norm", "train/global_tokens", "train/epoch"):
            assert resumed[step][key] == straight[step][key], (step, key)
    assert straight[6]["train/epoch"] == 2
    for ckpt in (tmp_path / "a" / "ckpt", b / "ckpt"):
        assert sorted(os.listdir(ckpt)) == ["global_step_6", "latest_checkpointed_iteration.txt"]
        assert {"data.pt", "fsdp_config.json", "model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt",
                "extra_state_world_size_1_rank_0.pt", "huggingface"} <= set(os.listdir(ckpt / "global_step_6"))
    final_a, final_b = (hf_weights(d / "ckpt" / "global_step_6") for d in (tmp_path / "a", b))
    assert all(torch.equal(final_a[name], final_b[name]) for name in final_a)

    # The shards merge to the same model as the exported folder.
    target = tmp_path / "merged"
    assert merger_main(["merge", "--local_dir", str(tmp_path / "a" / "ckpt" / "global_step_6"),
                        "--target_dir", str(target)]) == 0
    merged = load_file(target / "model.safetensors")
    assert all(torch.equal(merged[name], final_a[name]) for name in final_a)


# ------------------------------------------------------------------------------------------------ errors
def test_config_problems_are_reported_together_before_anything_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the default trainer.device is cuda
    assert main(["data.micro_batch_size_per_gpus=2", "trainer.totl_epochs=1"]) == 1
    err = capsys.readouterr().err
    assert "data.micro_batch_size_per_gpus: unknown key; did you mean data.micro_batch_size_per_gpu?" in err
    assert "trainer.totl_epochs: unknown key; did you mean trainer.total_epochs?" in err

    assert main(["data.train_batch_size=6", "data.micro_batch_size_per_gpu=4", "optim.lr_scheduler_type=cosin",
                 f"data.val_files={tmp_path}/missing.parquet", "model.lora_rank=8", "trainer.total_epochs=1.5"]) == 1
    err = capsys.readouterr().err
    assert "Invalid configuration (8 problems):" in err
    for expected in ("- data.train_files: not set", "- model.partial_pretrain: not set",
                     "- data.train_batch_size: 6 is not divisible by data.micro_batch_size_per_gpu x world size = 4 x 1",
                     "- optim.lr_scheduler_type: 'cosin' is not a known value; did you mean cosine?",
                     f"- data.val_files: '{tmp_path}/missing.parquet' is not a file",
                     "- model.lora_rank: LoRA is not supported", "- trainer.device: cuda, but this machine has no CUDA",
                     "- trainer.total_epochs: expected an integer, got 1.5"):
        assert expected in err
    # keys of sft_trainer.yaml's own (no ppo_trainer.yaml counterpart) are typed too
    assert main(["data.max_length=long", "model.enable_gradient_checkpointing=maybe", "optim.clip_grad=x"]) == 1
    err = capsys.readouterr().err
    for expected in ("- data.max_length: expected an integer, got 'long'",
                     "- model.enable_gradient_checkpointing: expected true or false, got 'maybe'",
                     "- optim.clip_grad: expected a number, got 'x'"):
        assert expected in err


def test_world_size_enters_the_batch_check(tiny_qwen2_dir, memo_parquet):
    from verl.trainer.config import ConfigError
    from verl.trainer.fsdp_sft_trainer import compose_sft_config, validate_sft_config

    config = compose_sft_config([f"data.train_files={memo_parquet}", f"model.partial_pretrain={tiny_qwen2_dir}",
                                 "trainer.device=cpu", "data.train_batch_size=4", "data.micro_batch_size_per_gpu=4"])
    assert validate_sft_config(config, world_size=1) == []
    with pytest.raises(ConfigError, match=r"not divisible by .* = 4 x 2. Make it a multiple of 8"):
        validate_sft_config(config, world_size=2)


def test_data_problems_stop_the_run_with_the_row(tiny_qwen2_dir, memo_parquet, tmp_path, capsys):
    assert main(command(tiny_qwen2_dir, memo_parquet, tmp_path, "data.max_length=8")) == 1
    err = capsys.readouterr().err
    assert f"Data problem: {memo_parquet}, row 0" in err and "data.truncation=left" in err
    assert not (tmp_path / "ckpt").exists()


# ------------------------------------------------------------------------------------------------ two processes
def _sft_rank(rank, argv):
    assert main(argv) == 0  # joins the process group the helper made (file:// rendezvous, gloo)


@pytest.mark.slow
def test_two_processes_take_the_same_steps_as_one(tiny_qwen2_dir, memo_parquet, tmp_path, monkeypatch):
    from tests.workers.engine.helpers import run_ranks

    args = (*SGD_LIKE, "data.micro_batch_size_per_gpu=2", "trainer.total_training_steps=2")
    one = run(monkeypatch, tmp_path / "one", *command(tiny_qwen2_dir, memo_parquet, tmp_path / "one", *args))
    two_dir = tmp_path / "two"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(two_dir / "metrics.jsonl"))  # inherited by the ranks
    run_ranks(_sft_rank, 2, tmp_path, command(tiny_qwen2_dir, memo_parquet, two_dir, *args))
    with open(two_dir / "metrics.jsonl") as f:
        two = {line["step"]: line["data"] for line in map(json.loads, f)}  # rank 0 logs alone
    assert sorted(two) == [1, 2]
    for step in (1, 2):
        assert two[step]["train/loss"] == pytest.approx(one[step]["train/loss"], rel=1e-6)
        assert two[step]["train/grad_norm"] == pytest.approx(one[step]["train/grad_norm"], rel=1e-5)
    step_dir = two_dir / "ckpt" / "global_step_2"
    assert {"model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"} <= set(os.listdir(step_dir))
    weights_one, weights_two = hf_weights(tmp_path / "one" / "ckpt" / "global_step_2"), hf_weights(step_dir)
    for name in weights_one:
        torch.testing.assert_close(weights_two[name], weights_one[name], rtol=0, atol=1e-6, msg=name)
