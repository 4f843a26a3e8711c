"""End-to-end half of tests/unit/test_verl_names.py: the tests that start processes (rlx's scoring pool, a fresh
interpreter with a real verl on its path, a GRPO job through the entry point)."""
import os
import subprocess
import sys

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
