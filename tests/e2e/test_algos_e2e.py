"""Every advantage estimator and every policy loss mode verl accepts, through the entry point: two training steps
each (GRPO's quickstart job, CPU), the runs sharing one process (tests/algo_matrix_job.py: in-process worker groups,
real FSDP engines and rollout), so the whole matrix costs about as much as two Ray runs.

Each run pairs one estimator with one loss mode (and spreads the aggregations and KL forms over them); each test
below checks the run that carries its value: it trained (finite loss, a gradient), and reports the metrics verl's
mode reports.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from conftest import REPO, example

KL = ["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_type=low_var_kl+"]
RUNS = {
    "reinforce_plus_plus": ["algorithm.adv_estimator=reinforce_plus_plus",
                            "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
                            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
                            "actor_rollout_ref.actor.clip_ratio_low=0.0003",
                            "actor_rollout_ref.actor.clip_ratio_high=0.0004"],
    "reinforce_plus_plus_baseline": ["algorithm.adv_estimator=reinforce_plus_plus_baseline",
                                     "actor_rollout_ref.actor.policy_loss.loss_mode=sapo", *KL],
    "remax": ["algorithm.adv_estimator=remax", "actor_rollout_ref.actor.policy_loss.loss_mode=gpg",
              "actor_rollout_ref.actor.loss_agg_mode=token-sum"],
    "opo": ["algorithm.adv_estimator=opo", "actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov",
            "actor_rollout_ref.actor.policy_loss.clip_cov_lb=-100",
            "actor_rollout_ref.actor.policy_loss.clip_cov_ub=100",
            "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.1"],
    "gpg": ["algorithm.adv_estimator=gpg", "actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov"],
    "grpo_passk": ["algorithm.adv_estimator=grpo_passk", "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean"],
    "grpo_vectorized": ["algorithm.adv_estimator=grpo_vectorized", "algorithm.norm_adv_by_std_in_grpo=False",
                        "actor_rollout_ref.actor.policy_loss.loss_mode=dro",
                        "actor_rollout_ref.actor.policy_loss.dro_beta=0.1",
                        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"],
    "rloo_vectorized": ["algorithm.adv_estimator=rloo_vectorized",
                        "actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
                        "algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=k1+"],
    "optimal_token_baseline": ["algorithm.adv_estimator=optimal_token_baseline",
                               "actor_rollout_ref.actor.calculate_sum_pi_squared=True",
                               "actor_rollout_ref.actor.policy_loss.loss_mode=dppo_tv"],
    "tir_optimal_token_baseline": ["algorithm.adv_estimator=tir_optimal_token_baseline",
                                   "actor_rollout_ref.actor.calculate_sum_pi_squared=True",
                                   "actor_rollout_ref.actor.policy_loss.loss_mode=dppo_kl"],
    "gdpo": ["algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[accuracy_reward,format_reward]",
             "algorithm.gdpo_reward_weights=[1.0,0.5]", "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"],
}
# the digits reward plus a format part (tests/algo_matrix_job.py): responses to one prompt differ from the start,
# so that every estimator has a non-zero advantage to train on
RUNS = {name: ["custom_reward_function.path={reward_file}", *overrides] for name, overrides in RUNS.items()}
ESTIMATORS = list(RUNS)


def recipe_overrides(script: str) -> list[str]:
    """The key=value arguments of a recipe in examples/ (the lines between `main_ppo` and `"$@"`)."""
    lines = open(example(script)).read().split("rlx.trainer.main_ppo", 1)[1]
    lines = lines.split('"$@"', 1)[0].split("\n")
    args = [a for line in lines for a in line.replace("\\", " ").split()]
    return [a for a in args if "=" in a]


# the recipes, their algorithm as written, on a smaller batch (one worker here) and the denser reward
RECIPES = {name: recipe_overrides(f"run_{name}_tiny_cpu.sh") + [
    "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2", "trainer.test_freq=0", "trainer.logger=[file]",
    "data.train_batch_size=4", "data.max_response_length=8", "data.val_files=synthetic://digits/size:4/seed:1",
    "custom_reward_function.path={reward_file}", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"] for name in ("drgrpo", "gspo", "reinforce_pp")}
RUNS.update({f"recipe_{name}": overrides for name, overrides in RECIPES.items()})
LOSS_MODE_RUN = {next(o.split("=")[1] for o in RUNS[k] if "loss_mode=" in o): k for k in ESTIMATORS}

# the metrics each loss mode reports (verl's names); gpg reports none
PG_METRICS = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")
REPORTS = {"vanilla": PG_METRICS, "gspo": PG_METRICS, "sapo": PG_METRICS, "gpg": (),
           "clip_cov": ("actor/pg_clipfrac", "actor/ppo_kl"), "kl_cov": ("actor/ppo_kl",), "geo_mean": PG_METRICS,
           "dro": ("actor/ppo_kl",), "cispo": PG_METRICS, "dppo_tv": PG_METRICS, "dppo_kl": PG_METRICS}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[int, list[dict]]]:
    """{run: (exit code, its per-step metrics)}, from one process running them all (about 2-3 minutes)."""
    out = tmp_path_factory.mktemp("algos")
    (out / "runs.json").write_text(json.dumps(RUNS))
    proc = subprocess.run([sys.executable, "tests/algo_matrix_job.py", str(out), str(out / "runs.json")], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    results = {}
    for name in RUNS:
        rc_file, metrics = out / name / "rc", out / name / "logs" / "metrics.jsonl"
        rc = int(rc_file.read_text()) if rc_file.exists() else None
        steps = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
        results[name] = (rc, [s for s in steps if "timing_s/step" in s])
    results["_log"] = proc.stdout[-6000:] + proc.stderr[-6000:]
    return results


def trained(runs, name) -> list[dict]:
    rc, steps = runs[name]
    assert rc == 0 and len(steps) == 2, f"run {name} failed (rc={rc}, {len(steps)} steps):\n{runs['_log']}"
    for m in steps:
        assert math.isfinite(m["actor/pg_loss"]) and m["actor/grad_norm"] > 0, (name, m)
    return steps


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_each_estimator_trains(runs, estimator):
    steps = trained(runs, estimator)
    assert all(math.isfinite(m["critic/advantages/mean"]) for m in steps)
    if estimator == "remax":  # the greedy baseline's phase ran and its reward was logged
        assert all("timing_s/gen_baseline" in m and "critic/reward_baseline/mean" in m for m in steps)
    if estimator in ("reinforce_plus_plus_baseline", "gdpo"):  # whitened over the batch: mean ~0
        assert all(abs(m["critic/advantages/mean"]) < 1e-5 for m in steps)


@pytest.mark.parametrize("mode", sorted(REPORTS))
def test_each_loss_mode_trains_and_reports_verls_metrics(runs, mode):
    steps = trained(runs, LOSS_MODE_RUN[mode])
    for m in steps:
        reported = {k for k in PG_METRICS if k in m}
        assert reported == set(REPORTS[mode]), (mode, reported)
    if mode == "clip_cov":  # a band wide enough that every micro-batch drops a token's gradient
        assert all(m["actor/pg_clipfrac"] > 0 for m in steps)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipes_run(runs, name):
    """examples/*/run_{drgrpo,gspo,reinforce_pp}_tiny_cpu.sh: their algorithm keys train through the entry point."""
    keys = dict(o.split("=", 1) for o in RECIPES[name])
    key, value = {"drgrpo": ("actor_rollout_ref.actor.loss_agg_mode", "seq-mean-token-sum-norm"),
                  "gspo": ("actor_rollout_ref.actor.policy_loss.loss_mode", "gspo"),
                  "reinforce_pp": ("algorithm.adv_estimator", "reinforce_plus_plus")}[name]
    assert keys[key] == value
    trained(runs, f"recipe_{name}")


def test_kl_forms_and_aggregations_ran(runs):
    steps = trained(runs, "reinforce_plus_plus_baseline")  # k3+ KL loss
    assert all(m["actor/kl_loss"] >= 0 and "actor/kl_coef" in m for m in steps)
    steps = trained(runs, "rloo_vectorized")  # k1+ in the reward
    assert all("actor/reward_kl_penalty" in m for m in steps)
    for name in ("remax", "grpo_vectorized"):  # token-sum, seq-mean-token-sum-norm
        trained(runs, name)
