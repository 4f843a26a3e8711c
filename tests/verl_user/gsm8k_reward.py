"""A GSM8K reward as verl users write one: verl's rule with the flexible answer match and a format score."""
from verl.utils.reward_score import gsm8k


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return gsm8k.compute_score(solution_str, ground_truth, method="flexible", format_score=0.1)
