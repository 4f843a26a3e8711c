"""A MATH reward from verl's math_reward helpers; an unreadable box is caught as verl raises it (an assert)."""
from verl.utils.reward_score.math_reward import compute_score as math_score
from verl.utils.reward_score.math_reward import last_boxed_only_string, remove_boxed


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return math_score(solution_str, ground_truth)


def boxed_text(data_source, solution_str, ground_truth, extra_info=None):
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return 0.0
    try:
        answer = remove_boxed(boxed)
    except AssertionError:
        return -1.0
    return 1.0 if answer.strip() == str(ground_truth).strip() else 0.0
