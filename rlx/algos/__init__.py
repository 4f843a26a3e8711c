"""The bottom layer: pure tensor functions (advantages, losses, KL, metrics), importing nothing else of rlx.

`core_algos` (PPO/GRPO/RLOO math), `metrics` (training metrics of a batch), `probs_diff` (rollout-vs-actor
probability mismatch). Every other layer may import these; these import only torch and numpy.
"""
