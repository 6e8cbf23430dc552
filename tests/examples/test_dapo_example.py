"""examples/dapo/run_dapo_gsm8k.sh stays a valid configuration (its settings are checked, not trained)."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_dapo_example_configuration_validates(tiny_qwen2_dir, tmp_path):
    data = tmp_path / "gsm8k"
    subprocess.run([sys.executable, os.path.join(REPO, "examples/data_preprocess/gsm8k.py"), "--local_dataset_path",
                    os.path.join(REPO, "examples/data_preprocess/fixtures/gsm8k"), "--local_dir", str(data)],
                   check=True, capture_output=True)
    env = {**os.environ, "VALIDATE_ONLY": "1", "MODEL": tiny_qwen2_dir, "DATA": str(data), "N_GPUS": "1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    result = subprocess.run(["bash", os.path.join(REPO, "examples/dapo/run_dapo_gsm8k.sh"), "trainer.device=cpu"],
                            env=env, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All configuration checks passed" in result.stdout
