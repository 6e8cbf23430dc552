"""The pre-flight check: files and machine facts a run needs, reported before anything starts."""

import pytest

from verl.trainer.config import ConfigError
from verl.trainer.config_validation import compose_ppo_config
from verl.trainer.main_ppo import main
from verl.trainer.preflight import preflight, preflight_errors


def config(*overrides):
    return compose_ppo_config(["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct", *overrides])


@pytest.fixture(autouse=True)
def hub_answers(monkeypatch):
    """The other checks, on a machine where the hub id of the model could be downloaded."""
    from verl.trainer import preflight as module

    monkeypatch.setattr(module, "_hub_reachable", lambda timeout=3.0: True)


def test_a_model_path_that_is_neither_a_folder_nor_reachable_is_named_in_seconds(tmp_path, monkeypatch):
    import time

    from verl.trainer import preflight as module

    train = tmp_path / "train.parquet"
    train.write_bytes(b"")
    probes = []
    monkeypatch.setattr(module, "_hub_reachable", lambda timeout=3.0: probes.append(timeout) or False)
    tic = time.perf_counter()
    errors = preflight_errors(config(f"data.train_files={train}", "trainer.device=cpu",
                                     "critic.model.path=models/Qwen 0.5B"), cuda_available=False)
    assert time.perf_counter() - tic < 5 and probes == [3.0]  # one bounded probe, no hub retries
    assert errors[0].startswith("actor_rollout_ref.model.path: 'Qwen/Qwen2.5-0.5B-Instruct' is no folder here (")
    assert "not in the Hugging Face cache, and the hub cannot be reached (offline)" in errors[0]
    # Not an id at all (a space): a mistyped folder, said without asking the hub.
    critic = [e for e in errors if e.startswith("critic.model.path")]
    assert critic == [f"critic.model.path: 'models/Qwen 0.5B' is no folder here ({tmp_path.cwd()}/models/Qwen 0.5B) "
                      "and not a Hugging Face id. Give the model's folder (with config.json)"]
    # Joining a cluster: its nodes may have the cache or the network for the models, so only the tokenizer,
    # which the driver itself loads, is checked.
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    joined = preflight_errors(config(f"data.train_files={train}", "trainer.device=cpu",
                                     "critic.model.path=models/Qwen 0.5B"), cuda_available=False)
    assert len(joined) == 1 and joined[0].startswith("actor_rollout_ref.model.path: 'Qwen/Qwen2.5-0.5B-Instruct'")
    monkeypatch.delenv("RAY_ADDRESS")
    # A cached id needs no hub.
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", lambda repo, name: f"/cache/{repo}/{name}")
    assert preflight_errors(config(f"data.train_files={train}", "trainer.device=cpu"), cuda_available=False) == []


def test_the_hub_probe_is_bounded_and_trusts_a_proxy(monkeypatch):
    import time

    from verl.trainer import preflight as module

    monkeypatch.undo()  # the real probe, not the fixture's
    for key in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "https://192.0.2.1")  # TEST-NET-1: never answers
    tic = time.perf_counter()
    assert module._hub_reachable(timeout=1.0) is False
    assert time.perf_counter() - tic < 2.0
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")  # through a proxy: left to the loader
    assert module._hub_reachable(timeout=1.0) is True


def test_missing_files_gpu_and_resume_folder_are_named(tmp_path):
    train = tmp_path / "train.parquet"
    train.write_bytes(b"")
    errors = preflight_errors(config(f"data.train_files=[{train},{tmp_path}/more.parquet]",
                                     f"data.val_files={tmp_path}/test.parquet", "trainer.device=cuda",
                                     "trainer.resume_mode=resume_path",
                                     f"trainer.resume_from_path={tmp_path}/global_step_7"), cuda_available=False)
    assert errors == [
        f"data.train_files: '{tmp_path}/more.parquet' does not exist. Give the parquet file(s) the preprocessing "
        "script wrote (e.g. python3 examples/data_preprocess/gsm8k.py --local_dir DIR)",
        f"data.val_files: '{tmp_path}/test.parquet' does not exist. Give the parquet file(s) the preprocessing "
        "script wrote (e.g. python3 examples/data_preprocess/gsm8k.py --local_dir DIR)",
        "trainer.device: is cuda, but this machine has no visible GPU (torch.cuda.is_available() is False). Set "
        "trainer.device=cpu to train on the CPU, or check CUDA_VISIBLE_DEVICES and the driver",
        f"trainer.resume_from_path: '{tmp_path}/global_step_7' does not exist. Give a checkpoint folder "
        "(.../global_step_N) or use trainer.resume_mode=auto",
    ]
    (tmp_path / "global_step_7").mkdir()
    errors = preflight_errors(config(f"data.train_files={train}", "trainer.device=cpu",
                                     "trainer.resume_mode=resume_path",
                                     f"trainer.resume_from_path={tmp_path}/global_step_7"))
    assert errors == [f"trainer.resume_from_path: '{tmp_path}/global_step_7' holds no actor/ checkpoint: it is not "
                      "a global_step_N folder written by this trainer"]
    preflight(config(f"data.train_files={train}", "trainer.device=cuda"), cuda_available=True)
    with pytest.raises(ConfigError, match="Cannot start"):
        preflight(config(f"data.train_files={train}", "trainer.device=cuda"), cuda_available=False)


def test_joining_a_cluster_skips_the_local_gpu_check(tmp_path, monkeypatch):
    train = tmp_path / "train.parquet"
    train.write_bytes(b"")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # the GPUs are on the cluster's nodes
    assert preflight_errors(config(f"data.train_files={train}", "trainer.device=cuda"), cuda_available=False) == []


def test_main_ppo_stops_before_starting_anything(tmp_path, capsys):
    assert main([f"data.train_files={tmp_path}/nope.parquet", "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B",
                 "trainer.device=cpu", "trainer.n_gpus_per_node=1"]) == 1
    assert f"- data.train_files: '{tmp_path}/nope.parquet' does not exist" in capsys.readouterr().err


def test_ctrl_c_and_a_full_disk_end_with_what_to_do(tmp_path, capsys, monkeypatch):
    import errno

    from verl.trainer import main_ppo
    from verl.trainer.ppo import checkpointing

    train = tmp_path / "train.parquet"
    train.write_bytes(b"")
    args = [f"data.train_files={train}", "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B", "trainer.device=cpu",
            "trainer.n_gpus_per_node=1", f"trainer.default_local_dir={tmp_path}/ckpt"]

    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(main_ppo, "run_ppo", interrupted)
    assert main(args) == 130
    assert "Training interrupted. No complete checkpoint was written yet" in capsys.readouterr().err

    (tmp_path / "ckpt" / "global_step_4").mkdir(parents=True)
    checkpointing.mark_complete(str(tmp_path / "ckpt"), 4)

    def disk_full(config):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(main_ppo, "run_ppo", disk_full)
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "The disk is full" in err and f"The last complete checkpoint is {tmp_path}/ckpt/global_step_4" in err


def test_rows_a_rule_reward_cannot_score_stop_before_any_worker(tmp_path, tiny_qwen2_dir, capsys):
    import pandas as pd

    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 1+1?"}],
             "reward_model": {"style": "rule", "ground_truth": "2"}},
            {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 2+2?"}],
             "reward_model": {"style": "rule", "ground_truth": None}},
            {"data_source": "my/task", "prompt": [{"role": "user", "content": "Hi"}],
             "reward_model": {"style": "rule", "ground_truth": "x"}}]
    train = tmp_path / "train.parquet"
    pd.DataFrame(rows).to_parquet(train)
    args = [f"data.train_files={train}", f"actor_rollout_ref.model.path={tiny_qwen2_dir}", "trainer.device=cpu",
            "trainer.n_gpus_per_node=1", "trainer.backend=local", "data.train_batch_size=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1", "algorithm.adv_estimator=grpo"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"Cannot start: data.train_files: rows a rule reward cannot score (first 2):\n  {train}, row 1: " \
           "reward_model.ground_truth is missing or None\n" in err
    assert f"{train}, row 2: data_source='my/task' has no rule reward" in err and "Known data sources:" in err
    # With reward_kwargs every row is still checked (the first row of a source included), and a keyword
    # the scorer does not take is named once per data source.
    rows[0]["reward_model"] = {"style": "rule", "ground_truth": None}
    pd.DataFrame(rows).to_parquet(train)
    assert main([*args, "+custom_reward_function.reward_kwargs.normalize=true"]) == 1
    err = capsys.readouterr().err
    assert f"{train}, row 0: reward_model.ground_truth is missing or None" in err
    assert f"{train}, row 1: reward_model.ground_truth is missing or None" in err
    assert main([*args, "+custom_reward_function.reward_kwargs.strict_box_verify=true"]) == 1
    assert (f"{train}, row 0: the scorer of data_source='openai/gsm8k' takes no custom_reward_function.reward_kwargs "
            "['strict_box_verify']") in capsys.readouterr().err
