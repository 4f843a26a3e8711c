"""scripts/verl_examples_check.py: verl-style launch scripts read without running them, the machine-bound values
swapped, each command through `--check`, and the counts."""
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
