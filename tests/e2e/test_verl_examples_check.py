"""End-to-end half of tests/unit/test_verl_examples_check.py: its tests that start Ray or other processes, or need a
GPU. That file's docstring says what is tested; its helpers and fixtures are imported from it."""
import json
import os
import sys
from conftest import REPO
sys.path.insert(0, os.path.join(REPO, "scripts"))
import verl_examples_check as harness  # noqa: E402
from unit.test_verl_examples_check import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    GRPO,
    QUESTION,
)


def test_harness_counts_and_groups(tmp_path, capsys):
    examples = tmp_path / "examples"
    (examples / "grpo").mkdir(parents=True)
    (examples / "grpo" / "run_ok.sh").write_text(GRPO.format(extra="trainer.use_legacy_worker_impl=disable"))
    (examples / "grpo" / "run_bad.sh").write_text(GRPO.format(extra="trainer.use_legacy_worker_impl=bogus"))
    (examples / "grpo" / "run_unknown.sh").write_text(GRPO.format(extra="trainer.no_such_key=1"))
    (examples / "grpo" / "run_megatron.sh").write_text(GRPO.format(extra="--config-name=ppo_megatron_trainer"))
    (examples / "grpo" / "run_recipe.sh").write_text("python3 -m recipe.dapo.main_dapo a=b\n")
    gsm8k = tmp_path / "gsm8k"
    gsm8k.mkdir()
    for split in ("train", "test"):
        (gsm8k / f"{split}.jsonl").write_text("\n".join(json.dumps(QUESTION) for _ in range(32)) + "\n")
    out_json = tmp_path / "results.json"
    assert harness.main([str(examples), "--gsm8k", str(gsm8k), "--work", str(tmp_path / "work"),
                         "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "4 `verl.trainer.main_ppo` commands" in out
    assert "other trainers, not checked: megatron 1" in out
    assert "other entry points, not checked: recipe.dapo.main_dapo 1" in out
    # an unknown key no longer stops composition: the rest of the command is composed and checked (--check lists
    # every problem in one round), so the unknown-key script counts as composed
    assert "FSDP commands checked: 3\n  composed: 3\n  passed --check: 1" in out
    assert "validate: trainer.use_legacy_worker_impl" in out and "unknown key trainer.no_such_key" in out
    results = {os.path.basename(r["script"]): r for r in json.loads(out_json.read_text())}
    ok = results["run_ok.sh"]
    assert ok["stage"] == "passed", ok["output"]
    assert "actor_rollout_ref.model.path=builtin://tiny-qwen2" in ok["argv"]
    assert "trainer.n_gpus_per_node=8" in ok["argv"] and "trainer.nnodes=1" in ok["argv"]
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=1" in ok["argv"]
    assert "actor_rollout_ref.model.override_config.max_position_embeddings=1536" in ok["argv"]
    # verl's derivation of the deprecated keys on the swapped world (8 ranks, sp 1): 16 // 8, 32 // 8
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 (16 // 8" in ok["output"]
    assert "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 (32 // 8" in ok["output"]


def test_recipe_files_import_recipe_and_refused_engines_are_checked_as_they_are(tmp_path, capsys):
    """A recipe's reward file imports its neighbours as `recipe.<name>.<module>` (verl-recipe is verl's recipe/) and
    verl's names; the interaction YAML named by the script's machine path is the checkout's. With --engines an
    SGLang command is checked as it is: refused for its engine alone, in one line, the preflight run to the end."""
    recipe, examples, gsm8k = tmp_path / "verl-recipe", tmp_path / "examples", tmp_path / "gsm8k"
    (recipe / "myrec").mkdir(parents=True)
    examples.mkdir()
    (recipe / "myrec" / "helpers.py").write_text("def source():\n    return 'openai/gsm8k'\n")
    (recipe / "myrec" / "reward.py").write_text(
        "from recipe.myrec.helpers import source\n"
        "from verl.utils.reward_score.gsm8k import compute_score as gsm8k\n\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return gsm8k(solution_str, ground_truth) if data_source == source() else 0.0\n")
    (recipe / "myrec" / "interaction.yaml").write_text(
        "interaction:\n  - name: gsm8k\n    class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n"
        "    config: {}\n")
    extra = ("custom_reward_function.path=/workspace/verl/recipe/myrec/reward.py actor_rollout_ref.rollout.multi_turn"
             ".interaction_config_path=$HOME/verl/recipe/myrec/interaction.yaml actor_rollout_ref.rollout.multi_turn"
             ".enable=True")
    (recipe / "myrec" / "run_vllm.sh").write_text(GRPO.format(extra=extra))
    (recipe / "myrec" / "run_sglang.sh").write_text(
        GRPO.format(extra=extra).replace("rollout.name=vllm", "rollout.name=sglang"))
    gsm8k.mkdir()
    for split in ("train", "test"):
        (gsm8k / f"{split}.jsonl").write_text("\n".join(json.dumps(QUESTION) for _ in range(32)) + "\n")
    out_json = tmp_path / "results.json"
    args = [str(examples), "--recipe", str(recipe), "--gsm8k", str(gsm8k), "--work", str(tmp_path / "work")]
    assert harness.main(args + ["--engines", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    results = {os.path.basename(r["script"]): r for r in json.loads(out_json.read_text())}
    assert results["run_vllm.sh"]["stage"] == "passed", results["run_vllm.sh"]["output"]
    sglang = results["run_sglang.sh"]
    assert sglang["kind"] == "sglang" and sglang["stage"] == "validate", sglang["output"]
    problems = harness.all_refusals(harness.Result(**sglang))
    assert problems and all("rollout.name=sglang" in p for p in problems) and harness.engine_only(
        harness.Result(**sglang))
    assert "FSDP commands checked: 1\n  composed: 1\n  passed --check: 1" in out
    assert "checked as they are (--engines): 1\n  refused for the engine alone" in out and "=vllm): 1" in out
    assert harness.main(args) == 0  # without --engines: counted apart, not checked
    assert "other trainers, not checked: sglang 1" in capsys.readouterr().out
