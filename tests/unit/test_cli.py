"""The entry point's command line behaves like a Hydra app's: --cfg, --help, one-line errors for bad overrides."""

import pytest
import yaml

from rlx.trainer.main_ppo import main


# verl's examples/grpo_trainer/run_qwen2-7b.sh, as the shell hands it over, plus activation offload
VERL_GRPO = [
    "algorithm.adv_estimator=grpo", "data.train_files=/data/gsm8k/train.parquet",
    "data.val_files=/data/gsm8k/test.parquet", "data.train_batch_size=1024", "data.max_prompt_length=512",
    "data.max_response_length=1024", "data.filter_overlong_prompts=True", "data.truncation=error",
    "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40", "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.model.enable_activation_offload=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0", 'trainer.logger=["console","wandb"]',
    "trainer.project_name=verl_grpo_example_gsm8k", "trainer.experiment_name=qwen2_7b_function_rm",
    "trainer.n_gpus_per_node=8", "trainer.nnodes=1", "trainer.save_freq=20", "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


def run_main(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cfg_job_prints_the_composed_tree_of_a_verl_command_line(capsys):
    code, out, _ = run_main(capsys, *VERL_GRPO, "--cfg", "job")
    assert code == 0
    tree = yaml.safe_load(out)
    assert set(tree) == {"data", "actor_rollout_ref", "critic", "reward_model", "custom_reward_function",
                         "algorithm", "trainer", "ray_init", "global_profiler", "reward", "sandbox_fusion", "rollout",
                         "async_training"}
    assert tree["actor_rollout_ref"]["model"]["enable_activation_offload"] is True
    assert tree["actor_rollout_ref"]["rollout"]["n"] == 5
    assert tree["trainer"]["logger"] == ["console", "wandb"]
    assert tree["critic"]["strategy"] == "${actor_rollout_ref.actor.strategy}"  # unresolved, as Hydra prints


@pytest.mark.parametrize("flags", [["--cfg=job"], ["-c", "job"], ["--cfg", "job", "--resolve"]])
def test_cfg_job_spellings(capsys, flags):
    code, out, _ = run_main(capsys, "trainer.total_epochs=3", *flags)
    assert code == 0
    tree = yaml.safe_load(out)
    assert tree["trainer"]["total_epochs"] == 3
    if "--resolve" in flags:
        assert tree["critic"]["strategy"] == tree["actor_rollout_ref"]["actor"]["strategy"]


def test_cfg_all_adds_the_hydra_section(capsys):
    code, out, _ = run_main(capsys, "--config-name", "quickstart", "--cfg", "all")
    assert code == 0
    tree = yaml.safe_load(out)
    assert "hydra" in tree and "run" in tree["hydra"]
    assert tree["data"]["max_prompt_length"] == 16  # the quickstart's, over verl's 512 of the base config
    code, out, _ = run_main(capsys, "--cfg", "hydra")
    assert code == 0 and set(yaml.safe_load(out)) == {"hydra"}


def test_cfg_package_prints_one_node(capsys):
    code, out, _ = run_main(capsys, "--cfg", "job", "-p", "actor_rollout_ref.rollout", "actor_rollout_ref.rollout.n=3")
    assert code == 0
    assert out.startswith("# @package actor_rollout_ref.rollout\n")
    assert yaml.safe_load(out)["n"] == 3


def test_cfg_job_still_rejects_unknown_keys(capsys):
    code, _, err = run_main(capsys, "--cfg", "job", "trainer.total_epoch=3")
    assert code == 2
    assert "Did you mean 'trainer.total_epochs'" in err


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help(capsys, flag):
    code, out, _ = run_main(capsys, flag)
    assert code == 0
    assert out.startswith("usage: python -m rlx.trainer.main_ppo")
    for text in ("== Config groups ==", "actor_rollout_ref.rollout", "rlx/trainer/config/ppo_trainer.yaml",
                 "README.md", "--cfg"):
        assert text in out, text


@pytest.mark.parametrize("bad,reason", [
    ("trainer.total_epochs", "no '='"),
    ("a=b=c", "contains '='"),
    ("foo.=1", "empty part"),
    ("trainer.logger=[console", "unbalanced brackets"),
    ("data.train_files={a:1", "unbalanced brackets"),
    ("=3", "key before '=' is empty"),
])
def test_malformed_override_is_one_line(capsys, bad, reason):
    code, out, err = run_main(capsys, "trainer.total_epochs=2", bad)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"rlx: cannot parse override {bad!r}: "), err
    assert reason in lines[0] and lines[0].endswith("Use key=value."), err


def test_unknown_flag(capsys):
    code, _, err = run_main(capsys, "--frobnicate")
    assert code == 2 and "unknown option '--frobnicate'" in err


def test_logger_as_a_bare_string_is_a_one_element_list():
    from conftest import load_config  # the quickstart config

    assert load_config(["trainer.logger=console"]).trainer.logger == ["console"]


def test_unknown_plus_key_suggests_a_full_key_not_its_section():
    from rlx.config.loader import suggest_key

    hint = suggest_key("trainer.foo")
    assert hint is not None and hint.startswith("trainer.") and hint != "trainer"


def test_cfg_job_notes_what_validation_would_refuse(capsys):
    code, out, err = run_main(capsys, "--cfg", "job", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=0")
    assert code == 0 and yaml.safe_load(out)["actor_rollout_ref"]["rollout"]["n"] == 0
    assert "rlx: note:" in err and "actor_rollout_ref.rollout.n=0 must be >= 1" in err


def test_check_lists_every_validation_error_and_exits_2(capsys):
    code, out, err = run_main(capsys, "--config-name", "quickstart", "actor_rollout_ref.actor.ppo_mini_batch_size=5",
                              "trainer.use_legacy_worker_impl=maybe", "--check")
    assert code == 2 and out == ""
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=5 must be positive and divide" in err
    assert "trainer.use_legacy_worker_impl='maybe' is not valid" in err


def test_check_runs_the_preflight(capsys, tmp_path):
    missing = tmp_path / "nope.parquet"
    code, out, err = run_main(capsys, "--config-name", "quickstart", f"data.train_files={missing}", "--check")
    assert code == 2 and out == ""
    assert "the job cannot start (checked before Ray)" in err and str(missing) in err


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_check_refuses_another_engine_in_one_line_and_runs_the_rest_of_the_preflight(capsys, tmp_path, engine):
    """A rollout engine rlx does not serve is one config error with its fix; the preflight still runs (here it
    finds the missing data file), so --check shows every problem at once."""
    missing = tmp_path / "nope.parquet"
    code, out, err = run_main(capsys, "--config-name", "quickstart", f"actor_rollout_ref.rollout.name={engine}",
                              "reward_model.enable=True", "reward_model.model.path=builtin://tiny-qwen2",
                              "reward_model.judge.enable=True", "reward_model.rollout.name=sglang",
                              f"data.train_files={missing}", "--check")
    assert code == 2 and out == ""
    assert "stopped early" not in err and "AssertionError" not in err
    for key, name in (("actor_rollout_ref.rollout.name", engine), ("reward_model.rollout.name", "sglang")):
        [refusal] = [line for line in err.splitlines() if f"{key}={name}" in line or f"{key}={name!r}" in line]
        assert "Fix:" in refusal
    assert f"data file '{missing}' does not exist" in err


def test_check_and_cfg_together_is_a_usage_error(capsys):
    code, _, err = run_main(capsys, "--check", "--cfg", "job")
    assert code == 2 and "--check and --cfg" in err


# ---- verl's --config-path / --config-name ---------------------------------------------------------------------------
VERL_STYLE_YAML = """\
hydra:
  searchpath:
    - file://verl/trainer/config
defaults:
  - ppo_trainer
  - _self_
data:
  max_prompt_length: 24
actor_rollout_ref:
  rollout:
    n: 3
"""


def test_user_config_from_a_path_composes_over_rlx_ppo_trainer(capsys, tmp_path):
    import warnings

    (tmp_path / "mine.yaml").write_text(VERL_STYLE_YAML)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # verl's searchpath entry, absent here, is dropped without a warning
        for name in ("mine", "mine.yaml"):
            code, out, err = run_main(capsys, f"--config-path={tmp_path}", f"--config-name={name}",
                                      "data.max_response_length=40", "--cfg", "job")
            assert code == 0, err
            tree = yaml.safe_load(out)
            assert tree["data"]["max_prompt_length"] == 24 and tree["actor_rollout_ref"]["rollout"]["n"] == 3
            assert tree["data"]["max_response_length"] == 40  # the command line over the file
            assert tree["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] == 256  # rlx's ppo_trainer (verl's)


def test_user_dir_is_searched_before_rlx(capsys, tmp_path):
    """A defaults entry the user's dir holds is the user's (here a `quickstart` of their own), else rlx's."""
    (tmp_path / "quickstart.yaml").write_text("defaults: [ppo_trainer, _self_]\ndata:\n  max_prompt_length: 99\n")
    (tmp_path / "mine.yaml").write_text("defaults:\n  - quickstart\n  - _self_\n")
    code, out, err = run_main(capsys, "-cp", str(tmp_path), "-cn", "mine", "--cfg", "job", "-p", "data")
    assert code == 0, err
    assert yaml.safe_load(out)["max_prompt_length"] == 99


def test_relative_config_path_is_hydras(capsys, tmp_path, monkeypatch):
    """Relative to rlx/trainer/ first (verl's `--config-path=config` is the trainer's own config dir), then to the
    working directory."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(capsys, "--config-path=config", "--config-name=quickstart.yaml", "--cfg", "job")
    assert code == 0, err
    assert yaml.safe_load(out)["data"]["max_prompt_length"] == 16  # rlx's quickstart
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "job.yaml").write_text(VERL_STYLE_YAML)
    code, out, err = run_main(capsys, "--config-path", "mine", "--config-name", "job", "--cfg", "job")
    assert code == 0, err
    assert yaml.safe_load(out)["data"]["max_prompt_length"] == 24


def test_missing_config_dir_is_exit_2_naming_it(capsys, tmp_path):
    code, out, err = run_main(capsys, f"--config-path={tmp_path / 'absent'}", "--config-name=x", "--check")
    assert code == 2 and out == ""
    assert f"--config-path {tmp_path / 'absent'}: no such directory" in err and "Traceback" not in err


def test_missing_config_file_is_exit_2_naming_it(capsys, tmp_path):
    code, _, err = run_main(capsys, f"--config-path={tmp_path}", "--config-name=absent", "--check")
    assert code == 2
    assert f"--config-name absent: no absent.yaml in {tmp_path} nor in rlx's config dir" in err
    assert "'ppo_trainer'" in err and "Traceback" not in err


def test_defaults_entry_naming_no_config_is_exit_2(capsys, tmp_path):
    (tmp_path / "mine.yaml").write_text("defaults:\n  - ppo_megatron_trainer\n  - _self_\n")
    code, _, err = run_main(capsys, f"--config-path={tmp_path}", "--config-name=mine", "--check")
    assert code == 2 and "Traceback" not in err
    assert "--config-name mine" in err and "ppo_megatron_trainer" in err
