"""Config: YAML == typed schema, strict keys with suggestions, and one test per validation rule."""
import pytest

from rlx.config.export import missing_docs, render
from rlx.config.loader import CONFIG_DIR
from rlx.config.verl_compat import NOT_SUPPORTED

from conftest import load_config, refusal  # the quickstart job's config


def err(*overrides) -> str:
    with pytest.raises(ValueError) as e:
        load_config(list(overrides))
    return str(e.value)


def test_yaml_is_the_view_of_the_dataclasses():
    assert (CONFIG_DIR / "ppo_trainer.yaml").read_text() == render(), "run `python -m rlx.config.export`"


def test_every_field_has_a_docstring():
    assert missing_docs() == []


def test_defaults_load_and_interpolate():
    cfg = load_config([])
    assert cfg.critic.strategy == cfg.actor_rollout_ref.actor.strategy
    assert cfg.actor_rollout_ref.rollout.response_length == cfg.data.max_response_length


def test_verl_command_line_keys_are_accepted():
    cfg = load_config([
        "algorithm.adv_estimator=grpo", "data.train_batch_size=8", "data.max_prompt_length=16",
        "data.max_response_length=16", "data.filter_overlong_prompts=True", "data.truncation=error",
        "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0", "trainer.logger=[console]",
        "trainer.project_name=p", "trainer.experiment_name=e", "trainer.n_gpus_per_node=2", "trainer.nnodes=1",
        "trainer.save_freq=20", "trainer.test_freq=5", "trainer.total_epochs=15",
        "actor_rollout_ref.model.override_config.attention_dropout=0.0",
    ])
    assert cfg.actor_rollout_ref.model.override_config == {"attention_dropout": 0.0}


@pytest.mark.parametrize("override", ["actor_rollout_ref.model.enable_activation_offloading=True",
                                      "+actor_rollout_ref.model.enable_activation_offloading=True",
                                      "++actor_rollout_ref.model.enable_activation_offloading=True"])
def test_misspelled_key_suggests_the_nearest(override):
    msg = err(override)
    assert "enable_activation_offloading" in msg
    assert "Did you mean 'actor_rollout_ref.model.enable_activation_offload'" in msg


def test_key_in_wrong_section_suggests_its_home():
    assert "Did you mean 'actor_rollout_ref.actor.ppo_epochs'" in err("actor_rollout_ref.rollout.ppo_epochs=2")


def test_unknown_key_in_user_yaml(tmp_path):
    (tmp_path / "mine.yaml").write_text("defaults:\n  - ppo_trainer\n  - _self_\ntrainer:\n  total_epoch: 3\n")
    import shutil
    shutil.copy(CONFIG_DIR / "ppo_trainer.yaml", tmp_path / "ppo_trainer.yaml")
    with pytest.raises(ValueError, match="Did you mean 'trainer.total_epochs'"):
        load_config([], config_dir=tmp_path, config_name="mine")


def test_type_errors_name_the_key():
    assert "data.train_batch_size" in err("data.train_batch_size=abc")


@pytest.mark.parametrize("key", sorted(NOT_SUPPORTED))
def test_not_supported_keys_exist_and_reject_non_defaults(key):
    default = NOT_SUPPORTED[key]
    if isinstance(default, dict):  # a free-form dict: set one of its keys
        inner = next(iter(default), "some_arg")  # an empty one: add a key
        msg = err(f"{key}.{inner}=other")
    else:
        value = {bool: "False" if default is True else "True", int: "2", str: "other", type(None): "2"}[type(default)]
        msg = err(f"{key}={value}")
    assert key in msg and "not supported yet" in msg


@pytest.mark.parametrize("role,strategy_key,offload_key", [
    ("actor", "actor_rollout_ref.actor.strategy", "actor_rollout_ref.model.enable_activation_offload"),
    ("critic", "critic.strategy", "critic.model.enable_activation_offload"),
])
def test_offload_requires_fsdp_strategy(role, strategy_key, offload_key):
    msg = err(f"{strategy_key}=megatron", f"{offload_key}=True", "algorithm.adv_estimator=gae")
    assert f"{offload_key}=True requires {strategy_key} to be fsdp or fsdp2" in msg
    assert "'megatron'" in msg


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_offload_accepted_with_fsdp(strategy):
    load_config([f"actor_rollout_ref.actor.strategy={strategy}",
                 "actor_rollout_ref.model.enable_activation_offload=True"])


def test_offload_needs_three_layers():
    msg = refusal(["actor_rollout_ref.model.enable_activation_offload=True",
                   "actor_rollout_ref.model.override_config.num_hidden_layers=2"])
    assert "actor_rollout_ref.model.enable_activation_offload=True needs a model with at least 3" in msg


def test_strategy_must_be_fsdp():
    assert "actor_rollout_ref.actor.strategy='megatron' is not supported" in err("actor_rollout_ref.actor.strategy=megatron")


def test_train_batch_must_divide_world_size():
    msg = err("data.train_batch_size=3", "actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=gae",
              "actor_rollout_ref.actor.ppo_mini_batch_size=3", "actor_rollout_ref.rollout.do_sample=True")
    assert "data.train_batch_size * actor_rollout_ref.rollout.n" in msg


def test_mini_batch_must_divide_train_batch():
    assert "ppo_mini_batch_size=5 must be positive and divide data.train_batch_size=16" in \
        err("actor_rollout_ref.actor.ppo_mini_batch_size=5")


def test_micro_batch_need_not_divide_the_mini_batch_but_must_be_positive():
    # verl splits a per-rank mini-batch of 160 into 64 + 64 + 32; so does rlx (gradients stay exact)
    load_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"])
    msg = err("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0")
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0 must be a positive integer" in msg
    load_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null", "actor_rollout_ref.actor.use_dynamic_bsz=True"])


def test_critic_micro_batch_checked_for_gae():
    msg = err("algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=0")
    assert "critic.ppo_micro_batch_size_per_gpu=0" in msg


def test_dynamic_bsz_needs_a_positive_token_budget():
    msg = err("actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=0",
              "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
              "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=-1")
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=0 must be a positive integer" in msg
    assert "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=-1 must be a positive integer" in msg


def test_fused_head_and_tiling_knobs_checked():
    msg = err("actor_rollout_ref.model.fused_kernel_options.chunk_size=0", "critic.model.tile_mlp_tokens=-1")
    assert "actor_rollout_ref.model.fused_kernel_options.chunk_size=0 must be a positive integer" in msg
    assert "critic.model.tile_mlp_tokens=-1 must be >= 0" in msg
    msg = err("actor_rollout_ref.model.tile_layer_tokens=-8", "critic.model.tile_layer_tokens=4096",
              "critic.model.enable_gradient_checkpointing=False")
    assert "actor_rollout_ref.model.tile_layer_tokens=-8 must be >= 0" in msg
    assert "critic.model.tile_layer_tokens=4096 recomputes each decoder layer" in msg
    assert "Fix: critic.model.enable_gradient_checkpointing=True" in msg
    cfg = load_config(["actor_rollout_ref.model.tile_layer_tokens=8192", "critic.model.tile_layer_tokens=8192",
                       "actor_rollout_ref.model.activation_offload.reserve_pool=False"])
    assert cfg.actor_rollout_ref.model.tile_layer_tokens == cfg.critic.model.tile_layer_tokens == 8192
    assert cfg.actor_rollout_ref.model.activation_offload.reserve_pool is False


def test_deprecated_global_micro_batch_next_to_its_per_gpu_key_rejected():
    # the quickstart sets actor.ppo_micro_batch_size_per_gpu=8 (alone, the global key derives it: test_verl_leniency)
    assert "are both set (verl refuses this too)" in err("actor_rollout_ref.actor.ppo_micro_batch_size=4")


@pytest.mark.parametrize("override,key", [
    ("algorithm.adv_estimator=ppo2", "algorithm.adv_estimator"),
    ("actor_rollout_ref.actor.loss_agg_mode=mean", "actor_rollout_ref.actor.loss_agg_mode"),
    ("actor_rollout_ref.actor.kl_loss_type=k9", "actor_rollout_ref.actor.kl_loss_type"),
    ("algorithm.kl_penalty=k9", "algorithm.kl_penalty"),
    ("algorithm.kl_ctrl.type=pid", "algorithm.kl_ctrl.type"),
    ("data.truncation=drop", "data.truncation"),
    ("trainer.device=tpu", "trainer.device"),
    ("trainer.logger=[console,mlflow]", "trainer.logger"),
    ("actor_rollout_ref.rollout.name=trtllm", "actor_rollout_ref.rollout.name"),
])
def test_unknown_choices(override, key):
    msg = err(override)
    assert key in msg and "choose one of" in msg


def test_n_gt_1_with_greedy_rejected():
    assert "gives n identical responses" in err("actor_rollout_ref.rollout.temperature=0")


def test_tp_must_divide_world_size():
    assert "tensor_model_parallel_size=3 must divide the world size 2" in \
        err("actor_rollout_ref.rollout.tensor_model_parallel_size=3")


def test_max_model_len_must_fit():
    assert "max_model_len=8 is smaller" in err("actor_rollout_ref.rollout.max_model_len=8")


def test_resume_path_needs_path():
    assert "trainer.resume_from_path" in err("trainer.resume_mode=resume_path")


def test_all_errors_reported_together():
    msg = err("algorithm.adv_estimator=ppo2", "data.truncation=drop")
    assert "algorithm.adv_estimator" in msg and "data.truncation" in msg


def test_explicit_vllm_without_vllm_names_the_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    msg = refusal(["actor_rollout_ref.rollout.name=vllm"])
    assert "vLLM is not installed" in msg and "scripts/setup.sh" in msg and "rollout.name=hf" in msg


def test_closed_choices_are_declared_on_their_fields():
    """Each closed choice sits on its field (rlx.config.rules.choice) and the one walker checks it: the quickstart's
    values are among their choices, and a bad value anywhere in the tree is named with its key and the choices."""
    from rlx.config.rules import choice_errors, declared_choices

    cfg = load_config()
    declared = {key: (value, choices) for key, value, choices, _ in declared_choices(cfg)}
    for key in ("algorithm.adv_estimator", "algorithm.kl_penalty", "actor_rollout_ref.actor.loss_agg_mode",
                "actor_rollout_ref.actor.policy_loss.loss_mode", "actor_rollout_ref.rollout.load_format",
                "actor_rollout_ref.rollout.multi_turn.format", "critic.optim.warmup_style", "data.truncation",
                "trainer.logger", "trainer.device", "reward_model.reward_manager"):
        assert key in declared, key
    errors: list[str] = []
    choice_errors(cfg, errors)
    assert errors == []
    cfg.critic.optim.warmup_style, cfg.trainer.logger = "linear", ["console", "nope"]
    choice_errors(cfg, errors)
    assert errors == ["critic.optim.warmup_style='linear' is not valid; choose one of ['constant', 'cosine']. Fix: "
                      "critic.optim.warmup_style=<one of them>.",
                      "trainer.logger='nope' is not valid; choose one of ['console', 'file', 'tensorboard', 'wandb', "
                      "'swanlab']. Fix: trainer.logger=<one of them>."]
