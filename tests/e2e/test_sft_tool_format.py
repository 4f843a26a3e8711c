"""End-to-end half of tests/unit/test_sft_tool_format.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
import json
import os
import subprocess
import sys
import pytest
from conftest import REPO
from unit.test_sft_tool_format import warmed  # noqa: F401 -- fixtures
sys.path.insert(0, os.path.join(REPO, "scripts"))


@pytest.mark.slow
def test_the_tool_recipe_on_cpu_calls_the_tool(warmed, tmp_path):
    """examples/multiturn/run_grpo_gsm8k_tool.sh as it is, with CPU overrides: HF async engine, tool agent, 2 GRPO
    steps."""
    root, _ = warmed
    r, a = "actor_rollout_ref.rollout", "actor_rollout_ref.actor"
    overrides = [
        "trainer.device=cpu", f"{r}.name=hf", f"{r}.n=2", "data.train_batch_size=2", f"{a}.ppo_mini_batch_size=2",
        f"{a}.ppo_micro_batch_size_per_gpu=2", "data.max_prompt_length=768", "data.max_response_length=256",
        f"{r}.multi_turn.tool_config_path={root / 'tools.yaml'}",
        "actor_rollout_ref.model.enable_activation_offload=False",  # the tiny model has 2 layers (offload needs 3)
        "trainer.total_training_steps=2", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "trainer.logger=[console,file]", f"trainer.default_local_dir={tmp_path}/ckpt"]
    env = dict(os.environ, PYTHON=sys.executable, MODEL_PATH=str(root / "warm"), DATA_DIR=str(root / "data"))
    proc = subprocess.run(["bash", os.path.join(REPO, "examples/multiturn/run_grpo_gsm8k_tool.sh"), *overrides],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    logs = list((tmp_path / "ckpt").rglob("metrics.jsonl"))
    assert logs, proc.stdout[-2000:]
    steps = [json.loads(x) for x in logs[0].read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert sum(s["agent/tool_calls/mean"] for s in steps) > 0  # the warmed model calls the tool by itself
    for s in steps:
        assert (s["agent/tool_tokens/mean"] > 0) == (s["agent/tool_calls/mean"] > 0)
        assert s["agent/num_turns/max"] >= 3 if s["agent/tool_calls/mean"] > 0 else True
