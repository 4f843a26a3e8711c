"""End-to-end half of tests/unit/test_agent_loop.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
import asyncio
import json
import os
import subprocess
import sys
import pytest
from rlx.workers.rollout.agent.tools import FunctionTool, call_tool, function_schema, load_tools
import agent_helpers
from conftest import REPO
from unit.test_agent_loop import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    schema,
)


def test_tool_that_raises_or_hangs_gives_an_error_text():
    boom = agent_helpers.BoomTool({}, schema("boom"))
    slow = agent_helpers.SlowTool({}, schema("slow"))
    sync_slow = FunctionTool(agent_helpers.slow_sync, function_schema(agent_helpers.slow_sync))

    async def run():
        return await asyncio.gather(call_tool(boom, {}, {}, 5.0), call_tool(slow, {}, {}, 0.3),
                                    call_tool(sync_slow, {"seconds": 2.0}, {}, 0.3),
                                    call_tool(sync_slow, {"seconds": 0.0}, {}, 5.0))

    import time
    t0 = time.perf_counter()
    r_boom, r_slow, r_sync, r_ok = asyncio.run(run())
    assert time.perf_counter() - t0 < 2.5  # the calls ran concurrently, the hung ones were cancelled / killed
    assert r_boom.error and "RuntimeError: boom" in r_boom.text
    assert r_slow.error and "timed out after 0.3 s" in r_slow.text and r_slow.wait_s < 1.0
    assert r_sync.error and "timed out" in r_sync.text
    assert not r_ok.error and r_ok.text == "woke"


# ---- through the entry point ---------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["colocated", "rollout_pool"])
def test_multi_turn_grpo_through_the_entry_point(tmp_path, layout):
    """Multi-turn GRPO with a tool, in the actor's workers (colocated) or on a rollout pool of its own (one-step-off:
    the agent loop runs in the rollout worker, its trajectories reach the trainer whole)."""
    loops = tmp_path / "loops.yaml"
    loops.write_text("- name: forced_tool_agent\n  _target_: agent_helpers.ForcedToolAgent\n  turn_tokens: 5\n")
    rollout = "actor_rollout_ref.rollout"
    overrides = [
        "data.max_prompt_length=64", "data.max_response_length=96", "data.train_batch_size=4",
        "data.return_raw_chat=true", f'actor_rollout_ref.model.custom_chat_template="{agent_helpers.TEMPLATE}"',
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        f"{rollout}.name=hf", f"{rollout}.n=2", f"{rollout}.mode=async", f"{rollout}.calculate_log_probs=true",
        f"{rollout}.multi_turn.enable=true", f"{rollout}.multi_turn.max_assistant_turns=3",
        f"{rollout}.multi_turn.function_tool_path={agent_helpers.__file__}",
        f"{rollout}.agent.default_agent_loop=forced_tool_agent", f"{rollout}.agent.agent_loop_config_path={loops}",
        "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=false",
        "trainer.save_freq=-1", "trainer.logger=[console,file]", f"trainer.default_local_dir={tmp_path}/ckpt"]
    if layout == "rollout_pool":
        overrides += ["actor_rollout_ref.hybrid_engine=False", "rollout.n_gpus_per_node=1",
                      "trainer.n_gpus_per_node=1"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.dirname(agent_helpers.__file__)]))
    proc = subprocess.run([sys.executable, "-m", "rlx.trainer.main_ppo", "--config-name", "quickstart", *overrides],
                          cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    logs = list((tmp_path / "ckpt").rglob("metrics.jsonl"))
    assert logs, proc.stdout[-2000:]
    lines = [json.loads(x) for x in logs[0].read_text().splitlines()]
    last = lines[-1]
    assert last["step"] == 2
    assert last["agent/num_turns/mean"] == 6.0 and last["agent/tool_calls/mean"] == 2.0
    assert last["agent/tool_tokens/mean"] > 0 and last["agent/tool_errors/mean"] == 0.0
    assert "actor/pg_loss" in last and "training/rollout_probs_diff_mean" in last
    if layout == "colocated":
        assert last["training/rollout_probs_diff_mean"] < 1e-3
    else:  # batch 2 was generated while batch 1 trained
        assert [m["async/staleness_max"] for m in lines] == [0.0, 1.0], lines


def test_prepare_gsm8k_multi_turn_rows_and_the_recipes_tool_config(tmp_path):
    import pyarrow.parquet as pq

    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "2+3?", "answer": "so 5\n#### 5"}) + "\n")
    subprocess.run([sys.executable, "scripts/prepare_gsm8k.py", "--multi-turn", "--input_dir", str(tmp_path),
                    "--output_dir", str(tmp_path / "out")], cwd=REPO, check=True, capture_output=True)
    row = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()[0]
    assert row["agent_name"] == "tool_agent"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["extra_info"]["tools_kwargs"] == {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "5"}}}
    tools = load_tools(os.path.join(REPO, "examples/multiturn/config/tool_config/gsm8k_tool_config.yaml"), None)
    tool = tools["calc_gsm8k_reward"]

    async def run():
        return await call_tool(tool, {"answer": "5"}, row["extra_info"]["tools_kwargs"], 5.0)

    assert asyncio.run(run()).text == "Current parsed answer='5' reward=1.0"
