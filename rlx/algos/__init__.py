"""The bottom layer: pure tensor functions (advantages, losses, KL, metrics), importing nothing else of rlx.

`core_algos` (masked statistics, GAE/GRPO/RLOO, loss aggregation, KL estimators, value loss), `advantages` (every
`algorithm.adv_estimator` by verl's name), `policy_losses` (every `policy_loss.loss_mode` by verl's name), `metrics`
(training metrics of a batch), `probs_diff` (rollout-vs-actor probability mismatch). Every other layer may import
these; these import only torch and numpy.
"""
