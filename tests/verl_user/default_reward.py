"""verl's default score with an extra key, called with verl's full argument list."""
from verl.utils.reward_score import default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None, sandbox_fusion_url=None,
                  concurrent_semaphore=None, memory_limit_mb=None, **kwargs):
    score = default_compute_score(data_source, solution_str, ground_truth, extra_info, sandbox_fusion_url,
                                  concurrent_semaphore, memory_limit_mb)
    if isinstance(score, dict):
        return {**score, "length": len(solution_str)}
    return {"score": float(score), "length": len(solution_str)}
