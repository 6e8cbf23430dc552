"""Typed config sections and the run spec: every yaml default reaches them, nothing else defines a default,
derived settings are decided once, and the config is never changed."""

import ast
import copy
import dataclasses
import pathlib

import pytest
from omegaconf import OmegaConf

import verl
from verl.base_config import BaseConfig, yaml_defaults
from verl.trainer.config import AlgoConfig, KLControlConfig, TrainerConfig
from verl.trainer.config.compose import compose_ppo_config
from verl.trainer.config.spec import need_critic, need_reference_policy, resolve_run, worker_backend
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import (
    ActorConfig,
    FSDPActorConfig,
    OptimizerConfig,
    RolloutConfig,
)

PACKAGE = pathlib.Path(verl.__file__).parent


def _leaves(tree, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _read(spec, key):
    node = spec
    for part in key.split("."):
        node = getattr(node, part) if isinstance(node, BaseConfig) or dataclasses.is_dataclass(node) else node[part]
    return node


def _extras(config, where=""):
    """Keys a config (and its nested groups) received without a field for them."""
    found = [f"{where}{key}" for key in config._extra]
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, BaseConfig):
            found += _extras(value, f"{where}{f.name}.")
    return found


def test_every_yaml_default_reaches_the_spec():
    defaults = yaml_defaults()
    spec = resolve_run(compose_ppo_config([]), choose_checkpointing=False)
    sections = ("data", "actor_rollout_ref", "critic", "reward_model", "custom_reward_function", "algorithm", "trainer")
    for section in sections:
        assert _extras(getattr(spec, section)) == [], f"{section}: yaml keys without a field"
    checked = 0
    for key, value in _leaves({k: defaults[k] for k in sections}):
        if key == "trainer.backend":  # resolved: auto picks Ray for the default 8 devices
            assert (value, _read(spec, key)) == ("auto", "ray")
        else:
            assert _read(spec, key) == value, key
        checked += 1
    assert spec.ray_kwargs == defaults["ray_kwargs"]
    assert checked > 250  # the whole yaml, not a sample of it


def test_class_defaults_are_the_yaml_values():
    defaults = yaml_defaults()
    assert ActorConfig().clip_ratio_c == defaults["actor_rollout_ref"]["actor"]["clip_ratio_c"] == 3.0
    assert ActorConfig().optim.lr == defaults["actor_rollout_ref"]["actor"]["optim"]["lr"]
    assert RolloutConfig().val_kwargs.temperature == 0.0 and RolloutConfig().multi_turn.format == "hermes"
    assert KLControlConfig() == KLControlConfig.from_dict(defaults["algorithm"]["kl_ctrl"])
    assert AlgoConfig().kl_ctrl.kl_coef == 0.001 and AlgoConfig().norm_adv_by_std_in_grpo is True
    # The original's names are the same classes.
    assert FSDPActorConfig is ActorConfig and OptimizerConfig().optimizer == "AdamW"


def test_a_field_without_a_yaml_default_is_refused_when_the_class_is_defined():
    from verl.base_config import section

    with pytest.raises(TypeError, match=r"Odd.no_such_key has no default: add algorithm.no_such_key to ppo_trainer"):
        @section("algorithm")
        class Odd(BaseConfig):
            no_such_key: int


def test_configs_are_frozen_mappings():
    actor = ActorConfig()
    with pytest.raises(dataclasses.FrozenInstanceError, match="resolved once"):
        actor.clip_ratio = 0.5
    assert actor["clip_ratio"] == actor.get("clip_ratio") == 0.2 and "optim" in actor and actor.get("nope") is None
    assert dataclasses.replace(actor, clip_ratio=0.5).clip_ratio == 0.5 and actor.clip_ratio == 0.2
    assert dict(KLControlConfig()) == {"type": "fixed", "kl_coef": 0.001, "horizon": 10000, "target_kl": 0.1}


def test_omega_conf_to_dataclass_as_the_original():
    node = OmegaConf.create({"kl_coef": 0.05, "type": "adaptive"})
    kl = omega_conf_to_dataclass(node, KLControlConfig)
    assert (kl.type, kl.kl_coef, kl.horizon) == ("adaptive", 0.05, 10000)  # the rest from the yaml
    target = OmegaConf.create({"_target_": "verl.trainer.config.KLControlConfig", "kl_coef": 0.2})
    assert omega_conf_to_dataclass(target).kl_coef == 0.2
    assert omega_conf_to_dataclass(kl, KLControlConfig) is kl
    with pytest.raises(ValueError, match="_target_"):
        omega_conf_to_dataclass({"kl_coef": 0.2})


def test_who_runs_by_hand():
    assert need_critic(None, "gae") and not need_critic(None, "grpo")
    assert need_critic(True, "grpo") and not need_critic(False, "gae")
    assert need_reference_policy(True, False) and need_reference_policy(False, True)
    assert not need_reference_policy(False, False)


def run_config(*overrides):
    return compose_ppo_config(["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                               "actor_rollout_ref.rollout.n=3", "trainer.n_gpus_per_node=2", "trainer.nnodes=2",
                               "trainer.total_epochs=5", *overrides])


def test_resolve_run_derives_once_and_leaves_the_config_alone():
    config = run_config("critic.enable_resource_pool=true", "critic.n_gpus_per_node=1", "critic.nnodes=2",
                        "actor_rollout_ref.actor.use_kl_loss=true")
    before = copy.deepcopy(OmegaConf.to_container(config))
    spec = resolve_run(config, train_size=37, choose_checkpointing=False)
    assert OmegaConf.to_container(config) == before
    # 37 prompts in batches of 8 (the last 5 dropped): 4 steps per epoch, 5 epochs.
    assert spec.total_training_steps == 20
    assert spec.actor_rollout_ref.actor.optim.total_training_steps == 20 == spec.critic.optim.total_training_steps
    assert (spec.use_critic, spec.use_reference_policy, spec.use_rm) == (True, True, False)
    assert spec.pools == {"global_pool": [2, 2], "critic_pool": [1, 1]}
    assert spec.role_pool == {"actor_rollout": "global_pool", "critic": "critic_pool"}
    assert (spec.world_size("actor_rollout"), spec.world_size("critic"), spec.n_devices) == (4, 2, 6)
    # Per rank: 4 prompts x 3 samples over 4 ranks = 3 rows per optimizer step; packed forwards, so the
    # micro-batches are token budgets (use_dynamic_bsz unset).
    assert spec.policy_batching.mini_batch_size == 3
    assert spec.policy_batching.update == (None, 32768)
    assert spec.critic_batching.mini_batch_size == 4 * 3 // 2
    assert not spec.old_log_prob_in_update  # mini batch 4 < train batch 8: two optimizer steps


@pytest.mark.parametrize("overrides, backend", [
    ([], "ray"),                                                    # 2 nodes x 2 devices
    (["trainer.nnodes=1", "trainer.n_gpus_per_node=1"], "local"),  # one worker
    (["trainer.nnodes=1", "trainer.n_gpus_per_node=1", "critic.enable_resource_pool=true"], "ray"),
    (["trainer.nnodes=1", "trainer.n_gpus_per_node=1", "reward_model.enable_resource_pool=true"], "ray"),
    (["trainer.nnodes=1", "trainer.n_gpus_per_node=1", "trainer.v1.trainer_mode=separate_async"], "ray"),
    (["trainer.nnodes=1", "trainer.n_gpus_per_node=1", "+ray_kwargs.ray_init.address=auto"], "ray"),
    (["trainer.nnodes=1", "trainer.n_gpus_per_node=1", "trainer.backend=ray"], "ray"),  # asked for: kept
    (["trainer.backend=local"], "local"),  # asked for (check_backend refuses it with 2 nodes)
])
def test_auto_backend_is_local_for_one_worker_only(overrides, backend, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = run_config(*overrides)
    assert worker_backend(lambda key: OmegaConf.select(config, key)) == backend
    assert resolve_run(config, choose_checkpointing=False, choose_engine=False).trainer.backend == backend


def test_auto_backend_joins_the_cluster_ray_job_submit_names(monkeypatch):
    """``ray job submit`` sets RAY_ADDRESS for the entry point: a run of one worker then goes to the cluster."""
    config = run_config("trainer.nnodes=1", "trainer.n_gpus_per_node=1")
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert worker_backend(lambda key: OmegaConf.select(config, key)) == "ray"
    assert resolve_run(config, choose_checkpointing=False, choose_engine=False).trainer.backend == "ray"


def test_a_set_total_wins_and_a_too_small_set_names_the_key():
    assert resolve_run(run_config("trainer.total_training_steps=3"), train_size=37,
                       choose_checkpointing=False).total_training_steps == 3
    with pytest.raises(ValueError, match=r"7 prompts, fewer than data.train_batch_size=8; lower data.train_batch_size"):
        resolve_run(run_config(), train_size=7, choose_checkpointing=False)


# --------------------------------------------------------------------------------------------------
# Nothing below the trainer keeps a config default of its own
# --------------------------------------------------------------------------------------------------

def _reads_with_default(path: pathlib.Path):
    """``config_get(...)`` calls, and ``<something config>.get(key, default)`` calls, in a module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "config_get":
            yield node.lineno, "config_get"
        if isinstance(func, ast.Attribute) and func.attr == "get" and len(node.args) >= 2:
            receiver = ast.unparse(func.value).lower()
            if "config" in receiver or "cfg" in receiver:
                yield node.lineno, ast.unparse(node)


@pytest.mark.parametrize("folder", ["workers", "algorithms", "models", "rewards", "data"])
def test_no_config_read_with_a_default_of_its_own(folder):
    found = [f"{path.relative_to(PACKAGE)}:{line}: {code}" for path in sorted((PACKAGE / folder).rglob("*.py"))
             for line, code in _reads_with_default(path)]
    assert not found, "config defaults live in ppo_trainer.yaml only:\n" + "\n".join(found)


def test_trainer_sections_from_the_python_api_keep_their_overrides():
    trainer = TrainerConfig(total_epochs=2)
    assert trainer.to_overrides() == {"trainer.total_epochs": 2} and trainer.save_freq == -1


@pytest.mark.parametrize("config_name,sections", [
    ("ppo_trainer", ("data", "actor_rollout_ref", "critic", "reward_model", "custom_reward_function", "algorithm",
                     "trainer")),
    ("sft_trainer", ("data",)),
])
def test_the_declared_types_agree_with_the_yaml_defaults(config_name, sections):
    from verl.trainer.config.checks import _type_of, declared_types
    from verl.trainer.config.spec import RunSpec
    from verl.trainer.fsdp_sft_trainer import SFTSections

    root = RunSpec if config_name == "ppo_trainer" else SFTSections
    defaults = yaml_defaults(config_name)
    for key, value in _leaves({k: defaults[k] for k in sections}):
        typed = declared_types(key, root)
        if typed is None:  # inside a free-form dict (override_config, engine_kwargs, ...)
            assert any(declared_types(key.rsplit(".", i)[0], root) == ((dict,), False)
                       for i in range(1, key.count("."))), key
            continue
        declared, nullable = typed
        assert nullable if value is None else _type_of(value) in declared + ((int,) if float in declared else ()), key


def test_null_is_refused_where_a_value_is_needed():
    from verl.trainer.config_validation import ConfigError, validate_config

    with pytest.raises(ConfigError) as info:
        validate_config(compose_ppo_config(["data.seed=null", "actor_rollout_ref.rollout.temperature=null",
                                            "critic.enable=null"]))
    problems = info.value.problems
    assert "data.seed: cannot be null: it needs an integer, e.g. data.seed=1" in problems
    assert "actor_rollout_ref.rollout.temperature: cannot be null: it needs a number, e.g. " \
           "actor_rollout_ref.rollout.temperature=1.0" in problems
    assert not any(p.startswith("critic.enable") for p in problems)  # null: decided by the estimator
    with pytest.raises(ConfigError, match=r"ray_kwargs.ray_init.num_cpus: expected a positive integer"):
        validate_config(compose_ppo_config(["ray_kwargs.ray_init.num_cpus=abc"]))


def test_a_partial_section_is_read_over_the_yaml_and_follows_what_it_sets():
    from verl.workers.config import ActorRolloutRefConfig

    policy = ActorRolloutRefConfig.from_config({"actor": {"ppo_max_token_len_per_gpu": 4096,
                                                          "checkpoint": {"save_contents": ["model"]},
                                                          "fsdp_config": {"dtype": "float32"}}})
    # ref.* and rollout.log_prob_* follow the actor's keys in the yaml; checkpoint.load_contents its save_contents
    assert policy.ref.log_prob_max_token_len_per_gpu == policy.rollout.log_prob_max_token_len_per_gpu == 4096
    assert policy.ref.fsdp_config.dtype == "float32" and policy.actor.checkpoint.load_contents == ["model"]
    assert policy.actor.clip_ratio == 0.2  # the rest: the yaml's


def test_defaults_are_fresh_copies():
    first = ActorConfig()
    first.optim.betas[0] = 0.5  # a list inside a frozen config can still be changed in place...
    assert ActorConfig().optim.betas == [0.9, 0.999] == yaml_defaults()["actor_rollout_ref"]["actor"]["optim"]["betas"]


# ------------------------------------------------------------------------------------------------ over_yaml
def _both_ways(values, key):
    """over_yaml's answer and the merge-over-the-yaml it stands for."""
    from verl.base_config import _merged_over_yaml, over_yaml

    return over_yaml(values, key), _merged_over_yaml(copy.deepcopy(values), key, "ppo_trainer")


def test_a_whole_resolved_section_is_taken_as_given_and_equals_the_merge():
    """Every section of a composed, resolved config (what a run's from_config calls receive) skips the merge and
    gives what the merge gives; so does the run spec built from it."""
    from verl.base_config import _covers, _resolved_yaml, _unresolved_yaml, at
    from verl.trainer.config.spec import SECTIONS

    config = OmegaConf.to_container(compose_ppo_config(["actor_rollout_ref.rollout.n=3", "data.train_batch_size=6"]),
                                    resolve=True)
    for name, cls in SECTIONS.items():
        key = cls._YAML[0]
        assert _covers(config[name], at(_unresolved_yaml("ppo_trainer"), key), at(_resolved_yaml("ppo_trainer"), key))
        fast, merged = _both_ways(config[name], key)
        assert fast == merged, name
        assert fast is not config[name]  # a copy: the caller's data stays its own


@pytest.mark.parametrize("change", ["drop a key", "drop a group key", "null group", "interpolation", "tuple",
                                    "missing marker", "dict for a list", "list for a dict", "group for a reference"])
def test_a_partial_or_non_plain_section_is_merged_over_the_yaml(change):
    from verl.base_config import _covers, _resolved_yaml, _unresolved_yaml, at

    section = copy.deepcopy(yaml_defaults()["actor_rollout_ref"])
    if change == "drop a key":
        del section["actor"]["ppo_epochs"]
    elif change == "drop a group key":
        del section["actor"]["optim"]["lr"]
    elif change == "null group":
        section["actor"]["checkpoint"] = None
    elif change == "interpolation":  # follows the key it names, as in the yaml
        section["ref"]["log_prob_micro_batch_size_per_gpu"] = "${actor_rollout_ref.rollout.n}"
        section["rollout"]["n"] = 5
    elif change == "tuple":
        section["rollout"]["top_k"] = (1, 2)
    elif change == "missing marker":  # '???' is "not given" to a merge: the yaml's value stays
        section["actor"]["ppo_epochs"] = "???"
    elif change == "dict for a list":  # a merge refuses it; taken as given, nobody would
        section["actor"]["checkpoint"]["save_contents"] = {}
    elif change == "list for a dict":
        section["model"]["override_config"] = []
    else:  # the yaml's ${algorithm.rollout_correction} names a group: a partial dict is merged into all its keys
        section["actor"]["policy_loss"]["rollout_correction"] = {"bypass_mode": True}
    assert not _covers(section, at(_unresolved_yaml("ppo_trainer"), "actor_rollout_ref"),
                       at(_resolved_yaml("ppo_trainer"), "actor_rollout_ref"))
    if change in ("dict for a list", "list for a dict"):
        from omegaconf.errors import ConfigTypeError

        with pytest.raises(ConfigTypeError):
            _both_ways(section, "actor_rollout_ref")
        return
    fast, merged = _both_ways(section, "actor_rollout_ref")
    assert fast == merged
    if change == "drop a key":
        assert fast["actor"]["ppo_epochs"] == yaml_defaults()["actor_rollout_ref"]["actor"]["ppo_epochs"]
    if change == "interpolation":
        assert fast["ref"]["log_prob_micro_batch_size_per_gpu"] == 5
    if change == "tuple":
        assert fast["rollout"]["top_k"] == [1, 2]
    if change == "missing marker":
        assert fast["actor"]["ppo_epochs"] == yaml_defaults()["actor_rollout_ref"]["actor"]["ppo_epochs"]
    if change == "group for a reference":
        assert fast["actor"]["policy_loss"]["rollout_correction"] == {
            **yaml_defaults()["algorithm"]["rollout_correction"], "bypass_mode": True}


def test_a_whole_section_may_replace_a_value_by_a_group_and_add_keys():
    """Keys the yaml lacks and a plain value given as a dict stay as given, as the merge keeps them."""
    section = copy.deepcopy(yaml_defaults()["algorithm"])
    section["kl_ctrl"]["extra_key"] = {"a": [1, {"b": None}]}
    section["new_top_key"] = 1.5
    first_leaf = next(k for k, v in section.items() if not isinstance(v, dict))
    section[first_leaf] = {"was": "a leaf"}
    fast, merged = _both_ways(section, "algorithm")
    assert fast == merged == section
