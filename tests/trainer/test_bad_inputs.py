"""The catalogue of user mistakes that must stop a run before any worker starts: each is run through
``python3 -m verl.trainer.main_ppo`` (its ``main``) and must exit 1 with a message that names the problem
(key, file or row) and the fix, without touching what an earlier run wrote (its checkpoint and metrics)."""

import hashlib
import os

import pandas as pd
import pytest

from verl.trainer.main_ppo import main

from .test_main_ppo_e2e import article_command, gsm8k_setup  # noqa: F401  (the fixture)

AR = "actor_rollout_ref"


def _rows(setup, **change):
    frame = pd.read_parquet(setup["train"]).head(4)
    for column, value in change.items():
        frame[column] = [value] * len(frame)
    return frame


def bad_data_source(setup, tmp):
    path = tmp / "bad_source.parquet"
    _rows(setup, data_source="my/task").to_parquet(path)
    return [f"data.train_files={path}"]


def none_ground_truth(setup, tmp):
    path = tmp / "no_truth.parquet"
    _rows(setup, reward_model={"style": "rule", "ground_truth": None}).to_parquet(path)
    return [f"data.train_files={path}"]


def model_copy(setup, tmp, drop):
    folder = tmp / f"model_without_{drop}"
    folder.mkdir()
    for name in os.listdir(setup["model"]):
        if not name.startswith(drop):
            os.symlink(os.path.join(setup["model"], name), folder / name)
    return [f"{AR}.model.path={folder}", f"critic.model.path={folder}"]


def offline_hub_id(setup, tmp, monkeypatch):
    from verl.trainer import preflight

    monkeypatch.setattr(preflight, "_hub_reachable", lambda timeout=3.0: False)
    return [f"{AR}.model.path=Qwen/Qwen2.5-0.5B-Instruct", f"critic.model.path={setup['model']}"]


def numina_without_sandbox(setup, tmp, monkeypatch):
    from verl.sandbox import process as sandbox

    monkeypatch.setattr(sandbox, "isolation", lambda: "no `unshare` binary (util-linux) on this machine")
    path = tmp / "numina.parquet"
    _rows(setup, data_source="numina_olympiads").to_parquet(path)
    return [f"data.train_files={path}"]


def numina_without_pylatexenc(setup, tmp, monkeypatch):
    from verl.rewards.scorers import prime_math
    from verl.sandbox.process import SandboxUnavailable

    def missing():
        raise SandboxUnavailable("the numina_* grader needs the Python package 'pylatexenc': pip install pylatexenc")

    monkeypatch.setattr(prime_math, "check_sandbox", missing)
    path = tmp / "numina.parquet"
    _rows(setup, data_source="numina_cn_k12").to_parquet(path)
    return [f"data.train_files={path}"]


def not_a_checkpoint(setup, tmp):
    (tmp / "global_step_3").mkdir()
    return ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={tmp}/global_step_3"]


def cuda_without_gpu(setup, tmp, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return ["trainer.device=cuda"]


CASES = {
    "missing data file": (lambda s, t: ["data.train_files=" + str(t / "nope.parquet")],
                          ["data.train_files:", "nope.parquet' does not exist", "preprocessing script"]),
    "misspelt key": (lambda s, t: ["trainer.n_gpu_per_node=2"],
                     ["trainer.n_gpu_per_node", "did you mean trainer.n_gpus_per_node?"]),
    "data_source without a rule reward": (bad_data_source,
                                          ["bad_source.parquet, row 0: data_source='my/task' has no rule reward",
                                           "custom_reward_function.path"]),
    "numina rows on a machine without the sandbox": (
        numina_without_sandbox, ["numina.parquet, row 0: data_source='numina_olympiads' is scored by running or "
                                 "evaluating model text, which needs the sandbox", "no `unshare` binary",
                                 "score these rows with a custom reward"]),
    "numina rows without the grader's packages": (
        numina_without_pylatexenc, ["numina.parquet, row 0: data_source='numina_cn_k12' cannot be scored here",
                                    "pip install pylatexenc"]),
    "ground truth None": (none_ground_truth, ["no_truth.parquet, row 0: reward_model.ground_truth is missing or None",
                                              "Fix or drop those rows"]),
    "model folder without config.json": (lambda s, t: model_copy(s, t, "config.json"),
                                         [f"{AR}.model.path:", "holds no config.json"]),
    "model folder without weights": (lambda s, t: model_copy(s, t, "model.safetensors"),
                                     [f"{AR}.model.path:", "holds no weights", "download is incomplete"]),
    "model folder without tokenizer": (lambda s, t: model_copy(s, t, "tokenizer"),
                                       [f"{AR}.model.path:", "holds no tokenizer files", "tokenizer_path"]),
    "hub id while offline": (offline_hub_id, [f"{AR}.model.path: 'Qwen/Qwen2.5-0.5B-Instruct' is no folder here",
                                              "not in the Hugging Face cache", "huggingface-cli download"]),
    "cuda without a GPU": (cuda_without_gpu, ["trainer.device: is cuda", "Set trainer.device=cpu"]),
    "resume path that is no checkpoint": (not_a_checkpoint, ["trainer.resume_from_path:", "holds no actor/ checkpoint",
                                                             "global_step_N"]),
    "missing reward file": (lambda s, t: [f"custom_reward_function.path={t}/reward.py"],
                            ["custom_reward_function.path", "does not exist", "Point it at the Python file"]),
    "multi-turn without raw chat": (lambda s, t: [f"{AR}.rollout.multi_turn.enable=True",
                                                  "data.return_raw_chat=False"],
                                    ["data.return_raw_chat: must be True", "Set data.return_raw_chat=True"]),
    "dynamic sampling with one sample": (lambda s, t: ["algorithm.filter_groups.enable=True",
                                                       "algorithm.filter_groups.metric=acc", f"{AR}.rollout.n=1"],
                                         [f"{AR}.rollout.n: is 1, but algorithm.filter_groups keeps groups whose "
                                          "samples differ", "Set actor_rollout_ref.rollout.n to 2 or more"]),
    "reward_kwargs the scorer does not take": (lambda s, t: ["+custom_reward_function.reward_kwargs.bonus=1"],
                                                ["row 0: the scorer of data_source='openai/gsm8k' takes no "
                                                 "custom_reward_function.reward_kwargs ['bonus']",
                                                 "(it takes ['method', 'format_score', 'score', 'normalize'])"]),
    "negative learning rate": (lambda s, t: [f"{AR}.actor.optim.lr=-1e-6"],
                               [f"{AR}.actor.optim.lr: must be > 0, got -1e-06", "Set a positive value"]),
}


def _digest(folder):
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            digest.update(name.encode())
            with open(os.path.join(root, name), "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


@pytest.mark.parametrize("case", list(CASES))
def test_a_mistake_stops_before_any_worker_and_says_what_to_do(case, gsm8k_setup, tmp_path, monkeypatch,  # noqa: F811
                                                                capsys):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    def started(self):
        raise AssertionError(f"{case}: workers were started")

    monkeypatch.setattr(RayPPOTrainer, "init_workers", started)
    # What an earlier run left: a checkpoint and its metrics, which the failed start must not touch.
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "global_step_1" / "actor").mkdir(parents=True)
    (run_dir / "checkpoints" / "global_step_1" / "actor" / "model.pt").write_bytes(b"weights")
    (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("1")
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text('{"step": 1, "data": {"actor/pg_loss": 0.1}}\n')
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics))
    before = _digest(run_dir)

    make, expected = CASES[case]
    extra = make(gsm8k_setup, tmp_path, monkeypatch) if make.__code__.co_argcount == 3 else make(gsm8k_setup, tmp_path)
    args = article_command(gsm8k_setup, str(run_dir), "algorithm.adv_estimator=grpo", f"{AR}.rollout.n=2",
                           "trainer.backend=local", "trainer.n_gpus_per_node=1", *extra)
    assert main(args) == 1
    err = capsys.readouterr().err
    missing = [fragment for fragment in expected if fragment not in err]
    assert not missing, f"{case}: the message lacks {missing}:\n{err}"
    assert _digest(run_dir) == before
