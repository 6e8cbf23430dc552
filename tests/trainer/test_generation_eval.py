"""main_generation and main_eval on the bundled GSM8K sample with a tiny model, and pass@k by hand."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from verl.trainer import main_eval, main_generation
from verl.trainer.main_eval import pass_at_k

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0 and pass_at_k(3, 2, 2) == 1.0
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def write_generations(path, rows):
    frame = pd.DataFrame([{"data_source": source, "prompt": [{"role": "user", "content": "q"}],
                           "reward_model": {"style": "rule", "ground_truth": truth}, "responses": responses}
                          for source, truth, responses in rows])
    frame.to_parquet(path)
    return str(path)


def test_main_eval_reports_score_and_pass_at_k_per_data_source(tmp_path, capsys):
    path = write_generations(tmp_path / "gen.parquet", [
        ("openai/gsm8k", "72", ["so #### 72", "#### 5"]),       # scores 1, 0
        ("openai/gsm8k", "10", ["#### 3", "#### 4"]),           # 0, 0
        ("lighteval/MATH", "4", ["\\boxed{4}", "\\boxed{4}"]),  # 1, 1
    ])
    out = tmp_path / "metrics.json"
    assert main_eval.main([f"data.path={path}", f"metrics.output_path={out}"]) == 0
    metrics = json.loads(out.read_text())
    # gsm8k: row means 0.5 and 0; pass@1 = (1/2 + 0) / 2; pass@2 = (1 + 0) / 2
    assert metrics["test_score/openai/gsm8k"] == pytest.approx(0.25)
    assert metrics["pass@1/openai/gsm8k"] == pytest.approx(0.25)
    assert metrics["pass@2/openai/gsm8k"] == pytest.approx(0.5)
    assert metrics["pass@1/lighteval/MATH"] == 1.0 and metrics["pass@2/lighteval/MATH"] == 1.0
    assert "pass@2/openai/gsm8k: 0.5000" in capsys.readouterr().out


def test_main_eval_uses_a_custom_reward_and_names_bad_rows(tmp_path, capsys):
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(len(solution_str) >= 3)\n")
    path = write_generations(tmp_path / "gen.parquet", [("mine", "x", ["abc", "a"])])
    assert main_eval.main([f"data.path={path}", f"custom_reward_function.path={reward}"]) == 0
    assert "pass@1/mine: 0.5000" in capsys.readouterr().out
    broken = write_generations(tmp_path / "broken.parquet", [("openai/gsm8k", "1", ["#### 1"]),
                                                             ("openai/gsm8k", None, ["#### 1"])])
    assert main_eval.main([f"data.path={broken}"]) == 1
    assert "row 1: 'reward_model' has no ground_truth" in capsys.readouterr().err
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return 'good'\n")
    assert main_eval.main([f"data.path={path}", f"custom_reward_function.path={reward}"]) == 1
    assert "row 0 (mine): the reward function returned 'good'" in capsys.readouterr().err
    assert main_eval.main([f"data.path={path}", "data.response_key=answers"]) == 1
    assert "data.response_key: column 'answers' is not in" in capsys.readouterr().err
    reward.write_text("import numpy as np\n\ndef compute_score(data_source, solution_str, ground_truth, "
                      "extra_info=None):\n    return np.float32(1.0)\n")  # numpy numbers are numbers
    spaced = tmp_path / "spaced.parquet"
    pd.read_parquet(path).rename(columns={"responses": "my answers"}).to_parquet(spaced)
    assert main_eval.main([f"data.path={spaced}", "data.response_key=my answers",
                           f"custom_reward_function.path={reward}"]) == 0
    assert "pass@1/mine: 1.0000" in capsys.readouterr().out


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    from verl.utils.tiny_model import build_tiny_causal_lm, build_tiny_tokenizer

    root = tmp_path_factory.mktemp("gen")
    subprocess.run([sys.executable, os.path.join(REPO, "examples/data_preprocess/gsm8k.py"), "--local_dataset_path",
                    os.path.join(REPO, "examples/data_preprocess/fixtures/gsm8k"), "--local_dir", str(root / "data")],
                   check=True, capture_output=True)
    prompts = [row[0]["content"] for row in pd.read_parquet(root / "data" / "test.parquet")["prompt"]]
    tokenizer = build_tiny_tokenizer(str(root / "tokenizer"), corpus=prompts)
    return {"root": root, "test": str(root / "data" / "test.parquet"),
            "model": build_tiny_causal_lm(str(root / "model"), tokenizer, arch="qwen2")}


def generation_command(setup, output, *extra):
    return [f"data.path={setup['test']}", f"data.output_path={output}", f"model.path={setup['model']}",
            "data.batch_size=3", "rollout.name=hf", "rollout.prompt_length=96", "rollout.response_length=8",
            "rollout.top_k=-1", "rollout.top_p=1.0", "trainer.device=cpu", "actor.fsdp_config.dtype=float32", *extra]


def test_generate_then_evaluate(gsm8k, tmp_path, capsys):
    output = tmp_path / "out" / "gen.parquet"
    assert main_generation.main(generation_command(gsm8k, output, "data.n_samples=2", "trainer.backend=local",
                                                   "trainer.n_gpus_per_node=1")) == 0
    source, generated = pd.read_parquet(gsm8k["test"]), pd.read_parquet(output)
    assert list(generated.columns) == [*source.columns, "responses"] and len(generated) == len(source)
    assert generated["data_source"].tolist() == source["data_source"].tolist()  # the input's rows, in order
    assert all(len(r) == 2 and all(isinstance(t, str) for t in r) for r in generated["responses"])
    assert not list(output.parent.glob("*.partial-*"))
    assert main_eval.main([f"data.path={output}"]) == 0  # a random model: scores 0, but every row is scored
    assert "pass@2/openai/gsm8k: 0.0000" in capsys.readouterr().out


def test_generation_is_data_parallel_over_ray_workers(gsm8k, tmp_path, ray_session):
    """Greedy responses from two Ray workers equal those of one worker in this process."""
    greedy = ("data.n_samples=1", "rollout.do_sample=false")
    one, two = tmp_path / "one.parquet", tmp_path / "two.parquet"
    assert main_generation.main(generation_command(gsm8k, one, *greedy, "trainer.backend=local",
                                                   "trainer.n_gpus_per_node=1")) == 0
    assert main_generation.main(generation_command(gsm8k, two, *greedy, "trainer.n_gpus_per_node=2")) == 0
    assert [list(r) for r in pd.read_parquet(one)["responses"]] == [list(r) for r in pd.read_parquet(two)["responses"]]


def test_generation_config_mistakes_stop_before_any_worker(gsm8k, tmp_path, capsys):
    output = tmp_path / "gen.parquet"
    cases = {
        ("data.n_samples=3", "rollout.do_sample=false"): "data.n_samples: 3 samples with rollout.do_sample=false",
        ("data.path=/no/such.parquet",): "data.path: '/no/such.parquet' is not a file",
        ("data.prompt_key=question",): "data.prompt_key: column 'question' is not in",
        ("data.n_samles=2",): "data.n_samples",  # an unknown key, with the closest known one
    }
    for extra, expected in cases.items():
        assert main_generation.main(generation_command(gsm8k, output, *extra)) == 1
        assert expected in capsys.readouterr().err, extra
    assert not output.exists()
