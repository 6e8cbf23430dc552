"""examples/multi_turn/run_gsm8k_python_tool.sh stays a valid configuration, on data from the real
preprocessing script with --tool (its settings are checked, not trained)."""

import os
import subprocess
import sys

import pandas as pd

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_multi_turn_example_configuration_validates(tiny_qwen2_dir, tmp_path):
    data = tmp_path / "gsm8k_tool"
    subprocess.run([sys.executable, os.path.join(REPO, "examples/data_preprocess/gsm8k.py"), "--tool", "--interaction",
                    "--local_dataset_path", os.path.join(REPO, "examples/data_preprocess/fixtures/gsm8k"),
                    "--local_dir", str(data)], check=True, capture_output=True)
    prompt = pd.read_parquet(data / "train.parquet")["prompt"][0]
    assert prompt[0]["role"] == "system" and "code_interpreter" in prompt[0]["content"]
    extra = pd.read_parquet(data / "train.parquet")["extra_info"][0]
    kwargs = extra["interaction_kwargs"]
    assert kwargs["name"] == "gsm8k" and kwargs["ground_truth"] == extra["answer"].split("#### ")[-1].replace(",", "")
    env = {**os.environ, "VALIDATE_ONLY": "1", "MODEL": tiny_qwen2_dir, "DATA": str(data), "N_GPUS": "1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    result = subprocess.run(["bash", os.path.join(REPO, "examples/multi_turn/run_gsm8k_python_tool.sh"),
                             "trainer.device=cpu", "actor_rollout_ref.rollout.multi_turn.interaction_config_path="
                             + os.path.join(REPO, "examples/multi_turn/interaction_config.yaml")],
                            env=env, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All configuration checks passed" in result.stdout
