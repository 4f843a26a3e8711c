"""A DAPO-style reward: the strict boxed check through verl's math_dapo, and one built from its helpers."""
from verl.utils.reward_score import math_dapo
from verl.utils.reward_score.math_dapo import last_boxed_only_string, normalize_final_answer, remove_boxed


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    result = math_dapo.compute_score(solution_str, ground_truth, strict_box_verify=True)
    if result["pred"] is None:
        result["pred"] = ""
    return result


def boxed_match(data_source, solution_str, ground_truth, extra_info=None):
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return {"score": -1.0, "pred": ""}
    pred = normalize_final_answer(remove_boxed(boxed))
    return {"score": 1.0 if pred == normalize_final_answer(ground_truth) else -1.0, "pred": pred}
