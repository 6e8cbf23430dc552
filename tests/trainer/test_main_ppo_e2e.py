"""The seed article's GSM8K command line, scaled down to a tiny model, run end to end on CPU.

Only the model path, the data paths, the batch sizes and the lengths differ from the article's
command, plus ``trainer.device=cpu`` (``trainer.n_gpus_per_node`` then counts worker processes).
"""

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import pandas as pd
import psutil
import pytest

from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Every step must log these (issue #3's list), present and finite.
STEP_METRICS = [
    "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/grad_norm", "actor/lr",
    "critic/score/mean", "critic/score/max", "critic/score/min", "critic/rewards/mean", "critic/advantages/mean",
    "critic/returns/mean", "response_length/mean", "response_length/max", "response_length/min",
    "response_length/clip_ratio", "prompt_length/mean", "prompt_length/clip_ratio",
    "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/adv", "timing_s/update_actor",
    "timing_s/step", "timing_per_token_ms/gen", "timing_per_token_ms/update_actor",
    "perf/total_num_tokens", "perf/time_per_step", "perf/throughput", "perf/max_memory_allocated_gb",
    "perf/cpu_memory_used_gb", "training/global_step", "training/epoch",
]
CRITIC_METRICS = ["critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm",
                  "critic/values/mean", "critic/vf_explained_var", "timing_s/values", "timing_s/update_critic",
                  "perf/mfu/critic"]
KL_IN_REWARD_METRICS = ["actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff", "timing_s/ref"]
KL_LOSS_METRICS = ["actor/kl_loss", "actor/kl_coef", "timing_s/ref"]


@pytest.fixture(scope="module")
def gsm8k_setup(tmp_path_factory):
    """The bundled GSM8K-format sample preprocessed by the real script, and a tiny Qwen2 model whose
    tokenizer was trained on those prompts (so they fit in 96 tokens)."""
    from verl.utils.tiny_model import build_tiny_causal_lm, build_tiny_tokenizer

    root = tmp_path_factory.mktemp("e2e")
    data = root / "gsm8k"
    subprocess.run([sys.executable, os.path.join(REPO, "examples/data_preprocess/gsm8k.py"), "--local_dataset_path",
                    os.path.join(REPO, "examples/data_preprocess/fixtures/gsm8k"), "--local_dir", str(data)],
                   check=True, capture_output=True)
    prompts = [row[0]["content"] for row in pd.read_parquet(data / "train.parquet")["prompt"]]
    tokenizer = build_tiny_tokenizer(str(root / "tokenizer"), corpus=prompts + ["#### 72 The answer is"])
    model = build_tiny_causal_lm(str(root / "model"), tokenizer, arch="qwen2")
    return {"root": root, "train": str(data / "train.parquet"), "test": str(data / "test.parquet"), "model": model}


def article_command(setup, run_dir, *extra):
    """The article's command (section 3.3), scaled: same keys, small numbers, CPU workers."""
    model = setup["model"]
    return [
        f"data.train_files={setup['train']}",
        f"data.val_files={setup['test']}",
        "data.train_batch_size=4",
        "data.max_prompt_length=96",
        "data.max_response_length=12",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "critic.optim.lr=1e-3",
        f"critic.model.path={model}",
        "critic.ppo_micro_batch_size_per_gpu=1",
        "algorithm.kl_ctrl.kl_coef=0.001",
        "trainer.logger=['console','file']",
        "trainer.val_before_train=False",
        "trainer.n_gpus_per_node=2",
        "trainer.nnodes=1",
        "trainer.save_freq=1",
        "trainer.test_freq=2",
        "trainer.total_epochs=15",
        # scaled-down run
        "trainer.total_training_steps=2",
        "trainer.device=cpu",
        f"trainer.default_local_dir={run_dir}/checkpoints",
        "trainer.project_name=e2e",
        "trainer.experiment_name=" + os.path.basename(run_dir),
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "critic.model.fsdp_config.dtype=float32",
        *extra,
    ]


PPO = ["algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=True"]
GRPO = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.01", "actor_rollout_ref.actor.kl_loss_type=low_var_kl"]

# A random tiny model never writes "#### <answer>", so GSM8K's rule scores every response 0 and every
# GRPO advantage would be 0. This custom reward (loaded the way users load theirs) varies per response.
VARIED_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return len(set(solution_str)) / 10.0
"""


@pytest.fixture(scope="module")
def varied_reward(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "varied_reward.py"
    path.write_text(VARIED_REWARD)
    return [f"custom_reward_function.path={path}", "custom_reward_function.name=compute_score"]


def run(setup, tmp_path, name, *extra, monkeypatch):
    run_dir = tmp_path / name
    metrics_file = run_dir / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics_file))
    assert main(article_command(setup, str(run_dir), *extra)) == 0
    with open(metrics_file) as f:
        return run_dir, [json.loads(line) for line in f]


def assert_step_metrics(records, expected_keys):
    steps = [r["step"] for r in records]
    assert steps == [1, 2]
    for record in records:
        data = record["data"]
        missing = [k for k in expected_keys if k not in data]
        assert not missing, f"step {record['step']} lacks {missing}"
        bad = {k: data[k] for k in expected_keys if not math.isfinite(data[k])}
        assert not bad, f"step {record['step']} has non-finite {bad}"
    # validation ran on the last step (test_freq=2)
    assert any(k.startswith("val-core/openai/gsm8k/") for k in records[-1]["data"])


def assert_checkpoints(run_dir, with_critic):
    ckpt = run_dir / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "2"
    for step in (1, 2):
        folder = ckpt / f"global_step_{step}"
        assert (folder / "actor" / "model_world_size_2_rank_1.pt").is_file()
        assert (folder / "data.pt").is_file()
        assert (folder / "critic").is_dir() == with_critic


def learning_metrics(record):
    """The metrics a resumed run must reproduce exactly (not timings or throughput)."""
    return {k: v for k, v in record["data"].items()
            if k.split("/")[0] in ("actor", "critic", "response_length", "prompt_length", "val-core")}


def assert_resume_matches(setup, tmp_path, name, run_dir, records, extra, monkeypatch):
    """Resume from step 1's checkpoint: step 2 must reproduce the uninterrupted run's step 2."""
    _, resumed = run(setup, tmp_path, name, *extra, "trainer.resume_mode=resume_path",
                     f"trainer.resume_from_path={run_dir}/checkpoints/global_step_1", monkeypatch=monkeypatch)
    assert [r["step"] for r in resumed] == [2]
    expected, got = learning_metrics(records[1]), learning_metrics(resumed[0])
    assert expected.keys() == got.keys()
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key


def assert_export_matches_training(step_dir, tmp_path):
    """The model merger turns the 2-rank actor shards into a Hugging Face folder whose weights and
    logits equal the full model the live FSDP actor gathered at save time (huggingface/, hf_model).
    Its command line's ``main`` runs in this process (``make demo``, tests/examples/test_demo.py, runs
    ``python -m verl.model_merger`` itself)."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForTokenClassification,
        AutoTokenizer,
    )

    from verl.model_merger.__main__ import main as merger

    actor = step_dir / "actor"
    assert merger(["test", "--backend", "fsdp", "--local_dir", str(actor), "--test_hf_dir",
                   str(actor / "huggingface")]) == 0
    target = tmp_path / "exported_actor"
    assert merger(["merge", "--backend", "fsdp", "--local_dir", str(actor), "--target_dir", str(target)]) == 0
    exported = AutoModelForCausalLM.from_pretrained(target)
    gathered = AutoModelForCausalLM.from_pretrained(actor / "huggingface")
    ids = AutoTokenizer.from_pretrained(target)("#### 72 The answer is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(exported(ids).logits, gathered(ids).logits)
    critic_target = tmp_path / "exported_critic"
    assert merger(["merge", "--backend", "fsdp", "--local_dir", str(step_dir / "critic"), "--target_dir",
                   str(critic_target)]) == 0
    assert AutoModelForTokenClassification.from_pretrained(critic_target).config.num_labels == 1


PPO_SAVING_HF = [*PPO, "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"]


@pytest.fixture(scope="module")
def ppo_on_one_ray_node(gsm8k_setup, tmp_path_factory, ray_session):
    """Two PPO steps on two Ray workers of one node (run once: the two-node test compares with it)."""
    extra = [*PPO_SAVING_HF, "trainer.backend=ray"]
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_dir, records = run(gsm8k_setup, tmp_path_factory.mktemp("ppo"), "ppo_ray", *extra, monkeypatch=monkeypatch)
    return run_dir, records, extra


@pytest.mark.parametrize("backend", ["ray", "local"])
def test_ppo_with_critic_reference_and_kl_in_reward(backend, gsm8k_setup, tmp_path, monkeypatch, request):
    if backend == "ray":
        run_dir, records, extra = request.getfixturevalue("ppo_on_one_ray_node")
    else:
        extra = [*PPO_SAVING_HF, "trainer.backend=local", "trainer.n_gpus_per_node=1"]
        run_dir, records = run(gsm8k_setup, tmp_path, "ppo_local", *extra, monkeypatch=monkeypatch)
    assert_step_metrics(records, STEP_METRICS + CRITIC_METRICS + KL_IN_REWARD_METRICS)
    if backend == "ray":
        assert_checkpoints(run_dir, with_critic=True)
        assert_resume_matches(gsm8k_setup, tmp_path, "ppo_ray_resumed", run_dir, records, extra, monkeypatch)
        assert_export_matches_training(run_dir / "checkpoints" / "global_step_2", tmp_path)


@pytest.mark.parametrize("backend", ["ray", "local"])
def test_grpo_with_kl_loss(backend, gsm8k_setup, varied_reward, tmp_path, monkeypatch, request):
    """On Ray, the two workers are on the session's two nodes (trainer.nnodes=2); one node of two workers
    runs GRPO with KL loss in the LoRA and colocate_async tests."""
    extra = [*GRPO, *varied_reward, f"trainer.backend={backend}", "trainer.n_gpus_per_node=1"]
    if backend == "ray":
        assert len([n for n in request.getfixturevalue("ray_session").nodes() if n["Alive"]]) == 2
        extra.append("trainer.nnodes=2")
    run_dir, records = run(gsm8k_setup, tmp_path, f"grpo_{backend}", *extra, monkeypatch=monkeypatch)
    assert_step_metrics(records, STEP_METRICS + KL_LOSS_METRICS)
    assert not any(k.startswith("critic/vf_") for k in records[0]["data"])
    assert all(r["data"]["critic/advantages/max"] > 0 for r in records)  # the policy gradient is not trivially 0
    assert all(r["data"]["actor/kl_loss"] >= 0 for r in records)  # low_var_kl is never negative
    if backend == "local":
        assert_resume_matches(gsm8k_setup, tmp_path, "grpo_local_resumed", run_dir, records, extra, monkeypatch)


def test_a_killed_worker_stops_the_run_with_a_clear_error(gsm8k_setup, tmp_path, ray_session):
    """SIGKILL one worker process mid-run: the CLI names the role and rank and exits non-zero fast. The CLI
    joins the session's Ray cluster through RAY_ADDRESS, as under ``ray job submit``."""
    run_dir = tmp_path / "killed"
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo",
           *article_command(gsm8k_setup, str(run_dir), *GRPO, "trainer.total_training_steps=50",
                            "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.logger=['console']")]
    # The session's cluster listens on loopback only: init_ray joins it there (Ray alone would swap 127.0.0.1
    # for the host's address and retry forever).
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}

    def worker_processes():  # the cluster's worker processes are children of its raylets, started here
        found = {}
        for p in psutil.Process().children(recursive=True):
            try:
                if "WorkerDict" in " ".join(p.cmdline()):
                    found[p.pid] = p
            except psutil.Error:  # ended meanwhile
                pass
        return found

    earlier = set(worker_processes())  # workers of this session's earlier runs, should any linger
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    stuck = threading.Timer(180, proc.kill)  # a run that never reaches step 1 fails the test, not the session
    stuck.start()
    output = []
    try:
        # wait for the first step line: the workers are up and training
        for line in proc.stdout:
            output.append(line)
            if line.startswith("step:1 "):
                break
        workers = [p for pid, p in sorted(worker_processes().items()) if pid not in earlier]
        assert len(workers) == 2, "".join(output)
        killed_at = time.monotonic()
        workers[1].send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=60)
        elapsed = time.monotonic() - killed_at
    finally:
        stuck.cancel()
        if proc.poll() is None:
            proc.kill()
    text = "".join(output) + rest
    assert proc.returncode != 0
    assert elapsed < 60
    assert "Training stopped" in text and "actor_rollout" in text and "rank" in text, text[-3000:]


def test_local_backend_reproduces_the_ray_backend(gsm8k_setup, varied_reward, tmp_path, monkeypatch, ray_session):
    """One worker in this process or one Ray actor: the same seed gives the same step."""
    one_step = [*GRPO, *varied_reward, "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1",
                "trainer.save_freq=-1", "trainer.test_freq=-1"]
    _, on_ray = run(gsm8k_setup, tmp_path, "same_ray", *one_step, "trainer.backend=ray", monkeypatch=monkeypatch)
    _, local = run(gsm8k_setup, tmp_path, "same_local", *one_step, "trainer.backend=local", monkeypatch=monkeypatch)
    expected, got = learning_metrics(on_ray[0]), learning_metrics(local[0])
    assert expected.keys() == got.keys()
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key


def test_critic_and_reward_model_can_have_devices_of_their_own(gsm8k_setup, tmp_path, monkeypatch, ray_session):
    """Role-to-pool mapping: two actor workers share one pool, the critic gets one worker of its own,
    the reward model another; the reference's parameters are offloaded between uses (a no-op for CPU
    workers: the run must still take its step). Four workers over the session's two Ray nodes."""
    _, records = run(gsm8k_setup, tmp_path, "own_pools", *PPO, "trainer.total_training_steps=1",
                     "trainer.save_freq=-1", "trainer.test_freq=-1", "critic.enable_resource_pool=true",
                     "critic.n_gpus_per_node=1", "critic.nnodes=1", "reward_model.enable=true",
                     f"reward_model.model.path={gsm8k_setup['model']}", "reward_model.micro_batch_size_per_gpu=2",
                     "reward_model.enable_resource_pool=true", "reward_model.n_gpus_per_node=1",
                     "reward_model.nnodes=1", "actor_rollout_ref.ref.fsdp_config.param_offload=true",
                     monkeypatch=monkeypatch)
    data = records[0]["data"]
    assert all(math.isfinite(data[k]) for k in CRITIC_METRICS + ["critic/score/mean", "timing_s/ref"])
    # throughput counts the devices of every pool: 2 for the actor + 1 for the critic + 1 for the RM
    assert data["perf/throughput"] == pytest.approx(data["perf/total_num_tokens"] / data["perf/time_per_step"] / 4)


def test_two_nodes_give_the_one_node_result_and_resume(gsm8k_setup, tmp_path, monkeypatch, ray_session,
                                                       ppo_on_one_ray_node):
    """trainer.nnodes=2 x n_gpus_per_node=1 on the session's two Ray nodes (rank 0's node serves the
    rendezvous): two PPO steps with critic and reference, checkpoints written by the ranks of both nodes,
    the same numbers, validation's included, as the one-node run with two workers and the same global batch;
    resuming on two nodes reproduces step 2. (GRPO on two nodes: test_grpo_with_kl_loss[ray].)"""
    assert len([n for n in ray_session.nodes() if n["Alive"]]) == 2
    two_nodes = [*PPO_SAVING_HF, "trainer.backend=ray", "trainer.nnodes=2", "trainer.n_gpus_per_node=1"]
    run_dir, records = run(gsm8k_setup, tmp_path, "two_nodes", *two_nodes, monkeypatch=monkeypatch)
    one_node = ppo_on_one_ray_node[1]
    assert [r["step"] for r in records] == [r["step"] for r in one_node] == [1, 2]
    for spread, packed in zip(records, one_node):
        expected, got = learning_metrics(packed), learning_metrics(spread)
        assert expected.keys() == got.keys()
        for key in expected:
            assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
    assert_checkpoints(run_dir, with_critic=True)
    assert_resume_matches(gsm8k_setup, tmp_path, "two_nodes_resumed", run_dir, records, two_nodes, monkeypatch)


# Every sample of a prompt whose answer has an even number of characters scores 0.5 (a group with no
# spread, which dynamic sampling drops); the others score by their text, so their samples differ.
HALF_CONSTANT_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if len(str(ground_truth)) % 2 == 0:
        return 0.5
    return sum(map(ord, solution_str)) % 97 / 97
"""


def test_dapo_dynamic_sampling_generates_until_the_batch_holds_varied_groups(gsm8k_setup, tmp_path, monkeypatch,
                                                                             capsys):
    """3 of the 12 sample prompts give varied scores: rounds of 4 prompts are generated until 2 groups
    with a spread are kept for each step; with a limit of one round the run stops, saying why."""
    reward = tmp_path / "half_constant.py"
    reward.write_text(HALF_CONSTANT_REWARD)
    dapo = [*GRPO, f"custom_reward_function.path={reward}", "trainer.backend=local", "trainer.n_gpus_per_node=1",
            "data.train_batch_size=2", "data.gen_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=score",
            "trainer.save_freq=-1", "trainer.test_freq=-1"]
    _, records = run(gsm8k_setup, tmp_path, "dapo", *dapo, monkeypatch=monkeypatch)
    for record in records:
        data = record["data"]
        assert data["train/num_kept_groups"] >= 2
        assert data["train/num_generated_groups"] == 4 * data["train/num_gen_batches"]
        assert data["critic/score/mean"] != 0.5 and data["critic/advantages/max"] > 0  # only varied groups remain
    assert max(r["data"]["train/num_gen_batches"] for r in records) >= 2
    # The recipe's metric: acc, which the dapo reward manager records from a plain-number scorer.
    _, records = run(gsm8k_setup, tmp_path, "dapo_acc", *dapo, "algorithm.filter_groups.metric=acc",
                     "reward_model.reward_manager=dapo", "trainer.total_training_steps=1", monkeypatch=monkeypatch)
    assert records[0]["data"]["train/num_kept_groups"] >= 2 and records[0]["data"]["critic/advantages/max"] > 0
    constant = tmp_path / "constant.py"
    constant.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                        "    return 0.5\n")
    limited = [*dapo, f"custom_reward_function.path={constant}", "algorithm.filter_groups.max_num_gen_batches=1"]
    assert main(article_command(gsm8k_setup, str(tmp_path / "dapo_limited"), *limited)) == 1
    err = capsys.readouterr().err
    assert ("Training stopped: algorithm.filter_groups: after 1 generation round(s) of data.gen_batch_size=4 "
            "prompts, only 0 of the 2 prompt groups needed") in err
    assert "max_num_gen_batches" in err


def test_python_api_fit_runs_the_same_loop(gsm8k_setup, tmp_path, monkeypatch):
    """The article's Python API: config objects, PPOTrainer(...).fit(), no Ray needed (local backend)."""
    from verl.trainer import (
        ActorConfig,
        ActorRolloutRefConfig,
        DataConfig,
        ModelConfig,
        PPOAlgorithmConfig,
        PPOTrainer,
        RolloutConfig,
        TrainerConfig,
    )

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "api.jsonl"))
    trainer = PPOTrainer(
        data=DataConfig(train_files=gsm8k_setup["train"], train_batch_size=2, max_prompt_length=96,
                        max_response_length=8),
        actor_rollout_ref=ActorRolloutRefConfig(
            model=ModelConfig(path=gsm8k_setup["model"]),
            actor=ActorConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2),
            rollout=RolloutConfig(name="hf", n=2, log_prob_micro_batch_size_per_gpu=4)),
        algorithm=PPOAlgorithmConfig(adv_estimator="grpo"),
        trainer=TrainerConfig(backend="local", device="cpu", n_gpus_per_node=1, total_training_steps=1,
                              logger=["console", "file"], default_local_dir=str(tmp_path / "ckpt")),
    )
    metrics = trainer.fit()
    assert metrics["training/global_step"] == 1 and math.isfinite(metrics["actor/pg_loss"])
    assert json.loads((tmp_path / "api.jsonl").read_text().splitlines()[0])["step"] == 1


@pytest.mark.parametrize("estimator", ["remax", "rloo", "reinforce_plus_plus"])
def test_other_estimators_run_a_step(estimator, gsm8k_setup, varied_reward, tmp_path, monkeypatch):
    """ReMax adds the greedy-baseline pass (timing_s/gen_max); the others only change the advantages."""
    _, records = run(gsm8k_setup, tmp_path, estimator, f"algorithm.adv_estimator={estimator}",
                     "actor_rollout_ref.rollout.n=2", *varied_reward, "trainer.backend=local",
                     "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1", "trainer.save_freq=-1",
                     "trainer.test_freq=-1", monkeypatch=monkeypatch)
    data = records[0]["data"]
    assert math.isfinite(data["actor/pg_loss"]) and data["critic/advantages/max"] > 0
    assert ("timing_s/gen_max" in data) == (estimator == "remax")


def test_grpo_with_lora_trains_the_adapter_and_resumes(gsm8k_setup, varied_reward, tmp_path, monkeypatch,
                                                       ray_session):
    """GRPO with KL loss and a rank-8 adapter on two Ray workers: the reference is the base model (KL 0
    while the adapter is still zero, then > 0), checkpoints hold the adapter only, resume is exact."""
    pytest.importorskip("peft")
    lora = [*GRPO, *varied_reward, "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
            "actor_rollout_ref.actor.optim.lr=2e-2", "trainer.test_freq=-1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4"]  # one update per step: step 1 sees B = 0 only
    run_dir, records = run(gsm8k_setup, tmp_path, "grpo_lora", *lora, monkeypatch=monkeypatch)
    first, second = records[0]["data"], records[1]["data"]
    assert first["actor/kl_loss"] == pytest.approx(0.0, abs=1e-7)  # B = 0: actor == base == reference
    assert second["actor/kl_loss"] > 1e-5  # the adapter moved the actor away from the base model
    shards = torch_load(run_dir / "checkpoints" / "global_step_1" / "actor" / "model_world_size_2_rank_1.pt")
    assert shards["state_dict"] and all("lora_" in name for name in shards["state_dict"])
    assert_resume_matches(gsm8k_setup, tmp_path, "grpo_lora_resumed", run_dir, records, lora, monkeypatch)


def torch_load(path):
    import torch

    return torch.load(path, weights_only=True)


@pytest.fixture
def scripted_agent_engine():
    """A rollout engine that plays an agent: first turn a Python tool call, second turn an answer.
    Registered the way users add engines; the local backend runs it in this process."""
    import torch

    from verl.workers.rollout.base import BaseRollout, build_rollout_output
    from verl.workers.rollout.registry import register_rollout

    class ScriptedAgent(BaseRollout):
        SCRIPT = ['<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(24 * 3)"}}</tool_call>',
                  "The tool says 72, so #### 72"]

        def generate_sequences(self, prompts):
            params = self.sampling_params(prompts.meta_info)
            rows = []
            for ids, mask in zip(prompts.batch["input_ids"], prompts.batch["attention_mask"]):
                turn = self.tokenizer.decode(ids[mask.bool()].tolist()).count("<|im_start|>assistant") - 1
                rows.append(self.tokenizer(self.SCRIPT[min(turn, 1)])["input_ids"] + [self.tokenizer.eos_token_id])
            width = max(map(len, rows))
            responses = torch.tensor([r + [params.pad_token_id] * (width - len(r)) for r in rows])
            return build_rollout_output(prompts, responses, torch.full(responses.shape, -1.0), params)

    from verl.workers.rollout import registry

    register_rollout("scripted_agent")(ScriptedAgent)
    yield "scripted_agent"
    del registry._ROLLOUTS["scripted_agent"]  # other tests list the built-in engines


def multi_turn_grpo(tmp_path, engine):
    """One GRPO step of tool-calling episodes with the sandboxed Python tool, on the scripted engine."""
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: verl.tools.code_interpreter.CodeInterpreterTool\n"
                     "    config: {cpu_seconds: 2}\n    tool_schema:\n      type: function\n"
                     "      function: {name: code_interpreter, parameters: {type: object}}\n")
    return ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "trainer.backend=local",
            "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1", "trainer.save_freq=-1",
            "trainer.test_freq=-1", "data.return_raw_chat=True", "data.max_response_length=256",
            f"actor_rollout_ref.rollout.name={engine}", "actor_rollout_ref.rollout.multi_turn.enable=True",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}"]


def test_multi_turn_grpo_runs_tool_calls_and_trains_on_the_models_tokens(gsm8k_setup, tmp_path, monkeypatch,
                                                                         scripted_agent_engine):
    from verl.sandbox.process import isolation

    if isolation() != "namespaces":
        pytest.skip(isolation())
    reward = tmp_path / "reward.py"  # 1 when the sandbox's output (72) sits between the call and the answer
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    call, _, rest = solution_str.partition('</tool_call>')\n"
                      "    return float('72' in rest.split('#### 72')[0] and '72' not in call)\n")
    _, records = run(gsm8k_setup, tmp_path, "multi_turn", *multi_turn_grpo(tmp_path, scripted_agent_engine),
                     f"custom_reward_function.path={reward}", monkeypatch=monkeypatch)
    data = records[0]["data"]
    assert data["agent_loop/num_turns/mean"] == 3 and data["agent_loop/tool_calls/mean"] == 1
    assert data["agent_loop/tool_errors/mean"] == 0 and data["agent_loop/tool_time_s/mean"] > 0
    # The tool's result ("72") and the template tokens around it are in the sequence but not trained on.
    assert data["agent_loop/response_length_with_tools/mean"] > data["response_length/mean"] > 0
    assert data["critic/score/mean"] == 1.0  # every response holds the tool's output before its answer
    assert math.isfinite(data["actor/pg_loss"])


def test_step_time_leaves_out_validation_and_checkpoints(gsm8k_setup, varied_reward, tmp_path, monkeypatch):
    """timing_s/step and perf/throughput measure the training step only, as the original's do."""
    import time

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    monkeypatch.setattr(RayPPOTrainer, "_validate", lambda self: time.sleep(3) or {})
    _, records = run(gsm8k_setup, tmp_path, "timers", *GRPO, *varied_reward, "trainer.backend=local",
                     "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1", "trainer.test_freq=1",
                     monkeypatch=monkeypatch)
    data = records[0]["data"]
    assert data["timing_s/testing"] >= 3 and data["timing_s/save_checkpoint"] > 0
    # The step is its stages (within 1.5 s of bookkeeping), not the 3 s of validation more: a bound that holds however
    # slowly a loaded machine runs the stages.
    outside = ("timing_s/step", "timing_s/testing", "timing_s/save_checkpoint")
    stages = sum(v for k, v in data.items() if k.startswith("timing_s/") and k not in outside)
    assert stages <= data["timing_s/step"] < stages + 1.5
    assert data["perf/time_per_step"] == data["timing_s/step"]


def test_auto_resume_skips_a_truncated_checkpoint_and_logs_each_step_once(gsm8k_setup, varied_reward, tmp_path,
                                                                          monkeypatch, caplog):
    import logging

    extra = [*GRPO, *varied_reward, "trainer.backend=local", "trainer.n_gpus_per_node=1", "trainer.test_freq=-1"]
    run_dir, records = run(gsm8k_setup, tmp_path, "truncated", *extra, monkeypatch=monkeypatch)
    shard = run_dir / "checkpoints" / "global_step_2" / "actor" / "model_world_size_1_rank_0.pt"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # a crash while it was copied
    with caplog.at_level(logging.WARNING):
        _, again = run(gsm8k_setup, tmp_path, "truncated", *extra, monkeypatch=monkeypatch)
    warnings = "\n".join(r.getMessage() for r in caplog.records)
    assert f"cannot resume from {run_dir}/checkpoints/global_step_2" in warnings
    assert "model_world_size_1_rank_0.pt cannot be read" in warnings and "trying the previous checkpoint" in warnings
    # resumed from step 1, step 2 trained again; the metrics file holds each step once
    assert [r["step"] for r in again] == [1, 2]
    assert learning_metrics(again[1]) == pytest.approx(learning_metrics(records[1]), rel=1e-5, abs=1e-7)


def test_multi_turn_with_a_simulated_user_passes_turn_scores_to_the_reward(gsm8k_setup, tmp_path, monkeypatch,
                                                                           scripted_agent_engine):
    """interaction_config_path through main_ppo: after the tool turn the model answers, the simulated user
    asks once more, the model answers again; the reward function sees the user's turn scores."""
    from verl.sandbox.process import isolation

    if isolation() != "namespaces":
        pytest.skip(isolation())
    (tmp_path / "doubting_user.py").write_text(
        "from verl.interactions.base import BaseInteraction\n\n"
        "class DoubtingUser(BaseInteraction):\n"
        "    async def generate_response(self, instance_id, messages, **kwargs):\n"
        "        asked = self._instances[instance_id].setdefault('asked', 0) + 1\n"
        "        self._instances[instance_id]['asked'] = asked\n"
        "        return asked > 1, 'Are you sure?', 0.5 * asked, {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    users = tmp_path / "users.yaml"
    users.write_text("interaction:\n  - name: doubter\n    class_name: doubting_user.DoubtingUser\n")
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(extra_info['turn_scores'] == [0.5, 1.0] and 'Are you sure?' in solution_str)\n")
    _, records = run(gsm8k_setup, tmp_path, "multi_turn_user", *multi_turn_grpo(tmp_path, scripted_agent_engine),
                     f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={users}",
                     f"custom_reward_function.path={reward}", monkeypatch=monkeypatch)
    data = records[0]["data"]
    # assistant (tool call), tool, assistant, user ("Are you sure?"), assistant; then the user ends it
    assert data["agent_loop/num_turns/mean"] == 5 and data["agent_loop/turn_score/mean"] == 1.5
    assert data["critic/score/mean"] == 1.0


@pytest.mark.parametrize("mode", ["decoupled", "bypass"])
def test_rollout_correction_weighs_and_rejects_in_both_modes(mode, gsm8k_setup, varied_reward, tmp_path, monkeypatch):
    """Decoupled: pi_old is recomputed and the correction is applied against it on the driver (rollout_corr/*
    and the log-prob gap logged). Bypass: the rollout's log-probs are pi_old (no old_log_prob pass) and the
    update's loss weighs against the current policy."""
    corr = "algorithm.rollout_correction"
    extra = [f"{corr}.rollout_is=token", f"{corr}.rollout_rs=token_k1", f"{corr}.rollout_rs_threshold=0.5_2.0",
             "actor_rollout_ref.rollout.calculate_log_probs=true", "algorithm.adv_estimator=grpo",
             "actor_rollout_ref.rollout.n=2", *varied_reward, "trainer.backend=local", "trainer.n_gpus_per_node=1",
             "trainer.total_training_steps=1", "trainer.save_freq=-1", "trainer.test_freq=-1"]
    if mode == "bypass":
        extra += [f"{corr}.bypass_mode=true", f"{corr}.loss_type=reinforce"]
    _, records = run(gsm8k_setup, tmp_path, mode, *extra, monkeypatch=monkeypatch)
    data = records[0]["data"]
    assert math.isfinite(data["actor/pg_loss"])
    for key in ("rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/kl"):
        assert math.isfinite(data[key]), key
    # Decoupled: the same weights generated, so the engine's log-probs are pi_old's up to float error. Bypass: the
    # ratio is the current policy's, which has taken an optimizer step after the first mini-batch (lr 1e-3).
    assert data["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3 if mode == "decoupled" else 0.05)
    assert data["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    assert ("timing_s/old_log_prob" in data) == (mode == "decoupled")
    assert ("training/rollout_probs_diff_mean" in data) == (mode == "decoupled")


ASYNC = ["trainer.v1.trainer_mode=colocate_async"]


def test_colocate_async_allowed_no_staleness_is_the_synchronous_run(gsm8k_setup, varied_reward, tmp_path, monkeypatch,
                                                                    ray_session):
    """max_off_policy_threshold=0: one batch in flight, generated and trained at one version, cut over the two ranks
    as the synchronous split cuts it: every learning metric equal, bit for bit."""
    extra = [*GRPO, *varied_reward, "trainer.test_freq=-1", "trainer.save_freq=-1"]
    _, sync = run(gsm8k_setup, tmp_path, "sync", *extra, monkeypatch=monkeypatch)
    _, unstale = run(gsm8k_setup, tmp_path, "async0", *extra, *ASYNC, "trainer.v1.sampler.max_off_policy_threshold=0",
                     monkeypatch=monkeypatch)
    assert [r["step"] for r in unstale] == [1, 2]
    for a, b in zip(sync, unstale):
        assert learning_metrics(a) == learning_metrics(b)
        assert b["data"]["async/staleness/max"] == 0 and b["data"]["async/in_flight_groups"] == 0


def _prompts_of(tokenizer, dump_dir, steps, n) -> list[str]:
    """The prompts trained at ``steps`` (rollout_data_dir dumps hold each of the n samples)."""
    texts = [json.loads(line)["input"] for step in steps for line in open(os.path.join(dump_dir, f"{step}.jsonl"))]
    counts = {t: texts.count(t) for t in texts}
    assert set(counts.values()) == {n}
    return sorted(counts)


def _held_at(tokenizer, step_dir) -> list[str]:
    """The prompts an asynchronous checkpoint holds: finished groups, groups in flight and queued prompts."""
    import torch

    state = torch.load(os.path.join(step_dir, "data.pt"), weights_only=False)["async_rollout"]
    prompts = [g["prompt"] for g in state["groups"]] + list(state["queue"])
    return sorted(tokenizer.decode(p.batch["input_ids"][0], skip_special_tokens=True) for p in prompts)


def test_an_async_run_resumed_mid_run_trains_every_prompt_once(gsm8k_setup, varied_reward, tmp_path, monkeypatch):
    """Checkpoint at step 2 of 4 while groups are in flight; the resumed run's steps 3-4, plus what it still
    holds at the end, are the uninterrupted run's prompts: none lost, none trained twice (10 of the 12 prompts of
    one epoch: 4 steps of 2, and the 2 groups in flight at the end)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gsm8k_setup["model"])
    extra = [*GRPO, *varied_reward, *ASYNC, "trainer.v1.sampler.max_off_policy_threshold=1",
             "trainer.v1.sampler.max_off_policy_strategy=wait", "trainer.backend=local", "trainer.n_gpus_per_node=1",
             "data.train_batch_size=2", "trainer.total_training_steps=4", "trainer.save_freq=2", "trainer.test_freq=-1"]
    whole, records = run(gsm8k_setup, tmp_path, "whole", *extra, f"trainer.rollout_data_dir={tmp_path}/dump_whole",
                         monkeypatch=monkeypatch)
    assert max(r["data"]["async/staleness/max"] for r in records) == 1  # groups did run across an update
    resumed, later = run(gsm8k_setup, tmp_path, "resumed", *extra, f"trainer.rollout_data_dir={tmp_path}/dump_resumed",
                         "trainer.resume_mode=resume_path",
                         f"trainer.resume_from_path={whole}/checkpoints/global_step_2", monkeypatch=monkeypatch)
    assert [r["step"] for r in later] == [3, 4]
    before = _prompts_of(tokenizer, tmp_path / "dump_whole", [1, 2], 2)
    after = _prompts_of(tokenizer, tmp_path / "dump_resumed", [3, 4], 2)
    held = _held_at(tokenizer, resumed / "checkpoints" / "global_step_4")
    assert len(before + after + held) == len(set(before + after + held)) == 10
    uninterrupted = _prompts_of(tokenizer, tmp_path / "dump_whole", [1, 2, 3, 4], 2)
    assert sorted(before + after + held) == sorted(uninterrupted + _held_at(tokenizer, whole / "checkpoints" /
                                                                             "global_step_4"))


SEPARATE = ["trainer.v1.trainer_mode=separate_async", "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
            "trainer.v1.separate_async.parameter_sync_step=2", "actor_rollout_ref.rollout.calculate_log_probs=true"]


def check_weights_reach_a_rollout_that_decodes_during_the_update(setup, tmp_path, name, extra, monkeypatch):
    """Allowed no staleness, every group is generated with the weights it is trained on, so the rollout's log-probs
    are the trainer's (to float error) after every weight update, after a resume too (the checkpoint's weights go
    first); validation borrows the rollout while it holds groups. Allowed staleness, the rollout generates the next
    groups while the trainer trains, so trained groups are a version old."""
    extra = [*extra, "trainer.total_training_steps=3", "trainer.test_freq=3"]
    exact = [*extra, "trainer.v1.sampler.max_off_policy_threshold=0"]
    run_dir, records = run(setup, tmp_path, f"{name}0", *exact, monkeypatch=monkeypatch)
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        data = record["data"]
        assert data["training/rollout_probs_diff_max"] < 1e-6 and data["async/staleness/max"] == 0
        assert data["perf/weight_sync_gb"] > 0 and "timing_s/update_weights" in data
    assert any(k.startswith("val-core/") for k in records[-1]["data"])
    _, resumed = run(setup, tmp_path, f"{name}0_resumed", *exact, "trainer.resume_mode=resume_path",
                     f"trainer.resume_from_path={run_dir}/checkpoints/global_step_2", monkeypatch=monkeypatch)
    assert [r["step"] for r in resumed] == [3] and resumed[0]["data"]["training/rollout_probs_diff_max"] < 1e-6
    _, ahead = run(setup, tmp_path, f"{name}1", *extra, "trainer.v1.sampler.max_off_policy_threshold=1",
                   "trainer.total_training_steps=2", "trainer.save_freq=-1", monkeypatch=monkeypatch)
    assert max(r["data"]["async/staleness/max"] for r in ahead) == 1
    assert max(r["data"]["training/rollout_probs_diff_max"] for r in ahead) > 1e-6  # generated one update ago


def test_separate_async_sends_the_weights_to_a_rollout_of_its_own(gsm8k_setup, varied_reward, tmp_path, monkeypatch,
                                                                  ray_session):
    """One trainer worker and one rollout worker in pools of their own (gloo on CPU)."""
    check_weights_reach_a_rollout_that_decodes_during_the_update(gsm8k_setup, tmp_path, "separate",
                                                                 [*GRPO, *varied_reward, *SEPARATE], monkeypatch)


OVERLAP = [*ASYNC, "trainer.v1.colocate_async.overlap_generation=true", "trainer.backend=local",
           "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.calculate_log_probs=true"]


def test_colocate_async_overlapping_generation_decodes_from_a_copy_refreshed_after_every_update(
        gsm8k_setup, varied_reward, tmp_path, monkeypatch):
    """overlap_generation: the colocated rollout decodes on a thread of its own, from its own copy of the weights,
    while the actor trains in the same process (the local backend); each update's weights are copied into it."""
    import threading

    check_weights_reach_a_rollout_that_decodes_during_the_update(gsm8k_setup, tmp_path, "overlap",
                                                                 [*GRPO, *varied_reward, *OVERLAP], monkeypatch)
    # The driver's process lives on after each run: its rollout thread (the model copy, the cache) ended with it.
    assert not [t for t in threading.enumerate() if t.name == "verl-rollout-stream"]


def test_the_one_step_off_policy_recipe_runs_from_its_own_entry_point(gsm8k_setup, varied_reward, tmp_path,
                                                                       monkeypatch, ray_session):
    """The original's recipe command line (its rollout.* keys and hybrid_engine=False) through its module."""
    from verl.experimental.one_step_off_policy.async_main_ppo import main as recipe_main

    run_dir = tmp_path / "one_step"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(run_dir / "metrics.jsonl"))
    argv = article_command(gsm8k_setup, str(run_dir), *GRPO, *varied_reward, "trainer.n_gpus_per_node=1",
                           "trainer.test_freq=-1", "trainer.save_freq=-1", "actor_rollout_ref.hybrid_engine=False",
                           "rollout.nnodes=1", "rollout.n_gpus_per_node=1")
    assert recipe_main(argv) == 0
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["data"]["async/staleness/max"] <= 1 and r["data"]["perf/weight_sync_gb"] > 0 for r in records)
