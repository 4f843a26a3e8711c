"""End-to-end half of tests/unit/test_cli.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
import subprocess
import sys
import yaml
from conftest import REPO
from unit.test_cli import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    VERL_GRPO,
    run_main,
)


def test_cfg_job_as_a_process():
    """The real command line: exit 0, YAML on stdout, nothing of Ray started."""
    proc = subprocess.run([sys.executable, "-m", "rlx.trainer.main_ppo", *VERL_GRPO, "--cfg", "job"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["actor_rollout_ref"]["model"]["path"] == "Qwen/Qwen2-7B-Instruct"
    assert "ray" not in proc.stderr.lower()


# ---- --check: composition, validation and the preflight, then what would run; never Ray -----------------------------
def test_check_prints_what_would_run_and_starts_no_ray(capsys, monkeypatch):
    import ray

    inits = []  # whatever Ray state the session is in (a shared local Ray may be up), --check must not call init
    real_init = ray.init
    monkeypatch.setattr(ray, "init", lambda *a, **k: inits.append((a, k)) or real_init(*a, **k))
    code, out, err = run_main(capsys, "--config-name", "quickstart", "actor_rollout_ref.actor.use_kl_loss=True",
                              "--check")
    assert code == 0, err
    assert out.startswith("rlx: check passed")
    lines = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert "grpo, 4 response(s) per prompt" in lines["algorithm"] and "KL loss low_var_kl" in lines["algorithm"]
    assert "1 node(s) x 2 = 2 rank(s) per role, device cpu (gloo)" in lines["world"]
    assert lines["roles"].split(None, 1)[1] == "actor+rollout, ref, no critic (grpo trains none)"
    assert "fsdp2, sp 1, mini-batch 8 prompts, micro-batch 8 per GPU" in lines["actor"]
    assert "tp 1, log-prob micro-batch 16 per GPU" in lines["rollout"]
    assert "log-prob micro-batch 16 per GPU" in lines["ref"]
    assert "train 2048 prompts (128 step(s) per epoch), val 64; 20 training step(s)" in lines["data"]
    assert inits == []


def test_check_of_a_verl_command_as_a_process(tmp_path):
    """verl's GRPO example with the machine-bound values swapped: a separate process, exit 0, no Ray started."""
    swap = {"actor_rollout_ref.model.path": "builtin://tiny-qwen2", "trainer.n_gpus_per_node": "2",
            "actor_rollout_ref.rollout.tensor_model_parallel_size": "1", "data.train_batch_size": "8",
            "actor_rollout_ref.actor.ppo_mini_batch_size": "4", "data.max_prompt_length": "16",
            "data.max_response_length": "16", "trainer.logger": "[console]",
            "actor_rollout_ref.model.enable_activation_offload": "False",
            "data.train_files": "synthetic://digits/size:64/seed:0",
            "data.val_files": "synthetic://digits/size:8/seed:1"}
    argv = [f"{k}={swap.get(k, v)}" for k, _, v in (a.partition("=") for a in VERL_GRPO)]
    proc = subprocess.run([sys.executable, "-m", "rlx.trainer.main_ppo", *argv, "trainer.device=cpu",
                           f"trainer.default_local_dir={tmp_path}", "--check"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "roles        actor+rollout, ref, no critic (grpo trains none)" in proc.stdout
    assert "every 20 step(s)" in proc.stdout
    assert "Started a local Ray" not in proc.stderr
