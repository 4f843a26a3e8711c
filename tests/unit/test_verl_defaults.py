"""A verl command means in rlx what it means in verl: the base config holds verl 0.9.1's default for every shared key
(tests/verl_defaults.py) except the listed exceptions; rlx's small default job lives in its own config,
`--config-name quickstart`; overrides of a section the job never builds (critic, ref) are named, once."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from rlx.config import load_config as load_base_config
from rlx.config.loader import SCHEMA_KEYS, SECTION_KEYS, compose, to_typed
from rlx.config.verl_compat import VERL_DEFAULT_EXCEPTIONS
from rlx.plan import make_plan
from rlx.trainer import cli
from rlx.trainer import launch, main_ppo

from conftest import load_config
from verl_defaults import VERL_DEFAULTS

# verl's docs quickstart (PPO on GSM8K), as printed there; only tests swap its model and data
VERL_QUICKSTART = """
    data.train_files=$HOME/data/gsm8k/train.parquet data.val_files=$HOME/data/gsm8k/test.parquet
    data.train_batch_size=256 data.max_prompt_length=512 data.max_response_length=512
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.4
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4
    critic.optim.lr=1e-5 critic.model.path=Qwen/Qwen2.5-0.5B-Instruct critic.ppo_micro_batch_size_per_gpu=4
    algorithm.kl_ctrl.kl_coef=0.001
    trainer.logger=console trainer.val_before_train=False trainer.n_gpus_per_node=1 trainer.nnodes=1
    trainer.save_freq=10 trainer.test_freq=10 trainer.total_epochs=15
""".split()


def flat(obj, prefix: str = "") -> dict:
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out.update(flat(value, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = value
    return out


@pytest.fixture(scope="module")
def base_defaults() -> dict:
    """The base config's values, interpolations resolved (`trainer.device` stays `auto`: it resolves per machine)."""
    return flat(to_typed(compose([])))


def test_table_names_schema_leaf_keys():
    assert set(VERL_DEFAULTS) <= SCHEMA_KEYS - SECTION_KEYS, set(VERL_DEFAULTS) - SCHEMA_KEYS


def test_base_config_has_verls_defaults_except_the_listed(base_defaults):
    differ = {key: (base_defaults[key], verl) for key, verl in VERL_DEFAULTS.items()
              if key not in VERL_DEFAULT_EXCEPTIONS and base_defaults[key] != verl}
    assert differ == {}, (
        f"rlx defaults that are not verl {__import__('verl_defaults').VERL_VERSION}'s ({{key: (rlx, verl)}}): "
        f"{differ}. Give the key verl's default in rlx/config/schema.py (the quickstart config may set rlx's "
        f"value), or, if it changes only speed or memory, list it in VERL_DEFAULT_EXCEPTIONS with the reason.")


@pytest.mark.parametrize("key", sorted(VERL_DEFAULT_EXCEPTIONS))
def test_each_exception_is_real_and_says_why(key, base_defaults):
    rlx_value, verl_value, reason = VERL_DEFAULT_EXCEPTIONS[key]
    assert key in VERL_DEFAULTS, f"{key} is not a key rlx shares with verl: nothing to except"
    assert verl_value == VERL_DEFAULTS[key], f"the exception's verl value of {key} is not the table's"
    assert rlx_value == base_defaults[key], f"the exception's rlx value of {key} is not the base config's"
    assert rlx_value != verl_value, f"{key} has verl's default: remove it from VERL_DEFAULT_EXCEPTIONS"
    assert len(reason.split()) >= 5, f"{key}: say why the default differs"


def test_readme_lists_every_exception():
    from conftest import REPO

    readme = open(f"{REPO}/docs/reference.md").read()  # the README links its section "verl's defaults"
    missing = [key for key in VERL_DEFAULT_EXCEPTIONS if f"`{key}`" not in readme]
    assert missing == [], f"docs/reference.md's verl section must show the exceptions: {missing}"


def test_verls_quickstart_command_validates_on_the_base_config():
    """verl's PPO quickstart, with a model, data and a machine this test has: GAE with a critic, n=1, verl's lrs."""
    swap = {"actor_rollout_ref.model.path": "builtin://tiny-qwen2", "critic.model.path": "builtin://tiny-qwen2",
            "actor_rollout_ref.rollout.name": "hf", "trainer.n_gpus_per_node": "2"}
    argv = [f"{k}={swap.get(k, v)}" for k, _, v in (a.partition("=") for a in VERL_QUICKSTART)]
    cfg = load_base_config(argv + ["trainer.device=cpu"])
    assert cfg.algorithm.adv_estimator == "gae" and cfg.actor_rollout_ref.rollout.n == 1
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6 and cfg.critic.optim.lr == 1e-5
    assert cfg.critic.ppo_mini_batch_size == 64 and cfg.critic.ppo_micro_batch_size_per_gpu == 4
    assert cfg.trainer.total_training_steps is None and cfg.trainer.total_epochs == 15


def test_base_config_alone_names_what_verl_requires():
    """verl's default batch sizes are per-GPU-unset: the base config says which keys to set (and the fix)."""
    with pytest.raises(ValueError) as e:
        load_base_config(["trainer.device=cpu", "trainer.logger=console"])
    msg = str(e.value)
    for key in ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1"):
        assert key in msg, (key, msg)


# ---- the quickstart config ----------------------------------------------------------------------------------------
def test_quickstart_is_the_tiny_grpo_job():
    cfg = load_config([])
    assert cfg.actor_rollout_ref.model.path == "builtin://tiny-qwen2"
    assert cfg.data.train_files.startswith("synthetic://digits/")
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.actor_rollout_ref.rollout.n == 4
    assert cfg.actor_rollout_ref.actor.optim.lr == 3e-3 and cfg.trainer.total_training_steps == 20
    assert cfg.trainer.default_local_dir == "checkpoints/rlx/default"


def test_quickstart_sets_only_keys_the_base_config_has():
    """It is a Hydra config on top of ppo_trainer: every key it sets exists there (else compose fails) and differs
    from the base value (a key equal to verl's default does not belong in it)."""
    from rlx.config.loader import CONFIG_DIR

    def leaves(node, prefix=""):
        for k, v in node.items():
            if isinstance(v, dict):
                yield from leaves(v, f"{prefix}{k}.")
            else:
                yield prefix + k, v

    text = yaml.safe_load((CONFIG_DIR / "quickstart.yaml").read_text())
    assert text.pop("defaults") == ["ppo_trainer", "_self_"]
    base = flat(to_typed(compose([])))
    same = [key for key, value in leaves(text) if base[key] == value]
    assert same == [], f"quickstart.yaml repeats base values: {same}"


def test_cfg_job_and_help_with_the_quickstart_config(capsys):
    assert main_ppo.main(["--config-name", "quickstart", "--cfg", "job", "actor_rollout_ref.rollout.n=8"]) == 0
    out, err = capsys.readouterr()
    tree = yaml.safe_load(out)
    assert tree["actor_rollout_ref"]["rollout"]["n"] == 8 and tree["algorithm"]["adv_estimator"] == "grpo"
    assert "would stop before it starts" not in err, err  # the quickstart job validates
    assert main_ppo.main(["--config-name", "quickstart", "--help"]) == 0
    assert "quickstart" in capsys.readouterr().out


# ---- unused sections are said -------------------------------------------------------------------------------------
def _with_plan(cfg):
    return cfg, make_plan(cfg)


def test_critic_keys_with_grpo_are_named_once():
    argv = ["critic.optim.lr=1e-5", "critic.model.path=builtin://tiny-qwen2", "critic.optim.lr=2e-5"]  # named once
    notes = cli.unused_section_notes(argv, *_with_plan(load_config(argv)))
    assert notes == ["rlx: note: critic.optim.lr, critic.model.path unused: algorithm.adv_estimator=grpo trains no "
                     "critic (only gae does)"]
    gae = argv + ["algorithm.adv_estimator=gae"]
    assert cli.unused_section_notes(gae, *_with_plan(load_config(gae))) == []


@pytest.mark.parametrize("kl,unused", [([], True), (["actor_rollout_ref.actor.use_kl_loss=True"], False),
                                       (["algorithm.use_kl_in_reward=True"], False)])
def test_ref_keys_without_a_kl_term_are_named(kl, unused):
    argv = ["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4"] + kl
    notes = cli.unused_section_notes(argv, *_with_plan(load_config(argv)))
    assert notes == (["rlx: note: actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu unused: no reference "
                      "policy is built (actor_rollout_ref.actor.use_kl_loss=False and "
                      "algorithm.use_kl_in_reward=False)"] if unused else [])


def test_cli_says_unused_critic_keys_before_anything_starts(tmp_path, capsys, monkeypatch):
    def no_ray(cfg):
        raise AssertionError("Ray must not start")

    monkeypatch.setattr(launch, "init_ray", no_ray)
    code = main_ppo.main(["--config-name", "quickstart", "critic.optim.lr=1e-5",
                          f"data.train_files={tmp_path}/missing.parquet"])  # preflight stops the run: no Ray
    err = capsys.readouterr().err
    assert code == 2
    lines = err.splitlines()
    assert lines[0] == "rlx: note: critic.optim.lr unused: algorithm.adv_estimator=grpo trains no critic (only gae " \
                       "does)", err
    assert sum(line.startswith("rlx: note:") for line in lines) == 1
