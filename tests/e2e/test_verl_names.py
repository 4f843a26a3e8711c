"""End-to-end half of tests/unit/test_verl_names.py: the tests that start processes (rlx's scoring pool, a fresh
interpreter with a real verl on its path, a GRPO job through the entry point)."""
import os
import subprocess
import sys

import pytest

from rlx.reward.pool import ScorePool

from conftest import REPO
from unit.test_verl_names import MATH_RESPONSES, MATH_TRUTHS, USER, fresh_verl_names, reward  # noqa: F401


def test_a_reward_file_scores_in_rlx_s_scoring_processes():
    """The scoring pool's fresh interpreters read the file again and are served there too."""
    fn = reward("dapo_reward.py")
    pool = ScorePool(fn, size=1, timeout_s=60)
    try:
        outcomes = pool.score([{"data_source": "math_dapo", "solution_str": r, "ground_truth": t}
                               for r, t in zip(MATH_RESPONSES, MATH_TRUTHS)])
    finally:
        pool.close()
    assert [o.value for o in outcomes] == [fn("math_dapo", r, t) for r, t in zip(MATH_RESPONSES, MATH_TRUTHS)]


def test_a_real_verl_is_never_shadowed(tmp_path):
    """With a verl importable, the user's file gets it (here a stand-in package whose gsm8k scores 42)."""
    pkg = tmp_path / "verl" / "utils" / "reward_score"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "verl", tmp_path / "verl" / "utils", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "gsm8k.py").write_text("def compute_score(solution_str, ground_truth, **kwargs):\n    return 42.0\n")
    code = ("import sys; from rlx import verl_names; from rlx.config.schema import CustomRewardFunctionConfig; "
            "from rlx.reward.functions import load_reward_fn; "
            f"fn = load_reward_fn(CustomRewardFunctionConfig(path={os.path.join(USER, 'gsm8k_reward.py')!r})); "
            "print(fn('openai/gsm8k', '#### 1', '1'), verl_names.served_line(), sys.modules['verl'].__file__)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["42.0", "None", str(tmp_path / "verl" / "__init__.py")]


def test_grpo_with_a_verl_dataset_class_reward_file_and_tool_through_the_entry_point(tmp_path):
    """A CPU GRPO job of 2 steps whose data.custom_cls (an RLHFDataset subclass mapping jsonl records with HF
    datasets), custom reward and tool (a verl BaseTool in the tool YAML) all import verl, which is not installed."""
    import json

    import agent_helpers

    records = [{"question": f"{a}+{b}?", "answer": f"#### {a + b}"} for a, b in ((1, 2), (3, 4), (5, 6), (7, 8))]
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    loops = tmp_path / "loops.yaml"
    loops.write_text("- name: forced_check\n  _target_: agent_helpers.ForcedToolAgent\n  turn_tokens: 5\n"
                     "  tool: check_answer\n  arg: answer\n")
    rollout = "actor_rollout_ref.rollout"
    overrides = [
        f"data.train_files={data}", f"data.val_files={data}", "data.max_prompt_length=160",
        "data.max_response_length=64", "data.train_batch_size=4", "data.return_raw_chat=true",
        f"data.custom_cls.path={USER}/gsm8k_dataset.py", "data.custom_cls.name=Gsm8kJsonDataset",
        f"custom_reward_function.path={USER}/gsm8k_reward.py",
        f'actor_rollout_ref.model.custom_chat_template="{agent_helpers.TEMPLATE}"',
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "algorithm.adv_estimator=grpo", f"{rollout}.name=hf", f"{rollout}.n=2", f"{rollout}.mode=async",
        f"{rollout}.multi_turn.enable=true", f"{rollout}.multi_turn.max_assistant_turns=3",
        f"{rollout}.multi_turn.tool_config_path={USER}/tool_config.yaml",
        f"{rollout}.agent.default_agent_loop=forced_check", f"{rollout}.agent.agent_loop_config_path={loops}",
        "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=false",
        "trainer.save_freq=-1", "trainer.logger=[console,file]", f"trainer.default_local_dir={tmp_path}/ckpt",
        f"trainer.rollout_data_dir={tmp_path}/rollouts"]
    env = dict(os.environ, HF_DATASETS_CACHE=str(tmp_path / "hf"),
               PYTHONPATH=os.pathsep.join([REPO, os.path.dirname(agent_helpers.__file__), USER]))
    proc = subprocess.run([sys.executable, "-m", "rlx.trainer.main_ppo", "--config-name", "quickstart", *overrides],
                          cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "verl is not installed here" in line]
    assert len(said) == 1, said
    for name in ("verl.utils.dataset.{RLHFDataset}", "verl.utils.reward_score.gsm8k.{compute_score",
                 "verl.tools.base_tool.{BaseTool"):
        assert name in said[0], said[0]
    lines = [json.loads(x) for x in next((tmp_path / "ckpt").rglob("metrics.jsonl")).read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["agent/tool_calls/mean"] == 2.0 and m["agent/tool_errors/mean"] == 0.0
        assert "critic/score/mean" in m and "actor/pg_loss" in m
    from rlx.reward.rules import gsm8k

    rows = [json.loads(x) for x in (tmp_path / "rollouts" / "2.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and {r["gts"] for r in rows} <= {"3", "7", "11", "15"}  # the dataset class's mapping
    for r in rows:  # each prompt is the mapped record's chat (system + the question), with the tool listed
        assert "tools: check_answer" in r["input"] and "[system]Solve the problem." in r["input"]
        assert [q["question"] for q in records if f"[user]{q['question']}" in r["input"]], r["input"]
    for r in rows:  # scored by the reward file: rlx's own GSM8K rule
        native = gsm8k.compute_score(r["output"], r["gts"], method="flexible", format_score=0.1)
        assert r["score"] == pytest.approx(native, abs=1e-6)  # stored as float32
