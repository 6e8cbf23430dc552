"""``reward_model.launch_reward_fn_async``: the step's batch is scored on the driver's reward thread while the
workers compute its old log-probs, with the synchronous step's results. One tiny GRPO step on CPU (local backend)."""

import logging
import threading
import time

import pandas as pd
import pytest
import torch

from verl.trainer.config_validation import checked_config
from verl.trainer.main_ppo import load_inputs
from verl.trainer.ppo import ray_trainer, scoring
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

# Scores that differ per response and an extra-info column, so that a row given another row's score shows.
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    score = len(set(solution_str)) / 10.0 + extra_info["index"] / 100.0
    return {"score": score, "acc": float(score > 0.5)}
"""
QUESTIONS = ["What is 2 + 3?", "Name a colour.", "Count to four.", "Say hello."]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_qwen2_dir):
    root = tmp_path_factory.mktemp("async_reward")
    pd.DataFrame([{"data_source": "toy", "prompt": [{"role": "user", "content": q}], "ability": "chat",
                   "reward_model": {"style": "rule", "ground_truth": "x"}, "extra_info": {"index": i}}
                  for i, q in enumerate(QUESTIONS)]).to_parquet(root / "train.parquet")
    (root / "reward.py").write_text(REWARD)
    return root, tiny_qwen2_dir


def step_command(root, model, tmp_path, *extra) -> list[str]:
    return [
        f"data.train_files={root / 'train.parquet'}", "data.train_batch_size=4", "data.max_prompt_length=32",
        "data.max_response_length=6", f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "algorithm.adv_estimator=grpo", f"custom_reward_function.path={root / 'reward.py'}",
        "trainer.backend=local", "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1",
        "trainer.critic_warmup=2",  # no actor update: old_log_prob is a stage of its own, the step ends after adv
        "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[console]",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}", *extra]


def build_trainer(setup, tmp_path, *extra) -> RayPPOTrainer:
    config = checked_config(step_command(*setup, tmp_path, *extra))
    assert config is not None, "the test's config is invalid (see stderr)"
    trainer = RayPPOTrainer(config, *load_inputs(config))
    trainer.init_workers()
    return trainer


class Recorder:
    """Wraps the trainer's reward function and its actor's ``compute_log_prob``: what the reward saw, on which
    thread, and when each ran. With ``handshake`` each waits (up to 10 s) until the other has started, which
    only happens when they run at the same time."""

    def __init__(self, trainer: RayPPOTrainer, handshake: bool = False, error: Exception | None = None):
        self.reward_fn, self.handshake, self.error = trainer.reward_fn, handshake, error
        self.reward_started, self.log_prob_started = threading.Event(), threading.Event()
        self.seen, self.times, self.met = {}, {}, {}
        trainer.reward_fn = self.reward
        group = trainer.workers.actor_rollout
        compute_log_prob = group.compute_log_prob

        def timed_compute_log_prob(batch):
            self.times["log_prob_start"] = time.perf_counter()
            self.log_prob_started.set()
            if self.handshake:
                self.met["log_prob"] = self.reward_started.wait(10)
            try:
                return compute_log_prob(batch)
            finally:
                self.times["log_prob_end"] = time.perf_counter()

        group.compute_log_prob = timed_compute_log_prob
        self.captured = {}
        compute_advantage = trainer._compute_advantage

        def capture(batch, scores, metrics):
            compute_advantage(batch, scores, metrics)
            self.captured = {k: batch.batch[k].clone() for k in ("responses", "token_level_scores", "advantages")}
            self.captured["acc"] = list(batch.non_tensor_batch["acc"])

        trainer._compute_advantage = capture

    def reward(self, data, return_dict=False):
        self.times["reward_start"] = time.perf_counter()
        self.reward_started.set()
        self.seen = {"thread": threading.current_thread(), "responses": data.batch["responses"].clone(),
                     "columns": sorted(data.batch.keys()), "non_tensor": sorted(data.non_tensor_batch),
                     "meta_info": sorted(data.meta_info)}
        if self.handshake:
            self.met["reward"] = self.log_prob_started.wait(10)
        try:
            if self.error is not None:
                raise self.error
            return self.reward_fn(data, return_dict=return_dict)
        finally:
            self.times["reward_end"] = time.perf_counter()


@pytest.fixture(scope="module")
def steps(setup, tmp_path_factory):
    """One step synchronously and one with the key, each on its own trainer (kept for a further step).
    ``trainer.balance_batch`` reorders the rows (with one rank it would keep them): the background scores must
    follow their rows."""
    runs, trainers = {}, []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray_trainer, "balance_batch_partitions", lambda seqlens, k: [list(range(len(seqlens)))[::-1]])
        try:
            for launch_async in (False, True):
                trainers.append(build_trainer(setup, tmp_path_factory.mktemp(f"async_{launch_async}"),
                                              f"reward_model.launch_reward_fn_async={launch_async}"))
                recorder = Recorder(trainers[-1], handshake=launch_async)
                runs[launch_async] = (trainers[-1], trainers[-1].fit(), recorder)
            yield runs
        finally:
            for trainer in trainers:
                trainer.shutdown()


def learning_metrics(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith(("timing_", "perf/"))}


def test_background_reward_gives_the_synchronous_step(steps):
    (_, sync_metrics, sync), (_, async_metrics, background) = steps[False], steps[True]
    # The reward saw the same rows, columns and meta info; the step's results are the same.
    assert torch.equal(background.seen["responses"], sync.seen["responses"])
    for key in ("columns", "non_tensor", "meta_info"):
        assert background.seen[key] == sync.seen[key]
    assert torch.equal(background.captured["responses"], sync.captured["responses"])
    assert torch.equal(background.captured["responses"], sync.seen["responses"].flip(0))  # the rows were reordered
    for key in ("token_level_scores", "advantages"):
        assert torch.equal(background.captured[key], sync.captured[key]), key
    assert background.captured["acc"] == sync.captured["acc"]
    assert sync.captured["advantages"].abs().sum() > 0  # the scores differ within groups: a real check
    assert learning_metrics(async_metrics) == learning_metrics(sync_metrics)


def test_background_reward_runs_on_its_thread_while_old_log_prob_runs(steps):
    (_, _, sync), (_, async_metrics, background) = steps[False], steps[True]
    # Synchronously the reward runs in the step's thread before old_log_prob; in the background on the reward
    # thread, at the same time as old_log_prob (each saw the other start).
    assert sync.seen["thread"] is threading.main_thread()
    assert sync.times["reward_end"] <= sync.times["log_prob_start"]
    assert background.seen["thread"] is not threading.main_thread()
    assert background.met == {"reward": True, "log_prob": True}
    assert background.times["reward_start"] < background.times["log_prob_end"]
    assert background.times["log_prob_start"] < background.times["reward_end"]
    # timing_s/reward is the time spent scoring (on the reward thread), as in the synchronous step.
    scoring = background.times["reward_end"] - background.times["reward_start"]
    assert scoring <= async_metrics["timing_s/reward"] <= async_metrics["timing_s/step"]


@pytest.mark.parametrize("launch_async", [False, True])
def test_a_reward_error_stops_the_step_with_that_error(steps, launch_async):
    trainer, _, recorder = steps[launch_async]
    recorder.handshake, recorder.error = False, ValueError("no score for row 3")
    trainer.global_steps += 1
    with pytest.raises(ValueError, match="no score for row 3"):
        trainer.train_step(next(trainer._train_batches()))


@pytest.mark.parametrize("extra, reason", [
    (["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc"], "algorithm.filter_groups"),
    (["trainer.v1.trainer_mode=colocate_async", "actor_rollout_ref.rollout.name=native"],
     "trainer.v1.trainer_mode=colocate_async"),
    (["reward_model.enable=True", "reward_model.model.path=${actor_rollout_ref.model.path}"], "generative judge"),
])
def test_where_scores_are_needed_at_once_they_are_scored_as_before_and_it_says_so(setup, steps, tmp_path, caplog,
                                                                                  extra, reason):
    config = checked_config(step_command(*setup, tmp_path, "reward_model.launch_reward_fn_async=True", *extra))
    assert config is not None, "the test's config is invalid (see stderr)"
    built = steps[True][0]  # the same tokenizer and data; the choice is made from the config alone
    with caplog.at_level(logging.INFO, logger=scoring.__name__):
        trainer = RayPPOTrainer(config, built.tokenizer, built.train_dataset)  # starts no workers
    assert trainer.scoring.thread is None
    notes = [r.getMessage() for r in caplog.records if "launch_reward_fn_async" in r.getMessage()]
    assert len(notes) == 1 and reason in notes[0] and "no effect in this run" in notes[0]
