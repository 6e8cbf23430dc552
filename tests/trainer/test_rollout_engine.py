"""The driver's choice of rollout engine: native where it runs the model, else hf with one note, refused where the
trainer mode needs native. Only config.json is read (the model is built on the meta device)."""

import pytest
from transformers import GPT2Config, LlamaConfig, Phi3Config

from verl.trainer.config.spec import resolve_run
from verl.trainer.config_validation import compose_ppo_config
from verl.trainer.rollout_engine import EngineChoiceError, choose_rollout_engine, native_problem


def _save(tmp_path, name, config):
    folder = tmp_path / name
    config.save_pretrained(folder)
    return str(folder)


@pytest.fixture
def folders(tmp_path):
    small = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=64)
    return {
        "llama": _save(tmp_path, "llama", LlamaConfig(intermediate_size=64, num_key_value_heads=2, **small)),
        "gpt2": _save(tmp_path, "gpt2", GPT2Config(n_embd=32, n_head=4, n_layer=2, vocab_size=64)),
        "phi3_longrope": _save(tmp_path, "phi3", Phi3Config(
            intermediate_size=64, num_key_value_heads=4, max_position_embeddings=64,
            original_max_position_embeddings=32,
            pad_token_id=0, rope_scaling={"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4},
            **small)),
    }


def test_native_problem_names_what_the_engine_lacks(folders):
    assert native_problem(folders["llama"]) is None
    assert "gpt2" in native_problem(folders["gpt2"])
    assert "longrope" in native_problem(folders["phi3_longrope"])


def _spec(path, name="native", mode="sync"):
    """The run's own RunSpec for these settings (the engine not yet chosen)."""
    config = compose_ppo_config([f"actor_rollout_ref.model.path={path}", f"actor_rollout_ref.rollout.name={name}",
                                 f"trainer.v1.trainer_mode={mode}"])
    return resolve_run(config, choose_checkpointing=False, choose_engine=False)


def test_an_unsupported_model_generates_with_hf_and_says_so_once(folders):
    notes = []
    spec = choose_rollout_engine(_spec(folders["gpt2"]), log=notes.append)
    assert spec.actor_rollout_ref.rollout.name == "hf"
    assert len(notes) == 1
    assert "actor_rollout_ref.rollout.name=hf" in notes[0] and "gpt2" in notes[0]


def test_a_supported_model_or_an_explicit_engine_is_left_alone(folders):
    notes = []
    spec = _spec(folders["llama"])
    assert choose_rollout_engine(spec, log=notes.append) is spec
    spec = _spec(folders["gpt2"], name="hf")
    assert choose_rollout_engine(spec, log=notes.append) is spec
    assert notes == []


def test_asynchronous_modes_need_the_native_engine(folders):
    with pytest.raises(EngineChoiceError, match=r"trainer.v1.trainer_mode=colocate_async needs the native engine.*"
                                         r"trainer_mode=sync"):
        choose_rollout_engine(_spec(folders["gpt2"], mode="colocate_async"))
