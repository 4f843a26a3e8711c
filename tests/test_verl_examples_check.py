"""scripts/verl_examples_check.py: verl-style launch scripts read without running them, the machine-bound values
swapped, each command through `--check`, and the counts."""
import json
import os
import sys

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))

from shell_commands import read_commands  # noqa: E402
import verl_examples_check as harness  # noqa: E402

SCRIPT = r"""#!/usr/bin/env bash
set -x
NNODES=${NNODES:-2}   # a default
max_prompt_length=$((1024 * 2))
project='p'   # quoted
if [ "$ENGINE" = "sglang" ]; then
    rollout=sglang
else
    rollout=vllm
fi
DATA=(
    # comments inside an array
    data.train_files="$HOME/data/train.parquet"
    data.max_prompt_length=${max_prompt_length}
)
EXTRA="
    trainer.total_epochs=3 \
    trainer.test_freq=5
    trainer.save_freq=-1"
python3 -m verl.trainer.main_ppo \
    "${DATA[@]}" \
    actor_rollout_ref.rollout.name=$rollout \
    trainer.logger='["console","wandb"]' \
    trainer.nnodes=$NNODES \
    trainer.project_name=${project}_$((NNODES * 8)) \
    $EXTRA $@ 2>&1 | tee log.txt
"""


def test_read_commands_expands_like_bash(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text(SCRIPT)
    [cmd] = read_commands(str(path))
    assert cmd.module == "verl.trainer.main_ppo" and cmd.line == 20
    assert cmd.args == ["data.train_files=/home/user/data/train.parquet", "data.max_prompt_length=2048",
                        "actor_rollout_ref.rollout.name=vllm", 'trainer.logger=["console","wandb"]', "trainer.nnodes=2",
                        "trainer.project_name=p_16", "trainer.total_epochs=3", "trainer.test_freq=5",
                        "trainer.save_freq=-1"]
    assert cmd.unresolved == []  # $ENGINE, unset, only chose the else branch


def test_the_scripts_own_folder_anchors_its_files(tmp_path):
    """`$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)` (and `$(dirname "$0")`) is the script's folder, not the
    assumed working directory: a tool config beside the script is found there."""
    path = tmp_path / "run.sh"
    path.write_text('HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\nUP=$(dirname "$0")\n'
                    'python3 -m verl.trainer.main_ppo a.tool_config_path="$HERE/tool.yaml" b.dir=$UP c.cwd=$(pwd)\n')
    [cmd] = read_commands(str(path))
    assert cmd.args == [f"a.tool_config_path={tmp_path}/tool.yaml", f"b.dir={tmp_path}", "c.cwd=/workspace/verl"]


def test_swap_keeps_what_divides_and_replaces_the_machine():
    values = {"trainer.nnodes": "4", "trainer.n_gpus_per_node": "8",
              "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "16"}
    assert harness.world_for_check(values) == 16  # 32 ranks: the largest divisor up to max(8, sp)
    assert harness.world_for_check({"trainer.n_gpus_per_node": "6"}) == 6
    assert harness.world_for_check({"trainer.n_gpus_per_node": "12"}) == 6


QUESTION = {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
            "answer": "3 + 4 = 7\n#### 7"}
GRPO = """python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \\
    data.train_files=$HOME/data/gsm8k/train.parquet data.val_files=$HOME/data/gsm8k/test.parquet \\
    data.train_batch_size=16 data.max_prompt_length=512 data.max_response_length=1024 \\
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct actor_rollout_ref.actor.ppo_mini_batch_size=8 \\
    actor_rollout_ref.actor.ppo_micro_batch_size=16 actor_rollout_ref.rollout.log_prob_micro_batch_size=32 \\
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.n=5 trainer.logger=console trainer.n_gpus_per_node=8 trainer.nnodes=2 {extra}
"""


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
