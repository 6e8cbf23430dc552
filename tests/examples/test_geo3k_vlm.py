"""Vision-language GRPO end to end: the geo3k preprocessing script on a generated fixture, then the original's
Qwen2.5-VL geo3k command line, scaled down to a tiny random Qwen2.5-VL on CPU (local backend, and one step
on two Ray workers)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.models.vlm_models import save_tiny_qwen2_5_vl
from verl.trainer.main_ppo import main

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "examples" / "data_preprocess"

# A random model never writes \boxed{answer}: geo3k's rule would score every response 0 and every GRPO advantage
# would be 0. This custom reward (loaded the way users load theirs) varies per response.
VARIED_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return len(set(solution_str)) / 10.0
"""


@pytest.fixture(scope="module")
def geo3k(tmp_path_factory, tiny_tokenizer_dir):
    root = tmp_path_factory.mktemp("geo3k")
    for command in (["fixtures/make_geo3k_fixture.py", "--out", root / "raw"],
                    ["geo3k.py", "--local_dataset_path", root / "raw", "--local_dir", root / "data"]):
        subprocess.run([sys.executable, str(SCRIPTS / command[0]), *map(str, command[1:])], cwd=REPO, check=True,
                       capture_output=True)
    (root / "varied_reward.py").write_text(VARIED_REWARD)
    return {"train": str(root / "data" / "train.parquet"), "test": str(root / "data" / "test.parquet"),
            "model": save_tiny_qwen2_5_vl(str(root / "model"), tiny_tokenizer_dir), "root": root}


def test_geo3k_rows_carry_images(geo3k):
    frame = pd.read_parquet(geo3k["train"])
    assert len(frame) == 4 and set(frame["data_source"]) == {"hiyouga/geometry3k"}
    row = frame.iloc[0]
    assert row["prompt"][0]["content"].startswith("<image>Find x.")
    assert len(row["images"]) == 1 and row["images"][0]["bytes"][:4] == b"\x89PNG"
    assert row["reward_model"]["ground_truth"] == "5"


def command(geo3k, run_dir, *extra):
    """run_qwen2_5_vl-7b.sh's keys with small numbers, CPU; the rollout engine left at its default (native), which
    encodes each prompt's images once and generates with the language model."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={geo3k['train']}", f"data.val_files={geo3k['test']}",
        "data.train_batch_size=2", "data.max_prompt_length=256", "data.max_response_length=8",
        "data.filter_overlong_prompts=True", "data.truncation=error", "data.image_key=images",
        f"actor_rollout_ref.model.path={geo3k['model']}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.01",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.freeze_vision_tower=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "algorithm.use_kl_in_reward=False",
        f"custom_reward_function.path={geo3k['root'] / 'varied_reward.py'}",
        "custom_reward_function.name=compute_score",
        "trainer.logger=['console','file']", "trainer.val_before_train=False", "trainer.test_freq=2",
        "trainer.save_freq=-1", "trainer.total_training_steps=2", "trainer.total_epochs=15",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.device=cpu", "trainer.backend=local",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        f"trainer.default_local_dir={run_dir}/checkpoints", "trainer.project_name=e2e", "trainer.experiment_name=geo3k",
        *extra,
    ]


@pytest.mark.slow
def test_geo3k_grpo_with_a_tiny_qwen2_5_vl(geo3k, tmp_path, monkeypatch, capsys):
    metrics_file = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics_file))
    assert main(command(geo3k, tmp_path)) == 0
    assert "[rollout] actor_rollout_ref.rollout.name=native cannot generate" not in capsys.readouterr().out
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        data = record["data"]
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean"):
            assert math.isfinite(data[key]), (key, data[key])
    assert any(k.startswith("val-core/hiyouga/geometry3k/") for k in records[-1]["data"])


@pytest.mark.slow
def test_geo3k_grpo_on_two_ray_workers(geo3k, tmp_path, monkeypatch, ray_session):
    """The batch is split over two Ray actors: each rank's rows carry their pixels (multi_modal_inputs) and 3-row
    M-RoPE positions across the process boundary, into generate and the packed actor forward alike."""
    metrics_file = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics_file))
    assert main(command(geo3k, tmp_path, "trainer.backend=ray", "trainer.n_gpus_per_node=2",
                        "trainer.total_training_steps=1", "trainer.test_freq=-1")) == 0
    [record] = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    data = record["data"]
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean"):
        assert math.isfinite(data[key]), (key, data[key])
    # The same fp32 weights and inputs on each rank: the actor's log-probs are generate's, up to rounding.
    assert data["training/rollout_probs_diff_max"] < 1e-5
    assert data["perf/throughput"] == pytest.approx(data["perf/total_num_tokens"] / data["perf/time_per_step"] / 2)


@pytest.mark.slow
def test_geo3k_grpo_in_colocate_async(geo3k, tmp_path, monkeypatch):
    """The asynchronous trainer streams image prompts: groups generated a policy version ahead are trained, their
    rows carrying pixels and M-RoPE positions into the actor's update."""
    metrics_file = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics_file))
    assert main(command(geo3k, tmp_path, "trainer.v1.trainer_mode=colocate_async", "trainer.test_freq=-1",
                        "trainer.v1.sampler.max_off_policy_threshold=1")) == 0
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert max(r["data"]["async/staleness/max"] for r in records) == 1  # step 2 trained groups of version 0
    for key in ("actor/pg_loss", "actor/grad_norm", "training/rollout_probs_diff_max"):
        assert all(math.isfinite(r["data"][key]) for r in records), key


def test_text_model_refuses_image_data(geo3k, tiny_qwen2_dir, tmp_path, capsys):
    assert main(command(geo3k, tmp_path, f"actor_rollout_ref.model.path={tiny_qwen2_dir}",
                        "actor_rollout_ref.actor.freeze_vision_tower=False")) == 1
    err = capsys.readouterr().err
    assert "train.parquet, row 0, column 'images' (data.image_key)" in err
    assert "actor_rollout_ref.model.path is a text-only model" in err


def test_rows_with_videos_stop_the_run_before_any_worker(geo3k, tmp_path, capsys):
    frame = pd.read_parquet(geo3k["train"])
    frame["videos"] = [[] for _ in range(len(frame))]
    frame.at[1, "videos"] = [{"path": "clip.mp4"}]
    frame.to_parquet(tmp_path / "with_videos.parquet")
    assert main(command(geo3k, tmp_path, f"data.train_files={tmp_path / 'with_videos.parquet'}")) == 1
    err = capsys.readouterr().err
    assert f"Cannot start: {tmp_path / 'with_videos.parquet'}, row 1, column 'videos' (data.video_key)" in err
    assert "does not support video inputs" in err
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_geo3k_ppo_with_a_vision_language_critic(geo3k, tmp_path, monkeypatch):
    """PPO (GAE) on image prompts: the critic is a vision-language value model too (the policy's path, plus a value
    head), so its values and its update read each row's pixels and M-RoPE positions, as the actor's do."""
    import verl.workers.critic as critic_module

    pixels = []  # per critic forward (values, then the update's micro-batches): the image patches it was given
    real = critic_module.forward_values

    def spy(*args, multi_modal_inputs=None, **kwargs):
        pixels.append(0 if multi_modal_inputs is None else len(multi_modal_inputs["pixel_values"]))
        return real(*args, multi_modal_inputs=multi_modal_inputs, **kwargs)

    monkeypatch.setattr(critic_module, "forward_values", spy)
    metrics_file = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics_file))
    assert main(command(geo3k, tmp_path, "algorithm.adv_estimator=gae", "critic.optim.lr=1e-3",
                        "critic.ppo_micro_batch_size_per_gpu=2", "critic.model.fsdp_config.dtype=float32",
                        "trainer.total_training_steps=1", "trainer.test_freq=-1")) == 0
    [record] = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    data = record["data"]
    for key in ("critic/vf_loss", "critic/grad_norm", "critic/values/mean", "actor/pg_loss"):
        assert math.isfinite(data[key]) and (key != "critic/grad_norm" or data[key] > 0), (key, data[key])
    assert len(pixels) >= 2 and all(pixels), pixels  # every geo3k row holds a picture


def test_a_text_critic_for_a_vision_language_policy_stops_naming_the_key(geo3k, tiny_qwen2_dir, tmp_path, capsys):
    assert main(command(geo3k, tmp_path, "algorithm.adv_estimator=gae", f"critic.model.path={tiny_qwen2_dir}")) == 1
    err = capsys.readouterr().err
    assert f"critic.model.path={tiny_qwen2_dir!r} is a text model" in err and "cannot read the prompts' images" in err
    assert not (tmp_path / "checkpoints").exists()
    assert main(command(geo3k, tmp_path, "algorithm.adv_estimator=gae", "critic.model.lora_rank=8")) == 1
    assert "- critic.model.lora_rank: a LoRA adapter on a vision-language critic" in capsys.readouterr().err
