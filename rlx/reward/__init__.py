"""Rewards in one place. How is a response scored?

The door is `rlx.reward.score.score_batch(batch, manager, model_out)`: the trainer calls it for every generated
batch (training, ReMax's greedy baseline, validation) and gets token-level scores, each response's reward on its last
valid token, and the score function's extra values.

1. A reward model (`reward_model.enable`) scores first, in its Ray worker (rlx.workers.reward_model_worker):
   - a classifier (engine: rlx.engine.reward_model) reads each conversation, re-templated for its own tokenizer
     when that differs from the actor's (`rm_inputs`); its output at the last token is the score;
   - a generative judge (`reward_model.judge.enable`; its engine runs in rlx.workers.judge) reads a judging prompt
     per response and writes a verdict; the number in the verdict is the score (`judge`: prompts, parsing, counts).
   Its score is the reward, unless a judge ran and custom_reward_function.path is set: then that function scores,
   finding the judge's `judge_score` and `judge_verdict` in each row's extra_info.
2. Otherwise the reward manager (`manager`: reward_model.reward_manager naive | dapo | batch) decodes each response
   and calls the score function (`functions.load_reward_fn`): the custom function of custom_reward_function.path,
   or the built-in rule of the row's data_source (`rules`: GSM8K, MATH, DAPO/Minerva, the synthetic tasks). The
   calls run in a pool of processes (`pool`; reward_model.num_workers), each bounded by
   reward_model.score_timeout_s (past it: reward_model.timeout_score, counted in reward/timeouts), or in the
   driver's process (see `manager`'s doc for the rule).
3. A score must be a finite number (or a dict with one under "score"); anything else, or a function that raises,
   stops the run with a `manager.RewardError` naming the function, the sample and its data_source
   (reward_model.non_finite_score replaces NaN/inf instead).

The keys: rlx.config.schema's RewardModelConfig and CustomRewardFunctionConfig, rlx.config.reward (the reward
model's serving keys, verl 0.9.1's `reward.*` spellings) and rlx.config.judge (`reward_model.judge.*`, the built-in
judging templates). docs/rewards.md and docs/reward_model.md describe them for users.
"""
