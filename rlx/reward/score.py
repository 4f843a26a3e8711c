"""The door of rlx.reward: `score_batch`, how each generated response gets its reward (see the package doc)."""
from __future__ import annotations

import torch

from rlx.protocol import Batch
from rlx.reward.judge import with_judge_results
from rlx.reward.manager import RewardManager


def score_batch(batch: Batch, manager: RewardManager, model_out: Batch | None = None,
                custom_function: bool = False) -> tuple[torch.Tensor, dict[str, list]]:
    """Token-level scores `[rows, R]` of a generated batch (each response's reward on its last valid token) and the
    score function's extra values (one list per key, a row each).

    `model_out`: the reward model's output on `batch` (`rm_scores`; a judge's `judge_score` and `judge_verdict`
    too), None without one. Its scores are the reward (verl's precedence), with a judge's verdicts as the extra
    `judge_verdict`, unless a judge ran and `custom_function` (custom_reward_function.path is set): then the
    manager's score function scores, finding the judge's `judge_score` and `judge_verdict` in each row's extra_info.
    Without a reward model the manager scores. A score that is not a finite number raises the manager's
    RewardError."""
    if model_out is not None:
        if not (custom_function and "judge_score" in model_out):
            # a judge's verdicts travel as a reward extra (in trainer.rollout_data_dir's files, as verl's GenRM
            # examples return theirs)
            extra = {"judge_verdict": list(model_out["judge_verdict"])} if "judge_verdict" in model_out else {}
            return model_out["rm_scores"], extra
        batch = with_judge_results(batch, model_out)
    return manager(batch)
