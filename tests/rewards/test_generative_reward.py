"""Generative reward models: a judge LLM served to the user's reward function (verl.rewards.generative).

The judge is a tiny random Llama model, decoding greedily; the reward function is written as the original verl's
GenRM functions are (async, posting an OpenAI chat request to ``reward_router_address``) and scores the judge's
text. The expected judge text is decoded here with transformers' own greedy ``generate`` from the same prompt.
"""

import functools
import json
import math
import textwrap
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.rewards.loading import load_reward_manager

JUDGE_TOKENS = 6

GENRM = textwrap.dedent('''
    import asyncio, json, urllib.request

    def _post(address, payload):
        request = urllib.request.Request(f"http://{address}/v1/chat/completions", data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request) as response:
            return json.loads(response.read())

    async def compute_score(data_source, solution_str, ground_truth, extra_info, reward_router_address,
                            reward_model_tokenizer):
        prompt = f"Question: {extra_info['question']}\\nAnswer: {solution_str}\\nGrade it."
        payload = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": %d}
        result = await asyncio.get_running_loop().run_in_executor(None, _post, reward_router_address, payload)
        judged = result["choices"][0]["message"]["content"]
        return {"score": float(len(judged)) + 0.5 * judged.count("a"), "judge": judged, "prompt": prompt}
''' % JUDGE_TOKENS)

PLAIN = "def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n"


def expected_score(text: str) -> float:
    return float(len(text)) + 0.5 * text.count("a")


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory, tiny_tokenizer_dir):
    """A tiny random Llama judge whose greedy answers differ from prompt to prompt (seed 2; the tiny Qwen2 model
    answers every prompt with the same newlines, which could not tell rows apart)."""
    from verl.utils.tiny_model import build_tiny_causal_lm

    return build_tiny_causal_lm(str(tmp_path_factory.mktemp("judge")), tiny_tokenizer_dir, arch="llama", seed=2,
                                hidden_size=128)


@pytest.fixture(scope="module")
def genrm_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("genrm") / "genrm.py"
    path.write_text(GENRM)
    return str(path)


def reward_config(judge, reward_file, engine="hf", **rollout):
    return {"custom_reward_function": {"path": reward_file, "name": "compute_score"},
            "reward_model": {"enable": True, "model": {"path": judge, "fsdp_config": {"dtype": "float32"}},
                             "rollout": {"name": engine, "prompt_length": 96, "response_length": 16, **rollout}},
            "data": {}}


def policy_batch(tokenizer, answers: list[str]) -> DataProto:
    """Rows as the rollout makes them: left-padded prompts, right-padded responses, the data's columns."""
    prompts = [tokenizer(f"What is {i} + {i}?")["input_ids"] for i in range(len(answers))]
    responses = [tokenizer(a)["input_ids"] for a in answers]
    p, r, pad = max(map(len, prompts)), max(map(len, responses)), tokenizer.pad_token_id or 0
    prompt_ids = torch.tensor([[pad] * (p - len(x)) + x for x in prompts])
    response_ids = torch.tensor([x + [pad] * (r - len(x)) for x in responses])
    mask = torch.tensor([[0] * (p - len(x)) + [1] * len(x) + [1] * len(y) + [0] * (r - len(y))
                         for x, y in zip(prompts, responses)])
    return DataProto.from_dict(
        {"prompts": prompt_ids, "responses": response_ids, "attention_mask": mask,
         "input_ids": torch.cat([prompt_ids, response_ids], 1), "response_mask": mask[:, p:]},
        non_tensors={"data_source": np.array(["toy"] * len(answers), dtype=object),
                     "reward_model": np.array([{"ground_truth": str(2 * i)} for i in range(len(answers))]),
                     "extra_info": np.array([{"question": f"What is {i} + {i}?"} for i in range(len(answers))])})


@functools.cache
def _hf_judge(judge_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(judge_dir), AutoModelForCausalLM.from_pretrained(judge_dir).float().eval()


def greedy_judge_text(judge_dir, prompt: str) -> str:
    """What the judge says to ``prompt`` by transformers' greedy decoding: the chat-templated user turn."""
    tokenizer, model = _hf_judge(judge_dir)
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         tokenize=False)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=JUDGE_TOKENS,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.fixture
def judge_group(judge_dir, genrm_file, request):
    """The reward-model worker as the trainer starts it (local backend), holding the judge and its engine."""
    from verl.single_controller import ClassWithInitArgs
    from verl.single_controller.local import create_colocated_worker_groups
    from verl.workers.fsdp_workers import RewardModelWorker

    config = reward_config(judge_dir, genrm_file, engine=request.param)["reward_model"]
    groups = create_colocated_worker_groups(None, {"rm": ClassWithInitArgs(RewardModelWorker, config=config,
                                                                           generative=True)}, device="cpu")
    groups["rm"].init_model()
    yield groups["rm"], request.param
    groups["rm"].shutdown()


@pytest.mark.parametrize("judge_group", ["hf", "native"], indirect=True)
def test_scores_are_the_reward_function_applied_to_the_judges_greedy_text(judge_group, judge_dir,
                                                                          tiny_tokenizer, genrm_file):
    group, engine = judge_group
    reward = load_reward_manager(reward_config(judge_dir, genrm_file, engine), tiny_tokenizer, num_examine=0)
    served = []

    def generate(prompts):
        served.append(len(prompts))
        return group.generate_sequences(prompts)

    reward.router.attach(generate)
    try:
        data = policy_batch(tiny_tokenizer, ["4", "It is 2", "six, I think", "6"])
        result = reward(data, return_dict=True)
    finally:
        reward.close()
    info, tensor = result["reward_extra_info"], result["reward_tensor"]
    assert sum(served) == 4  # every row asked the judge once
    last = data.batch["response_mask"].sum(-1) - 1
    for i in range(4):
        prompt = f"Question: What is {i} + {i}?\nAnswer: {['4', 'It is 2', 'six, I think', '6'][i]}\nGrade it."
        assert info["prompt"][i] == prompt
        judged = greedy_judge_text(judge_dir, prompt)
        assert info["judge"][i] == judged, engine
        assert tensor[i, last[i]].item() == pytest.approx(expected_score(judged))
        assert tensor[i].abs().sum().item() == pytest.approx(abs(expected_score(judged)))  # nowhere else
    assert tensor.shape == data.batch["responses"].shape
    assert len(set(info["judge"])) == 4  # the judge answered each row differently: rows cannot be mixed up


def test_a_genrm_function_must_take_the_judges_address_and_tokenizer(judge_dir, tiny_tokenizer, tmp_path):
    path = tmp_path / "plain.py"
    path.write_text(PLAIN)
    with pytest.raises(TypeError, match="reward_router_address, reward_model_tokenizer"):
        load_reward_manager(reward_config(judge_dir, str(path)), tiny_tokenizer, num_examine=0)


def test_the_router_refuses_a_prompt_longer_than_the_judges_prompt_length(judge_dir, tiny_tokenizer, genrm_file):
    reward = load_reward_manager(reward_config(judge_dir, genrm_file, prompt_length=8), tiny_tokenizer,
                                 num_examine=0)
    payload = {"messages": [{"role": "user", "content": "a long question " * 20}]}
    request = urllib.request.Request(f"http://{reward.router.address}/v1/chat/completions",
                                     data=json.dumps(payload).encode())
    try:
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request)
    finally:
        reward.close()
    assert info.value.code == 400
    assert "reward_model.rollout.prompt_length=8" in json.loads(info.value.read())["error"]["message"]


def test_the_reward_loop_keys_flow_into_the_typed_config():
    from verl.trainer.config.config import CustomRewardFunctionConfig
    from verl.workers.config import RewardModelConfig
    from verl.workers.config.reward_model import uses_generative_reward

    config = RewardModelConfig.from_config({"enable": True, "rollout": {"name": "hf", "response_length": 64},
                                            "num_workers": 8})
    assert (config.use_reward_loop, config.num_workers, config.rollout.name) == (True, 8, "hf")
    assert (config.rollout.response_length, config.rollout.prompt_length) == (64, 2048)  # the yaml's 2048
    path = CustomRewardFunctionConfig.from_config({"path": "genrm.py"}).path
    assert uses_generative_reward(config.enable, config.use_reward_loop, path)
    assert not uses_generative_reward(True, False, path)  # use_reward_loop=false: a classifier reward model
    assert not uses_generative_reward(False, True, path)  # no reward model
    assert not uses_generative_reward(True, True, CustomRewardFunctionConfig().path)  # a classifier reward model


# ----------------------------------------------------------------------------------- the router, without a model
def _router(tokenizer, **rollout):
    from verl.rewards.generative import JudgeRouter
    from verl.workers.config import RewardModelConfig

    config = RewardModelConfig.from_config({"rollout": {"prompt_length": 32, "response_length": 16, **rollout}})
    return JudgeRouter(tokenizer, config.rollout, "judge")


def _echo(prompts: DataProto) -> DataProto:
    """A stand-in judge that answers each prompt with the prompt's own tokens."""
    rows = [ids[mask.bool()] for ids, mask in zip(prompts.batch["input_ids"], prompts.batch["attention_mask"])]
    width = max(len(r) for r in rows)
    responses = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        responses[i, :len(row)], mask[i, :len(row)] = row, 1
    return DataProto.from_dict({"responses": responses, "response_mask": mask})


def _post(address: str, payload, path: str = "/v1/completions", timeout: float = 30) -> tuple[int, dict]:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    request = urllib.request.Request(f"http://{address}{path}", data=data)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_router_serves_hundreds_of_clients_connecting_at_once(tiny_tokenizer):
    from concurrent.futures import ThreadPoolExecutor
    import threading

    clients = 300  # far more than socketserver's default listen backlog of 5
    router = _router(tiny_tokenizer, max_num_seqs=clients)
    served = []
    router.attach(lambda prompts: served.append(len(prompts)) or _echo(prompts))
    start = threading.Barrier(clients)

    def ask(i):
        start.wait()
        return _post(router.address, {"prompt": f"row {i}", "max_tokens": 16})

    try:
        with ThreadPoolExecutor(clients) as pool:
            answers = list(pool.map(ask, range(clients)))
    finally:
        router.close()
    assert [status for status, _ in answers] == [200] * clients
    assert [body["choices"][0]["text"] for _, body in answers] == [f"row {i}" for i in range(clients)]
    assert sum(served) == clients  # each request generated once


def test_the_router_answers_a_bad_request_with_400_naming_what_is_wrong(tiny_tokenizer, monkeypatch):
    router = _router(tiny_tokenizer)
    router.attach(_echo)
    chat = "/v1/chat/completions"
    try:
        cases = [
            (b"[1, 2]", chat, "the request body must be a JSON object, got a JSON array"),
            (b"{not json", chat, "the request body is not JSON"),
            ({"prompt": "hi", "max_tokens": -3}, "/v1/completions", "'max_tokens' must be a positive integer, got -3"),
            ({"prompt": "hi", "max_completion_tokens": 0}, "/v1/completions",
             "'max_completion_tokens' must be a positive integer, got 0"),
            ({"prompt": "hi", "max_tokens": "8"}, "/v1/completions", "'max_tokens' must be a positive integer"),
            ({"prompt": "hi", "temperature": "hot"}, "/v1/completions", "'temperature' must be a number, got 'hot'"),
            ({"messages": [{"role": "user"}]}, chat, "the judge's chat template cannot render 'messages'"),
        ]
        for payload, path, message in cases:
            status, body = _post(router.address, payload, path)
            assert (status, body["error"]["type"]) == (400, "BadRequestError"), payload
            assert message in body["error"]["message"], (payload, body)
        # The router still serves good requests after the bad ones.
        assert _post(router.address, {"prompt": "fine"})[1]["choices"][0]["text"] == "fine"
        # An unexpected failure while answering: 500 with its text, not a dropped connection.
        monkeypatch.setattr(router, "reply", lambda request: 1 / 0)
        status, body = _post(router.address, {"prompt": "fine"})
        assert status == 500 and "ZeroDivisionError: division by zero" in body["error"]["message"]
    finally:
        router.close()


def test_a_failing_judge_fails_every_waiting_and_later_request_fast(tiny_tokenizer):
    from concurrent.futures import ThreadPoolExecutor
    import time

    from verl.rewards.generative import JudgeFailed

    router = _router(tiny_tokenizer)
    calls = []

    def dead_worker(prompts):
        calls.append(len(prompts))
        raise RuntimeError("the reward-model worker died")

    router.attach(dead_worker)
    begin = time.monotonic()
    try:
        with ThreadPoolExecutor(8) as pool:  # different max_tokens: separate generations of one gathering
            answers = list(pool.map(lambda i: _post(router.address, {"prompt": f"row {i}", "max_tokens": 1 + i % 2}),
                                    range(8)))
        later = _post(router.address, {"prompt": "again"})
    finally:
        router.close()
    assert time.monotonic() - begin < 10
    for status, body in [*answers, later]:
        assert status == 500
        assert body["error"]["message"] == ("the judge failed to generate: RuntimeError: the reward-model worker died")
    assert len(calls) == 1  # nothing generates after the failure
    with pytest.raises(JudgeFailed, match="reward_model.model.path=judge.*the reward-model worker died"):
        router.raise_if_failed()


def test_a_stuck_or_missing_judge_answers_503(tiny_tokenizer, monkeypatch):
    import threading

    from verl.rewards import generative

    monkeypatch.setattr(generative, "_ATTACH_TIMEOUT_S", 0.2)
    router = _router(tiny_tokenizer)  # never attached
    try:
        status, body = _post(router.address, {"prompt": "hi"})
    finally:
        router.close()
    assert status == 503 and "were not attached to the judge within 0 s" in body["error"]["message"]

    monkeypatch.setattr(generative, "_ANSWER_TIMEOUT_S", 0.5)
    release = threading.Event()
    router = _router(tiny_tokenizer)
    router.attach(lambda prompts: release.wait() and _echo(prompts))
    try:
        status, body = _post(router.address, {"prompt": "hi"})
        later = _post(router.address, {"prompt": "again"}, timeout=0.4)  # fails at once: no second wait
    finally:
        release.set()
        router.close()
    assert status == 503 and "the judge gave no answer within 0 s" in body["error"]["message"]
    assert later == (status, body)


def test_a_judge_failure_stops_the_scoring_with_its_error(judge_dir, tiny_tokenizer, genrm_file):
    from verl.rewards.generative import JudgeFailed

    reward = load_reward_manager(reward_config(judge_dir, genrm_file), tiny_tokenizer, num_examine=0)

    def dead_worker(prompts):
        raise RuntimeError("the reward-model worker died")

    reward.router.attach(dead_worker)
    try:
        with pytest.raises(JudgeFailed, match="failed to generate: RuntimeError: the reward-model worker died"):
            reward(policy_batch(tiny_tokenizer, ["4", "6"]))
    finally:
        reward.close()


def _validate(judge_dir, genrm_file, *overrides):
    from verl.trainer.config_validation import compose_ppo_config, validate_config

    return validate_config(compose_ppo_config([
        "data.train_files=train.parquet", f"actor_rollout_ref.model.path={judge_dir}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2", "trainer.device=cpu", "trainer.backend=local", "trainer.n_gpus_per_node=1",
        "reward_model.enable=true", f"reward_model.model.path={judge_dir}", *overrides]))


def test_config_checks_name_the_reward_loop_keys(judge_dir, genrm_file, monkeypatch):
    from verl.trainer.config import checks
    from verl.base_config import ConfigError

    monkeypatch.setattr(checks, "_module_available", lambda name: name != "vllm")
    genrm = f"custom_reward_function.path={genrm_file}"
    # The original's example keys: accepted, each one that does nothing here named in a warning.
    warnings = _validate(judge_dir, genrm_file, genrm, "reward_model.use_reward_loop=True",
                         "reward_model.rollout.name=native", "reward_model.rollout.gpu_memory_utilization=0.8",
                         "reward_model.rollout.tensor_model_parallel_size=4", "reward_model.rollout.prompt_length=256",
                         "reward_model.rollout.response_length=128", "reward_model.num_workers=8")
    named = sorted(w.split(":")[0] for w in warnings if w.startswith("reward_model."))
    assert named == ["reward_model.num_workers", "reward_model.rollout.tensor_model_parallel_size"]
    with pytest.raises(ConfigError, match=r"reward_model\.rollout\.name: rollout engine 'vllm' is not installed.*"
                                          r"Set reward_model\.rollout\.name="):
        _validate(judge_dir, genrm_file, genrm, "reward_model.rollout.name=vllm")
    # A classifier reward model (no custom function) reads none of the judge's keys.
    warnings = _validate(judge_dir, genrm_file, "reward_model.rollout.gpu_memory_utilization=0.8")
    assert any(w.startswith("reward_model.rollout.gpu_memory_utilization: is set to 0.8, but only a generative")
               for w in warnings)


def test_main_ppo_trains_a_step_with_a_generative_judge(judge_dir, genrm_file, tmp_path, monkeypatch):
    """The original's GenRM command line, scaled down: GRPO on CPU with the judge in the reward-model workers."""
    import pandas as pd

    from verl.trainer.main_ppo import main

    rows = [{"data_source": "toy", "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(2 * i)}, "extra_info": {"question": f"{i} + {i}"}}
            for i in range(4)]
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics))
    assert main([
        f"data.train_files={tmp_path / 'train.parquet'}", "data.train_batch_size=2", "data.max_prompt_length=32",
        "data.max_response_length=6", f"actor_rollout_ref.model.path={judge_dir}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "algorithm.adv_estimator=grpo", f"custom_reward_function.path={genrm_file}", "reward_model.enable=true",
        f"reward_model.model.path={judge_dir}", "reward_model.use_reward_loop=true",
        "reward_model.rollout.name=hf", "reward_model.rollout.prompt_length=128",
        "reward_model.rollout.response_length=16", "reward_model.num_workers=1",
        "trainer.backend=local", "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1",
        "trainer.logger=['console','file']", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "trainer.val_before_train=False", f"trainer.default_local_dir={tmp_path / 'ckpt'}"]) == 0
    data = json.loads(metrics.read_text().splitlines()[0])["data"]
    for key in ("critic/score/mean", "critic/rewards/mean", "timing_s/reward", "actor/pg_loss"):
        assert math.isfinite(data[key]), key
    # Every score is len(judge text) + 0.5 * its a's: >= 0, and > 0 unless the judge said nothing at all.
    assert data["critic/score/min"] >= 0 and data["critic/score/max"] > 0
