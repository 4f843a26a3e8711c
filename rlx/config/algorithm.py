"""`algorithm`: the advantage estimator, the KL penalty, DAPO's dynamic sampling, PF-PPO and rollout correction,
and their rules.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from rlx.config.rules import check_choice, choice


FILTER_METRICS_SEQ = ("reward", "seq_reward", "seq_final_reward")
PF_PPO_METHODS = ("pow", "max_min", "max_random")


@dataclass
class KLCtrlConfig:
    type: str = choice("fixed", "rlx.algos.core_algos:KL_CTRL_TYPES")
    """fixed | adaptive."""
    kl_coef: float = 0.001
    """(Initial) KL coefficient of the in-reward penalty."""
    horizon: int = 10000
    """Adaptive controller horizon."""
    target_kl: float = 0.1
    """Adaptive controller target."""


@dataclass
class FilterGroupsConfig:
    enable: bool = False
    """DAPO's dynamic sampling: drop the groups (a prompt's rollout.n responses) whose `metric` is the same for
    every response, and generate more rounds of data.gen_batch_size prompts until data.train_batch_size groups
    are kept; the batch is then cut to train_batch_size groups."""
    metric: str = "reward"
    """What must vary within a group: reward or seq_reward (the sum of the response's scores, before any KL
    penalty), seq_final_reward (the same: the in-reward KL penalty is refused with dynamic sampling), or a key the
    score function returns in its dict (acc, score, pred, ...; score is the dict's score before any overlong
    penalty, as in verl; acc and score are the score itself for a function returning a number)."""
    max_num_gen_batches: int = 0
    """Generation rounds allowed per training step; the step fails with an error when they are used up before
    enough groups are kept. 0 or less: no limit."""
    max_inflight_gen_batches: int = 1
    """verl key: prompt batches generated concurrently by verl's V1 sampler (speed only; rlx generates one round
    at a time)."""


@dataclass
class RolloutCorrectionConfig:
    rollout_is: Optional[str] = None
    """Importance weights pi_old / pi_rollout against the rollout engine's own log-probs (needs
    actor_rollout_ref.rollout.calculate_log_probs=True), multiplying each token's policy loss: token (w_t =
    exp(log pi_old - log pi_rollout) per token) | sequence (their product, on every token of the response) | null
    (none). With calculate_log_probs=True the rollout_corr/* diagnostics are logged whatever this is."""
    rollout_is_threshold: Any = 2.0
    """A number: weights truncated at it (TIS); a "lower_upper" string (e.g. "0.5_5.0"): weights outside
    [lower, upper] set to 0 (IcePop)."""
    rollout_rs: Optional[str] = None
    """Rejection sampling: tokens whose statistic is out of bounds leave the response mask; comma-separated options,
    all must accept: token_k1 | token_k2 | token_k3 (per token), seq_sum_k1/k2/k3, seq_mean_k1/k2/k3, seq_max_k2/k3
    (per response, the whole response leaves). k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r with
    r = pi_old / pi_rollout. null: none."""
    rollout_rs_threshold: Any = None
    """Bounds of rollout_rs, one for all options or one per option (comma-separated): k1 takes "lower_upper" ratio
    bounds or an upper one (the lower is its reciprocal); k2 / k3 take one positive upper bound."""
    bypass_mode: bool = False
    """verl's bypass mode: the rollout engine's log-probs serve as the old log-probs (no old log-prob pass; needs
    actor_rollout_ref.rollout.calculate_log_probs=True), and the importance weights and rejection mask above are
    computed in the actor's loss, per micro-batch, against the current policy (loss_type says how they are used)."""
    loss_type: str = "ppo_clip"
    """The policy loss of bypass_mode: ppo_clip (PPO's clipped loss with ratio pi / pi_rollout, on the rejection
    mask; the weights only as metrics) | reinforce (-A * log pi * w, w the importance weights). Inert without
    bypass_mode, as in verl."""
    rollout_is_batch_normalize: bool = False
    """Divide the importance weights by their mean over the batch's valid tokens (token level) or responses
    (sequence level)."""


@dataclass
class PFPPOConfig:
    reweight_method: str = choice("pow", PF_PPO_METHODS)
    """How each response's weight comes from its score s (the sum of its token scores): pow (|s|^weight_pow) |
    max_min (1 for the batch's highest and lowest s, else 0) | max_random (0.4 for the highest s, else 0.1)."""
    weight_pow: float = 2.0
    """Exponent of the pow method."""


@dataclass
class AlgorithmConfig:
    gamma: float = 1.0
    """Discount."""
    lam: float = 1.0
    """GAE lambda."""
    adv_estimator: str = choice("gae", "rlx.algos.advantages:ADV_ESTIMATORS")
    """Advantage estimator (verl's names; docs/algorithms.md): gae | grpo | rloo | reinforce_plus_plus |
    reinforce_plus_plus_baseline | remax (greedy baseline) | opo | gpg | grpo_passk | grpo_vectorized |
    rloo_vectorized | optimal_token_baseline | tir_optimal_token_baseline (need actor.calculate_sum_pi_squared) |
    gdpo (needs gdpo_reward_keys)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide group-relative advantages by the group std (grpo, grpo_vectorized, grpo_passk, gdpo); False: Dr. GRPO."""
    use_kl_in_reward: bool = False
    """Subtract a KL penalty from the token rewards."""
    kl_penalty: str = choice("kl", "rlx.algos.core_algos:KL_PENALTY_TYPES")
    """KL estimator of the in-reward penalty: kl(k1) | abs | mse(k2) | low_var_kl(k3), and their + forms (same
    values here: the penalty carries no gradient)."""
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    """KL controller of the in-reward penalty."""
    use_pf_ppo: bool = False
    """Policy Filtration PPO (Zhang et al. 2024, "Policy Filtration in RLHF to Fine-Tune LLM for Code
    Generation"): after GAE, the batch is resampled with replacement (same size), each response drawn with
    probability proportional to its pf_ppo weight. As in verl, only adv_estimator=gae resamples."""
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
    """Weights of use_pf_ppo's resampling."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Correction of the mismatch between the rollout engine's policy and the trainer's (importance weights,
    rejection sampling), as verl's decoupled mode."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO's dynamic sampling (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
    Scale")."""
    gdpo_reward_keys: Optional[list] = None
    """gdpo: the keys of the reward function's dict whose values are the reward components, each normalised within
    its group on its own (e.g. [format_reward, accuracy_reward]); required with adv_estimator=gdpo."""
    gdpo_reward_weights: Optional[list] = None
    """gdpo: one weight per gdpo_reward_keys entry (null: 1 each)."""


def check_algorithm(cfg, errors):
    alg, actor, rollout = cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    if rollout.n < 1:
        errors.append(f"actor_rollout_ref.rollout.n={rollout.n} must be >= 1 (responses per prompt). Fix: "
                      f"actor_rollout_ref.rollout.n=1 (PPO), or >= 2 for the group estimators (grpo, rloo, ...).")
    elif alg.adv_estimator == "grpo_passk" and rollout.n < 2:  # verl raises for a group of one at the first step
        errors.append(f"algorithm.adv_estimator=grpo_passk takes the best two responses of each group and needs "
                      f"actor_rollout_ref.rollout.n >= 2, got {rollout.n}. Fix: actor_rollout_ref.rollout.n=4 "
                      f"(or algorithm.adv_estimator=grpo).")
    if actor.clip_ratio_c <= 1.0:
        errors.append(f"actor_rollout_ref.actor.clip_ratio_c={actor.clip_ratio_c} must be > 1 (dual clip). Fix: "
                      f"actor_rollout_ref.actor.clip_ratio_c=3.0 (verl's default).")


def check_estimator_inputs(cfg, errors):
    """What an estimator reads beyond the rewards: sum_pi_squared (optimal token baseline), reward components
    (gdpo)."""
    alg, actor = cfg.algorithm, cfg.actor_rollout_ref.actor
    if alg.adv_estimator in ("optimal_token_baseline", "tir_optimal_token_baseline") \
            and not actor.calculate_sum_pi_squared:
        errors.append(f"algorithm.adv_estimator={alg.adv_estimator} reads sum_pi_squared from the actor. Fix: "
                      f"actor_rollout_ref.actor.calculate_sum_pi_squared=True.")
    if alg.adv_estimator == "gdpo" and not alg.gdpo_reward_keys:
        errors.append("algorithm.adv_estimator=gdpo normalises each reward component on its own and needs their "
                      "names. Fix: algorithm.gdpo_reward_keys=[format_reward,accuracy_reward] (keys of the dict "
                      "your reward function returns).")
    weights = alg.gdpo_reward_weights
    if weights is not None and len(weights) != len(alg.gdpo_reward_keys or []):
        errors.append(f"algorithm.gdpo_reward_weights={list(weights)} needs one weight per "
                      f"algorithm.gdpo_reward_keys entry ({list(alg.gdpo_reward_keys or [])}). Fix: one weight per "
                      f"key, or algorithm.gdpo_reward_weights=null (1 each).")


def check_sampling(cfg, errors):
    """DAPO's dynamic sampling (algorithm.filter_groups, data.gen_batch_size) and PF-PPO's resampling."""
    fg, data = cfg.algorithm.filter_groups, cfg.data
    gen = data.gen_batch_size
    if gen is not None and (not isinstance(gen, int) or isinstance(gen, bool) or gen <= 0):
        errors.append(f"data.gen_batch_size={gen!r} must be a positive number of prompts, or null. Fix: "
                      f"data.gen_batch_size=null.")
    elif gen is not None and gen != data.train_batch_size and not fg.enable:
        errors.append(f"data.gen_batch_size={gen} differs from data.train_batch_size={data.train_batch_size} "
                      f"without algorithm.filter_groups.enable (verl would then train each step on gen_batch_size "
                      f"prompts). Fix: data.train_batch_size={gen}, or algorithm.filter_groups.enable=True.")
    if fg.enable:
        if not isinstance(fg.metric, str) or not fg.metric:
            errors.append(f"algorithm.filter_groups.metric={fg.metric!r} must name what varies within a group: "
                          f"one of {list(FILTER_METRICS_SEQ)} or a key of the score function's dict (acc, ...). "
                          f"Fix: algorithm.filter_groups.metric=acc.")
        elif fg.metric == "seq_final_reward" and cfg.algorithm.use_kl_in_reward:
            errors.append("algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=True: the "
                          "KL penalty is computed after the groups are chosen. Fix: metric=seq_reward (the score "
                          "before the penalty), or algorithm.use_kl_in_reward=False.")
        if not isinstance(fg.max_num_gen_batches, int) or isinstance(fg.max_num_gen_batches, bool):
            errors.append(f"algorithm.filter_groups.max_num_gen_batches={fg.max_num_gen_batches!r} must be an "
                          f"integer (0 or less: no limit). Fix: algorithm.filter_groups.max_num_gen_batches=10.")
    if not isinstance(fg.max_inflight_gen_batches, int) or fg.max_inflight_gen_batches <= 0:
        errors.append(f"algorithm.filter_groups.max_inflight_gen_batches={fg.max_inflight_gen_batches!r} must be a "
                      f"positive integer. Fix: algorithm.filter_groups.max_inflight_gen_batches=1.")
    check_rollout_correction(cfg, errors)
    pf = cfg.algorithm.pf_ppo
    if not isinstance(pf.weight_pow, (int, float)) or isinstance(pf.weight_pow, bool):
        errors.append(f"algorithm.pf_ppo.weight_pow={pf.weight_pow!r} must be a number. Fix: "
                      f"algorithm.pf_ppo.weight_pow=2.0.")


def check_rollout_correction(cfg, errors):
    from rlx.algos.rollout_correction import IS_LEVELS, parse_is_threshold, parse_rs

    rc, key = cfg.algorithm.rollout_correction, "algorithm.rollout_correction"
    if rc.rollout_is is not None:
        if rc.rollout_is not in IS_LEVELS:
            errors.append(f"{key}.rollout_is={rc.rollout_is!r} is not valid; choose one of {list(IS_LEVELS)} or null. "
                          f"Fix: {key}.rollout_is=token, or null.")
        if rc.rollout_is_threshold is None:
            errors.append(f"{key}.rollout_is_threshold=null with {key}.rollout_is={rc.rollout_is!r}: no weights would "
                          f"be computed (verl skips them). Fix: a number (TIS) or 'lower_upper' (IcePop).")
        else:
            try:
                parse_is_threshold(rc.rollout_is_threshold)
            except ValueError as e:
                errors.append(f"{e}. Fix: {key}.rollout_is_threshold=2.0 (TIS), or a 'lower_upper' pair such as "
                              f"'0.5_2.0' (IcePop).")
    if rc.rollout_rs is not None:
        try:
            parse_rs(rc.rollout_rs, rc.rollout_rs_threshold)
        except ValueError as e:
            errors.append(f"{e}. Fix: see docs/algorithms.md (rollout correction) for each option's threshold.")
    if rc.bypass_mode:
        from rlx.algos.rollout_correction import BYPASS_LOSS_TYPES

        check_choice(errors, f"{key}.loss_type", rc.loss_type, BYPASS_LOSS_TYPES)
        if not cfg.actor_rollout_ref.rollout.calculate_log_probs:
            errors.append(f"{key}.bypass_mode=True uses the rollout engine's log-probs as the old ones, and "
                          f"actor_rollout_ref.rollout.calculate_log_probs=False. Fix: "
                          f"actor_rollout_ref.rollout.calculate_log_probs=True.")
        mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
        if mode != "vanilla":
            errors.append(f"{key}.bypass_mode=True computes its own loss ({key}.loss_type={rc.loss_type}), and "
                          f"actor_rollout_ref.actor.policy_loss.loss_mode={mode} would not be used (verl replaces it "
                          f"silently). Fix: loss_mode=vanilla, or {key}.bypass_mode=False.")
    elif (rc.rollout_is is not None or rc.rollout_rs is not None) and \
            not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        errors.append(f"{key}.rollout_is={rc.rollout_is!r} / rollout_rs={rc.rollout_rs!r} compare the trainer's "
                      f"log-probs with the rollout engine's, and actor_rollout_ref.rollout.calculate_log_probs=False "
                      f"(verl then silently corrects nothing). Fix: actor_rollout_ref.rollout.calculate_log_probs=True.")
