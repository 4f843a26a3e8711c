"""A reward computed by a coroutine, driven on verl's `get_event_loop` (as async judge rewards are)."""
import asyncio

from verl.utils.ray_utils import get_event_loop
from verl.utils.reward_score import gsm8k


async def _score(solution_str, ground_truth):
    await asyncio.sleep(0)
    return gsm8k.compute_score(solution_str, ground_truth)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return get_event_loop().run_until_complete(_score(solution_str, ground_truth))
