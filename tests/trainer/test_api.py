"""The Python API: config objects -> the trainer config, and `PPOTrainer` as a user of the docs writes it."""

import copy
import importlib.util
import os
import pickle
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl.trainer import (
    ActorConfig,
    ActorRolloutRefConfig,
    CriticConfig,
    DataConfig,
    FSDPConfig,
    KLControlConfig,
    ModelConfig,
    OptimConfig,
    PPOAlgorithmConfig,
    PPOTrainer,
    RefConfig,
    RewardModelConfig,
    RolloutConfig,
    TrainerConfig,
    build_ppo_config,
)
from verl.trainer.config import ConfigError
from verl.trainer.config.compose import compose_ppo_config

REPO = Path(__file__).resolve().parents[2]
QWEN = "Qwen/Qwen2.5-0.5B-Instruct"


def run_python(code: str) -> str:
    """Run `code` in a fresh interpreter (so sys.modules starts empty); return its stdout."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=False, cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def article_config(engine: str) -> dict:
    """The PPO example of a published verl walkthrough, as written there (engine aside)."""
    return dict(
        actor_rollout_ref=ActorRolloutRefConfig(
            actor=ModelConfig(path=QWEN),
            rollout=RolloutConfig(name=engine, tensor_model_parallel_size=1),
            ref=ModelConfig(path=QWEN),
        ),
        critic=CriticConfig(model=ModelConfig(path=QWEN)),
        algorithm=PPOAlgorithmConfig(kl_coef=0.001),
    )


def problem_keys(error: ConfigError) -> set[str]:
    return {line.split(":", 1)[0] for line in error.problems}


# --------------------------------------------------------------------------------------------------
# The two published snippets
# --------------------------------------------------------------------------------------------------


def test_shorthand_snippet_constructs_offline_without_heavy_imports():
    out = run_python("""
        import socket, sys

        def no_network(*args, **kwargs):
            raise AssertionError("PPOTrainer construction tried to open a network connection")

        socket.socket.connect = socket.create_connection = no_network
        from verl.trainer import PPOTrainer

        before = {m for m in ("ray", "transformers") if m in sys.modules}
        trainer = PPOTrainer(
            actor_model_name="facebook/opt-125m",
            reward_model_name="OpenAssistant/reward-model-deberta-v3-large",
        )
        cfg = trainer.config
        assert cfg.actor_rollout_ref.model.path == "facebook/opt-125m"
        assert cfg.reward_model.enable is True
        assert cfg.reward_model.model.path == "OpenAssistant/reward-model-deberta-v3-large"
        assert cfg.critic.model.path == "facebook/opt-125m"  # follows the actor's model, as in the yaml
        heavy = [m for m in ("ray", "transformers", "verl.trainer.main_ppo") if m in sys.modules]
        print("before", sorted(before), "after", heavy)
    """)
    assert "before [] after []" in out


def test_import_verl_trainer_is_lazy():
    out = run_python("""
        import sys
        import verl.trainer
        print("eager", [m for m in ("verl.trainer.api", "verl.workers.config", "omegaconf", "hydra")
                        if m in sys.modules])
        from verl.trainer import ModelConfig, PPOTrainer, build_ppo_config
        print("module", PPOTrainer.__module__, ModelConfig.__module__, build_ppo_config.__module__)
        print("listed", all(n in dir(verl.trainer) for n in ("PPOTrainer", "ModelConfig", "TrainerConfig")))
        try:
            verl.trainer.NoSuchThing
        except AttributeError as e:
            print("missing", e)
    """)
    assert "eager []" in out
    assert "module verl.trainer.api verl.workers.config.model verl.trainer.api" in out
    assert "listed True" in out
    assert "missing module 'verl.trainer' has no attribute 'NoSuchThing'" in out


def test_article_config_with_vllm_fails_at_construction_naming_the_key_and_the_fix():
    with pytest.raises(ConfigError) as info:
        PPOTrainer(**article_config("vllm"))
    message = str(info.value)
    assert "actor_rollout_ref.rollout.name" in message
    assert "'vllm'" in message
    assert "actor_rollout_ref.rollout.name=hf" in message
    assert "RolloutConfig(name=" in message


def test_article_config_with_hf_builds_and_validation_asks_only_for_the_run_settings():
    trainer = PPOTrainer(**article_config("hf"))
    cfg = trainer.config
    assert cfg.actor_rollout_ref.model.path == QWEN
    assert cfg.actor_rollout_ref.rollout.name == "hf"
    assert cfg.critic.model.path == QWEN
    assert cfg.algorithm.kl_ctrl.kl_coef == 0.001

    with pytest.raises(ConfigError) as info:
        trainer.validate()
    keys = problem_keys(info.value)
    if importlib.util.find_spec("ray") is None:
        keys.discard("trainer.backend")
    # The snippet names no data. It leaves the micro batch sizes unset, as verl's own config does; with
    # packed forwards (the default) micro batches are sized by tokens, so they are not needed.
    assert keys == {"data.train_files"}
    with pytest.raises(ConfigError) as info:
        PPOTrainer(**article_config("hf"), overrides=["actor_rollout_ref.actor.use_dynamic_bsz=false"]).validate()
    keys = problem_keys(info.value) - {"trainer.backend"}
    assert keys == {"data.train_files", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                    "critic.ppo_micro_batch_size_per_gpu"}

    micro = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
             "critic.ppo_micro_batch_size_per_gpu=4"]
    with pytest.raises(ConfigError) as info:
        PPOTrainer(**article_config("hf"), overrides=micro,
                   trainer=TrainerConfig(backend="local", n_gpus_per_node=1)).validate()
    assert problem_keys(info.value) == {"data.train_files"}


# --------------------------------------------------------------------------------------------------
# Objects -> config: the mapping rules
# --------------------------------------------------------------------------------------------------

GRPO_COMMAND_LINE = [
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "data.train_files=/data/gsm8k/train.parquet",
    "data.val_files=[/data/gsm8k/test.parquet,/data/math/test.parquet]",
    "data.train_batch_size=512",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "actor_rollout_ref.model.path=/models/qwen3-8b",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.05",
    "actor_rollout_ref.actor.ppo_mini_batch_size=128",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.rollout.val_kwargs.n=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "trainer.critic_warmup=0",
    "trainer.logger=[console,tensorboard]",
    "trainer.project_name=verl_grpo_gsm8k",
    "trainer.experiment_name=qwen3_8b",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


def test_grpo_config_from_objects_equals_the_command_line():
    config = build_ppo_config(
        algorithm=PPOAlgorithmConfig(adv_estimator="grpo", use_kl_in_reward=False),
        data=DataConfig(train_files="/data/gsm8k/train.parquet",
                        val_files=[Path("/data/gsm8k/test.parquet"), "/data/math/test.parquet"],
                        train_batch_size=512, max_prompt_length=512, max_response_length=1024,
                        filter_overlong_prompts=True, truncation="error"),
        actor_rollout_ref=ActorRolloutRefConfig(
            model=ModelConfig(path="/models/qwen3-8b", use_remove_padding=True, enable_gradient_checkpointing=True,
                              override_config={"attention_dropout": 0.0}),
            actor=ActorConfig(
                optim=OptimConfig(lr=1e-6, lr_warmup_steps_ratio=0.05),
                ppo_mini_batch_size=128, ppo_micro_batch_size_per_gpu=16,
                use_kl_loss=True, kl_loss_coef=0.001, kl_loss_type="low_var_kl", entropy_coeff=0,
                policy_loss={"loss_mode": "gspo"},
                fsdp_config=FSDPConfig(param_offload=False, optimizer_offload=True),
            ),
            rollout=RolloutConfig(name="hf", n=5, gpu_memory_utilization=0.6, log_prob_micro_batch_size_per_gpu=32,
                                  val_kwargs={"n": 4}),
            ref=RefConfig(log_prob_micro_batch_size_per_gpu=32, fsdp_config=FSDPConfig(param_offload=True)),
        ),
        trainer=TrainerConfig(critic_warmup=0, logger=("console", "tensorboard"), project_name="verl_grpo_gsm8k",
                              experiment_name="qwen3_8b", n_gpus_per_node=8, nnodes=1, save_freq=20, test_freq=5,
                              total_epochs=15),
    )
    expected = compose_ppo_config(GRPO_COMMAND_LINE)
    assert OmegaConf.to_container(config) == OmegaConf.to_container(expected)  # ${...} references kept alike
    assert OmegaConf.to_container(config, resolve=True) == OmegaConf.to_container(expected, resolve=True)
    assert OmegaConf.is_struct(config)


def test_unset_fields_keep_the_yaml_defaults():
    assert OmegaConf.to_container(build_ppo_config()) == OmegaConf.to_container(compose_ppo_config([]))

    optim = OptimConfig(lr=3e-6)
    assert optim.to_overrides("critic.optim") == {"critic.optim.lr": 3e-6}
    config = build_ppo_config(critic=CriticConfig(optim=optim))
    defaults = compose_ppo_config([])
    assert config.critic.optim.lr == 3e-6
    assert config.critic.optim.weight_decay == defaults.critic.optim.weight_decay
    assert config.actor_rollout_ref.actor.optim.lr == defaults.actor_rollout_ref.actor.optim.lr
    assert OmegaConf.to_container(config.critic.model) == OmegaConf.to_container(defaults.critic.model)


def test_only_the_fields_given_become_overrides_and_none_is_a_value():
    assert ActorConfig().to_overrides() == {}
    actor = ActorConfig(ppo_epochs=2, optim=OptimConfig(betas=(0.9, 0.95)), checkpoint={"save_contents": ["model"]})
    assert actor.to_overrides() == {
        "actor_rollout_ref.actor.ppo_epochs": 2,
        "actor_rollout_ref.actor.optim.betas": [0.9, 0.95],
        "actor_rollout_ref.actor.checkpoint.save_contents": ["model"],
    }
    assert repr(actor) == ("ActorConfig(ppo_epochs=2, checkpoint={'save_contents': ['model']}, "
                           "optim=OptimConfig(betas=(0.9, 0.95)))")
    # A group given as None is not given; a plain value None writes null over a non-null default.
    assert ActorRolloutRefConfig(model=None, actor=None, rollout=None, ref=None).to_overrides() == {}
    assert build_ppo_config(trainer=TrainerConfig(default_local_dir=None)).trainer.default_local_dir is None


def test_model_config_given_as_actor_or_ref_is_the_policy_model():
    arr = ActorRolloutRefConfig(actor=ModelConfig(path=QWEN, trust_remote_code=True), ref=ModelConfig(path=QWEN))
    assert arr.to_overrides() == {
        "actor_rollout_ref.model.path": QWEN,
        "actor_rollout_ref.model.trust_remote_code": True,
    }
    # A ModelConfig as ref alone also names the initial policy, hence the actor's model.
    assert ActorRolloutRefConfig(ref=ModelConfig(path=QWEN)).to_overrides() == {"actor_rollout_ref.model.path": QWEN}
    both = ActorRolloutRefConfig(model=ModelConfig(path=QWEN), actor=ActorConfig(ppo_epochs=2), ref=RefConfig())
    assert both.to_overrides() == {"actor_rollout_ref.model.path": QWEN, "actor_rollout_ref.actor.ppo_epochs": 2}


def test_reference_model_other_than_the_actors_is_rejected_with_the_reason():
    with pytest.raises(ConfigError) as info:
        ActorRolloutRefConfig(actor=ModelConfig(path=QWEN), ref=ModelConfig(path="/models/other"))
    message = str(info.value)
    assert "actor_rollout_ref.model.path" in message
    assert "'/models/other'" in message and repr(QWEN) in message
    assert "reference policy is the actor's initial weights" in message
    assert "separate reference model is not supported" in message

    with pytest.raises(ConfigError, match="reference policy"):
        ActorRolloutRefConfig(model=ModelConfig(path=QWEN), ref=ModelConfig(path=QWEN, use_remove_padding=False),
                              actor=ModelConfig(use_remove_padding=True))
    with pytest.raises(ConfigError, match="policy model is given twice"):
        ActorRolloutRefConfig(model=ModelConfig(path=QWEN), actor=ModelConfig(path="/models/other"))


def test_kl_coef_is_the_in_reward_kl_coefficient():
    assert PPOAlgorithmConfig(kl_coef=0.01).to_overrides() == {"algorithm.kl_ctrl.kl_coef": 0.01}
    algo = PPOAlgorithmConfig(kl_coef=0.01, kl_ctrl=KLControlConfig(type="adaptive", target_kl=0.05))
    config = build_ppo_config(algorithm=algo)
    assert OmegaConf.to_container(config.algorithm.kl_ctrl) == {
        "type": "adaptive", "kl_coef": 0.01, "horizon": 10000, "target_kl": 0.05}
    assert PPOAlgorithmConfig(kl_coef=0.01, kl_ctrl={"kl_coef": 0.01}).to_overrides() == {
        "algorithm.kl_ctrl.kl_coef": 0.01}
    with pytest.raises(ConfigError, match=r"kl_ctrl.kl_coef: set twice .* by kl_ctrl= \(0.1\) and by kl_coef="):
        PPOAlgorithmConfig(kl_ctrl=KLControlConfig(kl_coef=0.1), kl_coef=0.01)


def test_reward_model_with_a_model_is_enabled_unless_told_otherwise():
    on = RewardModelConfig(model=ModelConfig(path="/models/rm", fsdp_config=FSDPConfig(param_offload=True)))
    assert on.to_overrides() == {"reward_model.model.path": "/models/rm",
                                 "reward_model.model.fsdp_config.param_offload": True,
                                 "reward_model.enable": True}
    off = RewardModelConfig(enable=False, model=ModelConfig(path="/models/rm"))
    assert build_ppo_config(reward_model=off).reward_model.enable is False


def test_free_form_groups_take_new_keys():
    config = build_ppo_config(
        actor_rollout_ref=ActorRolloutRefConfig(model=ModelConfig(override_config={"rope_theta": 1e6})),
        custom_reward_function={"path": "/tmp/r.py", "reward_kwargs": {"scale": 2}},
        data=DataConfig(apply_chat_template_kwargs={"enable_thinking": False}),
    )
    assert config.actor_rollout_ref.model.override_config.rope_theta == 1e6
    assert config.custom_reward_function.reward_kwargs.scale == 2
    assert config.data.apply_chat_template_kwargs.enable_thinking is False


# --------------------------------------------------------------------------------------------------
# Typos, conflicts and wrong types
# --------------------------------------------------------------------------------------------------


def test_typo_in_extra_or_overrides_gets_did_you_mean():
    with pytest.raises(ConfigError) as info:
        build_ppo_config(
            actor_rollout_ref=ActorRolloutRefConfig(actor=ActorConfig(extra={"ppo_mini_batchsize": 2})),
            overrides={"trainer": {"n_gpu_per_node": 1}},
        )
    assert info.value.problems == [
        ("actor_rollout_ref.actor.ppo_mini_batchsize: unknown key (set by actor_rollout_ref=); "
         "did you mean actor_rollout_ref.actor.ppo_mini_batch_size?"),
        "trainer.n_gpu_per_node: unknown key (set by overrides=); did you mean trainer.n_gpus_per_node?",
    ]
    with pytest.raises(ConfigError, match="did you mean trainer.total_epochs"):
        PPOTrainer(overrides=["trainer.total_epoch=3"])
    # A field a model group lacks: the actor's fsdp_config lives in ActorConfig.
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.model.fsdp_config.dtype: unknown key .*; "
                                          r"did you mean actor_rollout_ref\.(actor|ref)\.fsdp_config\.dtype\?"):
        build_ppo_config(actor_rollout_ref=ActorRolloutRefConfig(model=ModelConfig(fsdp_config=FSDPConfig(dtype="fp32"))))


def test_extra_and_overrides_set_keys_without_a_field():
    trainer = PPOTrainer(
        actor_rollout_ref=ActorRolloutRefConfig(rollout=RolloutConfig(extra={"multi_turn.format": "chatml"})),
        overrides={"ray_kwargs.ray_init.num_cpus": 4, "trainer": {"nnodes": 2}},
    )
    assert trainer.config.actor_rollout_ref.rollout.multi_turn.format == "chatml"
    assert trainer.config.ray_kwargs.ray_init.num_cpus == 4
    assert trainer.config.trainer.nnodes == 2
    with pytest.raises(TypeError, match=r"write overrides=\['trainer.nnodes=2'\]"):
        PPOTrainer(overrides="trainer.nnodes=2")


def test_a_key_set_in_two_places_must_agree():
    with pytest.raises(ConfigError) as info:
        PPOTrainer(actor_model_name="/models/a",
                   actor_rollout_ref=ActorRolloutRefConfig(model=ModelConfig(path="/models/b")))
    assert info.value.problems == [
        ("actor_rollout_ref.model.path: '/models/b' from actor_rollout_ref= but '/models/a' from actor_model_name=. "
         "Set it in one place")]
    agreeing = PPOTrainer(actor_model_name="/models/a", overrides=["actor_rollout_ref.model.path=/models/a"],
                          actor_rollout_ref=ActorRolloutRefConfig(model=ModelConfig(path="/models/a")))
    assert agreeing.config.actor_rollout_ref.model.path == "/models/a"
    with pytest.raises(ConfigError, match="set twice"):
        ActorConfig(ppo_epochs=2, extra={"ppo_epochs": 3}).to_overrides()


def test_wrong_object_in_a_field_is_a_type_error():
    with pytest.raises(TypeError, match="ActorConfig.optim must be a OptimConfig"):
        ActorConfig(optim=FSDPConfig())
    with pytest.raises(TypeError, match=r"wrap it, e.g. ActorRolloutRefConfig\(actor=...\)"):
        build_ppo_config(actor_rollout_ref=ActorConfig())
    with pytest.raises(TypeError, match="plain value"):
        DataConfig(train_files=ModelConfig(path="x"))


def test_objects_copy_and_pickle_with_unset_fields():
    model = ModelConfig(path="/models/a")
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone == model and clone.to_overrides("actor_rollout_ref.model") == {
            "actor_rollout_ref.model.path": "/models/a"}  # the fields left unset stay unset


# --------------------------------------------------------------------------------------------------
# PPOTrainer
# --------------------------------------------------------------------------------------------------


def test_shorthands_map_to_their_keys():
    trainer = PPOTrainer(actor_model_name=Path("/models/a"), critic_model_name="/models/c",
                         train_files=[Path("/d/a.parquet"), "/d/b.parquet"], val_files="/d/t.parquet",
                         adv_estimator="grpo")
    cfg = trainer.config
    assert cfg.actor_rollout_ref.model.path == "/models/a"
    assert cfg.critic.model.path == "/models/c"
    assert list(cfg.data.train_files) == ["/d/a.parquet", "/d/b.parquet"]
    assert cfg.data.val_files == "/d/t.parquet"
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.reward_model.enable is False


def test_a_composed_config_is_used_as_given_and_excludes_the_parts():
    config = compose_ppo_config(["trainer.nnodes=2"])
    assert PPOTrainer(config).config is config
    with pytest.raises(TypeError, match="either a composed config or its parts.*actor_model_name"):
        PPOTrainer(config, actor_model_name="/models/a")


def test_repr_shows_the_key_settings():
    trainer = PPOTrainer(actor_model_name="/models/a", adv_estimator="grpo",
                         actor_rollout_ref=ActorRolloutRefConfig(rollout=RolloutConfig(n=5)),
                         trainer=TrainerConfig(n_gpus_per_node=2, device="cpu", backend="local"))
    assert repr(trainer) == ("PPOTrainer(model='/models/a', algorithm='grpo', critic=None, reward_model=None, "
                             "rollout='native' (n=5), devices=1x2 cpu (local), train_files=None)")


@pytest.fixture
def fake_run_ppo(monkeypatch):
    """Stands in for verl.trainer.main_ppo: records the configs run_ppo is called with."""
    calls = []
    module = types.ModuleType("verl.trainer.main_ppo")
    module.run_ppo = lambda config: calls.append(config) or "trained"
    monkeypatch.setitem(sys.modules, "verl.trainer.main_ppo", module)
    return calls


def test_fit_reports_config_problems_before_starting_anything(fake_run_ppo):
    trainer = PPOTrainer(actor_model_name="/models/a")
    with pytest.raises(ConfigError) as info:
        trainer.fit()
    assert "data.train_files" in problem_keys(info.value)
    assert fake_run_ppo == []


def test_fit_validates_then_runs_the_config(fake_run_ppo, tiny_qwen2_dir, tmp_path):
    train = tmp_path / "train.parquet"
    train.write_bytes(b"")  # the pre-flight check only needs it to exist
    trainer = PPOTrainer(
        actor_model_name=tiny_qwen2_dir, train_files=str(train), adv_estimator="grpo",
        data=DataConfig(train_batch_size=4),
        actor_rollout_ref=ActorRolloutRefConfig(
            actor=ActorConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2),
            rollout=RolloutConfig(n=2, log_prob_micro_batch_size_per_gpu=2),
        ),
        trainer=TrainerConfig(n_gpus_per_node=1, device="cpu", backend="local", logger=["console"]),
    )
    assert trainer.fit() == "trained"
    assert fake_run_ppo == [trainer.config]
