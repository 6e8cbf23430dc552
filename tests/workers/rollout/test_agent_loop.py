"""The multi-turn agent loop with a scripted engine: tool calls parsed and executed, results appended
through the chat template, masks and log-probs on the model's own tokens only, limits and errors."""

import asyncio

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.tools.base import BaseTool, load_tools
from verl.workers.rollout.agent_loop import (
    ToolAgentLoop,
    parse_hermes_tool_calls,
    truncate,
)
from verl.workers.rollout.base import BaseRollout, build_rollout_output

CALL = '<tool_call>{"name": "calc", "arguments": {"expression": "6*7"}}</tool_call>'
FINAL = "The answer is #### 42"
LOGP = -0.5


class ScriptedRollout(BaseRollout):
    """Answers turn k of an episode with ``script[k]`` (k = assistant turns already in the context)."""

    def __init__(self, tokenizer, script):
        super().__init__({"response_length": 256}, torch.nn.Module(), tokenizer)
        self.script, self.calls = script, []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        params = self.sampling_params(prompts.meta_info)
        self.calls.append(params.response_length)
        rows = []
        for ids, mask in zip(prompts.batch["input_ids"], prompts.batch["attention_mask"]):
            context = self.tokenizer.decode(ids[mask.bool()].tolist())
            turn = context.count("<|im_start|>assistant") - 1
            rows.append(self.tokenizer(self.script[turn])["input_ids"] + [self.tokenizer.eos_token_id])
        width = max(map(len, rows))
        responses = torch.tensor([r + [params.pad_token_id] * (width - len(r)) for r in rows])
        return build_rollout_output(prompts, responses, torch.full(responses.shape, LOGP), params)


class Calculator(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return str(eval(parameters["expression"], {"__builtins__": {}})), 0.0, {}


SCHEMA = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}


def prompts(tokenizer, rows=2, **meta):
    messages = [[{"role": "user", "content": f"What is 6*7? ({i})"}] for i in range(rows)]
    ids = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)
           for m in messages]
    width = max(map(len, ids))
    input_ids = torch.tensor([[0] * (width - len(i)) + i for i in ids])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(i) for i in ids])[:, None]).long()
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
        non_tensors={"raw_prompt": np.array(messages + [None], dtype=object)[:rows],
                     "data_source": np.array(["openai/gsm8k"] * rows, dtype=object)},
        meta_info={"response_length": 200, **meta})


def loop(tokenizer, script, **settings):
    engine = ScriptedRollout(tokenizer, script)
    return ToolAgentLoop(engine, tokenizer, {"max_tool_response_length": 256, **settings},
                         {"calc": Calculator({}, SCHEMA)}), engine


def test_a_tool_call_episode_masks_only_the_models_tokens(tiny_tokenizer):
    agent, engine = loop(tiny_tokenizer, [CALL, FINAL])
    out = agent.generate_sequences(prompts(tiny_tokenizer, n=2))
    assert len(out) == 4 and out.batch["responses"].shape == (4, 200)
    assert out.batch["prompts"].shape[1] == prompts(tiny_tokenizer).batch["input_ids"].shape[1]  # as they came
    turn1 = tiny_tokenizer(CALL)["input_ids"] + [tiny_tokenizer.eos_token_id]
    turn2 = tiny_tokenizer(FINAL)["input_ids"] + [tiny_tokenizer.eos_token_id]
    # What the template puts between them: "\n", the tool message with the result, the next assistant prompt.
    between = tiny_tokenizer("\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    assert engine.calls == [200, 200 - len(turn1) - len(between)]  # turn 2 gets what is left of the budget
    for row in range(4):
        mask = out.batch["response_mask"][row]
        length = int(out.batch["attention_mask"][row, -200:].sum())
        ids = out.batch["responses"][row, :length].tolist()
        assert ids == turn1 + between + turn2
        assert mask[:length].tolist() == [1] * len(turn1) + [0] * len(between) + [1] * len(turn2)
        assert mask[length:].sum() == 0
        log_probs = out.batch["rollout_log_probs"][row]
        assert torch.all(log_probs[mask.bool()] == LOGP) and torch.all(log_probs[~mask.bool()] == 0)
    assert out.non_tensor_batch["__num_turns__"].tolist() == [3] * 4  # assistant, tool, assistant
    assert out.non_tensor_batch["__tool_calls__"].tolist() == [1] * 4
    assert out.non_tensor_batch["__tool_errors__"].tolist() == [0] * 4
    assert out.non_tensor_batch["data_source"].tolist() == ["openai/gsm8k"] * 4  # repeated per sample
    # The prompt is the chat template's, the sequence is prompt + response.
    torch.testing.assert_close(out.batch["input_ids"], torch.cat([out.batch["prompts"], out.batch["responses"]], 1))


def test_limits_end_episodes(tiny_tokenizer):
    agent, engine = loop(tiny_tokenizer, [CALL, CALL, CALL, FINAL], max_assistant_turns=2)
    out = agent.generate_sequences(prompts(tiny_tokenizer))
    assert out.non_tensor_batch["__num_turns__"].tolist() == [3, 3]  # 2 assistant turns, 1 tool turn
    assert len(engine.calls) == 2
    agent, _ = loop(tiny_tokenizer, [CALL, CALL, CALL, FINAL], max_user_turns=1)
    out = agent.generate_sequences(prompts(tiny_tokenizer))
    assert out.non_tensor_batch["__tool_calls__"].tolist() == [1, 1]
    # ... and the episode ends on the model's own turn (where the reward goes), not on tool tokens
    assert out.non_tensor_batch["__num_turns__"].tolist() == [3, 3]
    last = out.batch["attention_mask"][:, -200:].sum(-1) - 1
    assert out.batch["response_mask"][torch.arange(2), last].tolist() == [1, 1]
    # A response budget too small for the tool result: the episode ends after the call.
    agent, _ = loop(tiny_tokenizer, [CALL, FINAL])
    out = agent.generate_sequences(prompts(tiny_tokenizer, response_length=len(tiny_tokenizer(CALL)["input_ids"]) + 4))
    assert out.non_tensor_batch["__num_turns__"].tolist() == [1, 1]
    assert out.batch["response_mask"].sum(-1).tolist() == [len(tiny_tokenizer(CALL)["input_ids"]) + 1] * 2


def test_bad_calls_become_error_messages_for_the_model(tiny_tokenizer):
    script = ['<tool_call>{"name": "calc", "arguments": {"expression": "1/0"}}</tool_call>', FINAL]
    agent, _ = loop(tiny_tokenizer, script)
    out = agent.generate_sequences(prompts(tiny_tokenizer, rows=1))
    text = tiny_tokenizer.decode(out.batch["responses"][0].tolist())
    assert "error: ZeroDivisionError: division by zero" in text and out.non_tensor_batch["__tool_errors__"][0] == 1
    agent, _ = loop(tiny_tokenizer, ['<tool_call>{"name": "search"}</tool_call>', FINAL])
    out = agent.generate_sequences(prompts(tiny_tokenizer, rows=1))
    assert "no tool named 'search'" in tiny_tokenizer.decode(out.batch["responses"][0].tolist())


def test_a_prompt_longer_than_its_width_once_tools_are_added_is_named(tiny_tokenizer):
    agent, _ = loop(tiny_tokenizer, [FINAL])
    batch = prompts(tiny_tokenizer)  # the same rows, 3 columns narrower than the longest prompt
    narrow = DataProto.from_dict({k: v[:, 3:] for k, v in batch.batch.items()},
                                 non_tensors=dict(batch.non_tensor_batch), meta_info=dict(batch.meta_info))
    with pytest.raises(ValueError, match=r"prompt 0 is \d+ tokens once the chat template adds the tool schemas, more "
                                         r"than data.max_prompt_length=\d+"):
        agent.generate_sequences(narrow)


def test_a_round_groups_episodes_by_the_budget_they_have_used():
    from verl.workers.rollout.base import budget_groups

    used = [0, 900, 30, 700, 260]
    groups = budget_groups(list(range(5)), used, 1000)  # spread 250: {0, 30}, {260}, {700, 900}
    assert [[used[r] for r in g] for g in groups] == [[0, 30], [260], [700, 900]]


def test_hermes_parsing_and_truncation():
    calls = parse_hermes_tool_calls('a <tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call> b '
                                    '<tool_call>not json</tool_call><tool_call>{"arguments": {}}</tool_call>')
    assert calls[0] == {"name": "f", "arguments": {"x": 1}}
    assert calls[1].startswith("invalid tool call (not JSON") and calls[2] == "invalid tool call (needs a 'name')"
    assert truncate("abcdefghij", 4, "middle") == "ab...(truncated)...ij"
    assert truncate("abcdefghij", 4, "left") == "...(truncated)...ghij"
    assert truncate("abcdefghij", 4, "right") == "abcd...(truncated)..."


def test_tool_config_file(tmp_path):
    good = tmp_path / "tools.yaml"
    good.write_text("tools:\n  - class_name: verl.tools.code_interpreter.CodeInterpreterTool\n"
                    "    config: {cpu_seconds: 2}\n    tool_schema:\n      type: function\n"
                    "      function: {name: python, parameters: {type: object}}\n")
    tools = load_tools(str(good))
    assert list(tools) == ["python"] and tools["python"].limits.cpu_seconds == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("tools:\n  - class_name: collections.OrderedDict\n    tool_schema: {function: {name: x}}\n")
    with pytest.raises(ValueError, match=r"tools\[0\]: collections.OrderedDict is not a subclass"):
        load_tools(str(bad))
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_tools(str(tmp_path / "missing.yaml"))


def test_code_interpreter_runs_in_the_sandbox():
    from verl.sandbox.process import isolation
    from verl.tools.code_interpreter import CodeInterpreterTool

    if isolation() != "namespaces":
        pytest.skip(isolation())
    tool = CodeInterpreterTool({"cpu_seconds": 2, "wall_seconds": 5})
    text, _, metrics = asyncio.run(tool.execute("x", {"code": "print(6 * 7)"}))
    assert text == "42\n" and metrics["error"] == 0.0
    text, _, metrics = asyncio.run(tool.execute("x", {"code": "open('/etc/passwd', 'w')"}))
    assert metrics["error"] == 1.0 and "Error" in text


def test_gsm8k_interaction_checks_answers_by_hand():
    from verl.interactions.gsm8k_interaction import CORRECT, RETRY, Gsm8kInteraction

    user = Gsm8kInteraction({})
    instance = asyncio.run(user.start_interaction(ground_truth="72"))
    ask = lambda text: asyncio.run(user.generate_response(instance, [{"role": "assistant", "content": text}]))  # noqa: E731
    assert ask("so it is #### 71") == (False, RETRY, 0.0, {})
    assert ask("I get 72 in the end, #### 72") == (True, CORRECT, 1.0, {})
    assert asyncio.run(user.calculate_score(instance)) == 1.0
    with pytest.raises(ValueError, match=r"needs extra_info\['interaction_kwargs'\]\['ground_truth'\]"):
        asyncio.run(user.start_interaction())


def test_a_simulated_user_asks_again_until_the_answer_is_right(tiny_tokenizer, tmp_path):
    from verl.interactions.utils.interaction_registry import initialize_interactions_from_config

    config = tmp_path / "users.yaml"
    config.write_text("interaction:\n  - name: gsm8k\n"
                      "    class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n"
                      "    config: {retry_message: Wrong. Try again.}\n")
    engine = ScriptedRollout(tiny_tokenizer, ["I think #### 41", FINAL, FINAL])
    agent = ToolAgentLoop(engine, tiny_tokenizer, {}, {}, initialize_interactions_from_config(str(config)))
    batch = prompts(tiny_tokenizer, rows=2, n=2)
    batch.non_tensor_batch["extra_info"] = np.array(
        [{"interaction_kwargs": {"name": "gsm8k", "ground_truth": "42"}},
         {"interaction_kwargs": {"name": "gsm8k", "ground_truth": "41"}}], dtype=object)
    out = agent.generate_sequences(batch)  # the strict tokenization check runs too
    # Prompt 0: wrong, the user asks again, right. Prompt 1 (ground truth 41): right at once.
    assert out.non_tensor_batch["__num_turns__"].tolist() == [3, 3, 1, 1]
    assert [i["turn_scores"] for i in out.non_tensor_batch["extra_info"]] == [[0.0, 1.0]] * 2 + [[1.0]] * 2
    turn1 = tiny_tokenizer("I think #### 41")["input_ids"] + [tiny_tokenizer.eos_token_id]
    between = tiny_tokenizer("\n<|im_start|>user\nWrong. Try again.<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    turn2 = tiny_tokenizer(FINAL)["input_ids"] + [tiny_tokenizer.eos_token_id]
    length = len(turn1) + len(between) + len(turn2)
    assert out.batch["responses"][0, :length].tolist() == turn1 + between + turn2
    assert out.batch["response_mask"][0].tolist()[:length + 1] == [1] * len(turn1) + [0] * len(between) + [1] * len(
        turn2) + [0]
    unknown = prompts(tiny_tokenizer, rows=1)
    unknown.non_tensor_batch["extra_info"] = np.array([{"interaction_kwargs": {"name": "tutor"}}], dtype=object)
    with pytest.raises(ValueError, match=r"prompt 0: extra_info.interaction_kwargs.name='tutor' names no interaction"):
        agent.generate_sequences(unknown)


class Recording(Calculator):
    """Counts live instances; ``fail_create`` makes the n-th create raise, ``fail_release`` every release."""

    def __init__(self, fail_create=None, fail_release=False):
        super().__init__({}, SCHEMA)
        self.live, self.created, self.fail_create, self.fail_release = set(), 0, fail_create, fail_release

    async def create(self, instance_id=None, **kwargs):
        self.created += 1
        if self.created == self.fail_create:
            raise OSError("sandbox unavailable")
        instance = await super().create(instance_id, **kwargs)
        self.live.add(instance)
        return instance

    async def release(self, instance_id, **kwargs):
        self.live.discard(instance_id)
        if self.fail_release:
            raise OSError("cannot remove the sandbox folder")


def test_instances_are_released_when_something_fails(tiny_tokenizer):
    tool = Recording(fail_create=3)  # the third episode's tool cannot start
    agent = ToolAgentLoop(ScriptedRollout(tiny_tokenizer, [CALL, FINAL]), tiny_tokenizer, {}, {"calc": tool})
    with pytest.raises(OSError, match="sandbox unavailable"):
        agent.generate_sequences(prompts(tiny_tokenizer, rows=2, n=2))
    assert tool.created == 3 and tool.live == set()  # the two created before were released
    tool = Recording(fail_release=True)
    agent = ToolAgentLoop(ScriptedRollout(tiny_tokenizer, [CALL, FINAL]), tiny_tokenizer, {}, {"calc": tool})
    with pytest.raises(RuntimeError, match="releasing the episodes' tools or interactions failed: OSError"):
        agent.generate_sequences(prompts(tiny_tokenizer, rows=2))
    assert tool.created == 2 and tool.live == set()  # one failing release did not stop the other


def test_a_failed_continuation_stops_the_rounds_at_once(tiny_tokenizer):
    import concurrent.futures
    import time

    engine = ScriptedRollout(tiny_tokenizer, [CALL, FINAL])
    slow = concurrent.futures.Future()  # never resolved by the test: the rollout must not wait for it

    def on_turn(row, ids, log_probs, used):
        if row == 1:
            return slow
        failed = concurrent.futures.Future()
        failed.set_exception(ConnectionError("tool server gone"))
        return failed

    tic = time.perf_counter()
    with pytest.raises(ConnectionError, match="tool server gone"):
        engine.generate_episodes(prompts(tiny_tokenizer, rows=2), on_turn)
    assert time.perf_counter() - tic < 5
