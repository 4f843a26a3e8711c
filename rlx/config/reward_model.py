"""`reward_model` and `custom_reward_function`: how responses are scored (a reward model, the built-in rules or
the user's function, through a reward manager), and their rules.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rlx.config.fsdp import FSDPConfig, STRATEGIES
from rlx.config.judge import RewardJudgeConfig
from rlx.config.reward import RewardModelRolloutConfig
from rlx.config.roles import ENGINES
from rlx.config.rollout import ROLLOUT_DTYPES
from rlx.config.rules import check_choice, check_positive, choice


REWARD_MANAGERS = ("naive", "dapo", "batch")
OVERLONG_BUFFER_KEYS = ("enable", "len", "penalty_factor", "log")


@dataclass
class RewardModelModelConfig:
    path: Optional[str] = None
    """The reward model: an HF directory of a sequence-classification model with one label (e.g.
    Qwen2ForSequenceClassification; a token-classification checkpoint loads the same head), or
    builtin://tiny-qwen2-rm. Needed with reward_model.enable=True."""
    input_tokenizer: Optional[str] = None
    """The actor's tokenizer, when the reward model's differs (verl's key): each response is then decoded with it
    and the conversation (prompt messages + the response as the assistant's turn) re-templated with the reward
    model's own chat template. null: re-template only when the reward model's tokenizer is not the actor's
    (another vocabulary or chat template); otherwise the model scores the actor's own token ids."""
    external_lib: Optional[str] = None
    """A module imported before the model is built (registers a custom architecture)."""
    trust_remote_code: bool = False
    """Allow the model's own code from its directory (verl's legacy default is null: off)."""
    override_config: dict = field(default_factory=dict)
    """Entries set on the model's HF config before it is built."""
    use_remove_padding: bool = True
    """Score packed rows (padding removed) instead of padded ones; the scores are the same."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """Sharding of the reward model (param_offload: its parameters live on the CPU between scoring calls)."""


@dataclass
class RewardModelConfig:
    enable: bool = False
    """Score responses with a reward model (reward_model.model.path): a worker role of its own (FSDP, no
    optimizer) colocated with the actor's GPUs. Its score replaces the rule reward, as in verl: it goes on the
    response's last valid token. With custom_reward_function.path the custom function scores instead (verl's
    precedence)."""
    strategy: str = "${actor_rollout_ref.actor.strategy}"
    """fsdp | fsdp2: how the reward model is sharded (follows the actor's, as the ref's does)."""
    reward_manager: str = choice("naive", REWARD_MANAGERS)
    """Reward manager (verl's names): naive (one score per response, on its last valid token) | dapo (naive plus
    DAPO's overlong penalty, reward_kwargs.overlong_buffer_cfg) | batch (the score function takes lists:
    compute_score(data_sources, solution_strs, ground_truths, extra_infos) -> list)."""
    reward_kwargs: dict = field(default_factory=dict)
    """Arguments of the dapo reward manager (as in verl, nothing here reaches the score function):
    overlong_buffer_cfg {enable, len, penalty_factor, log} and max_resp_len (default data.max_response_length): a
    response longer than max_resp_len - len loses (length - (max_resp_len - len)) / len * penalty_factor."""
    score_kwargs: dict = field(default_factory=dict)
    """rlx key: keyword arguments of the built-in score functions (no custom_reward_function.path), e.g.
    {method: flexible, format_score: 0.1} for GSM8K. Empty: verl's default_compute_score, each scorer with its
    defaults (verl has no way to change them)."""
    launch_reward_fn_async: bool = False
    """verl key (not supported yet)."""
    non_finite_score: Optional[float] = None
    """A NaN or infinite score from the reward function: null stops the run with an error naming the function, the
    data_source and the sample; a number replaces the score (each replacement counted in
    reward/non_finite_count)."""
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    """The reward model (with enable=True)."""
    judge: RewardJudgeConfig = field(default_factory=RewardJudgeConfig)
    """rlx keys: the reward model as a generative judge (judge.enable=True; its prompt template, score range and
    sampling). Off: a discriminative reward model (a classifier)."""
    micro_batch_size: Optional[int] = None
    """Deprecated global form of micro_batch_size_per_gpu (divided by the world size, as verl does)."""
    micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per scoring forward on each GPU (or use_dynamic_bsz)."""
    max_length: Optional[int] = None
    """Longest re-templated conversation the reward model reads, in its tokens: a longer one loses its beginning
    (the score is read at the end). null: no limit (verl 0.9.1's reward loop scores the whole conversation)."""
    use_dynamic_bsz: bool = "${critic.use_dynamic_bsz}"  # type: ignore[assignment]
    """Form the scoring micro-batches by a token budget (forward_max_token_len_per_gpu) instead of a count (also
    what happens when micro_batch_size_per_gpu is null, as in verl 0.9.1 commands, which have no such key)."""
    forward_max_token_len_per_gpu: int = "${critic.forward_max_token_len_per_gpu}"  # type: ignore[assignment]
    """Token budget of one scoring micro-batch per GPU (use_dynamic_bsz, or no micro_batch_size_per_gpu)."""
    use_reward_loop: Optional[bool] = None
    """verl: serve the reward model through verl's reward loop (its only way in 0.9.1; it serves a classifier and a
    judge alike). rlx scores with its own reward-model worker whatever the value: see NO_OP_BY_DESIGN (a judge is
    reward_model.judge.enable)."""
    num_workers: Optional[int] = None
    """verl: how many processes compute the rewards in parallel (verl's reward-loop workers). rlx: the pool of
    processes that calls the score function (custom_reward_function, or a built-in rule) on a step's responses,
    one call per response, each bounded by score_timeout_s. null: 8 for a custom_reward_function (whose cost rlx
    cannot know), 1 for the built-in rules (microseconds a response). 1: in the driver's process, one call after
    another, without the timeout. The batch manager (reward_manager=batch, one call a step) and a function that does
    not pickle (not one rlx loads from config: e.g. a lambda given to RewardManager in code) also score in the
    driver's process."""
    score_timeout_s: float = 300.0
    """rlx key: the longest one call of the score function may run in the num_workers pool. A call past it is
    killed (its process replaced), its response gets timeout_score, and it is counted in reward/timeouts and in a
    console line that step; a step whose every call ran past it stops the run. In the driver's process
    (num_workers=1) a call cannot be stopped; a step's scoring past 30 s logs a progress line either way."""
    timeout_score: float = 0.0
    """rlx key: the reward of a response whose score function call ran past score_timeout_s."""
    rollout: RewardModelRolloutConfig = field(default_factory=RewardModelRolloutConfig)
    """verl: the engine that serves the reward model (its name, dtype and lengths act in rlx; its serving knobs
    set the generative judge's vLLM engine, and do nothing for a classifier)."""
    enable_resource_pool: bool = False
    """verl: the reward model on GPUs of its own, a placement group of reward_model.nnodes x
    reward_model.n_gpus_per_node (both required) next to the trainer's, one reward-model rank per GPU holding the
    whole GPU; False: colocated, rank i on the trainer's GPU i. The same scores either way. Inert without a reward
    model (rlx then reserves nothing)."""
    n_gpus_per_node: Optional[int] = None
    """verl: GPUs per node of the reward model's own pool (read with enable_resource_pool=True)."""
    nnodes: Optional[int] = None
    """verl: nodes of the reward model's own pool (read with enable_resource_pool=True)."""
    reward_loop_source: Optional[str] = None
    """verl: where a custom reward-loop manager comes from (not supported)."""
    reward_loop_module_path: Optional[str] = None
    """verl: a custom reward-loop manager's file (not supported)."""
    reward_loop_class_name: Optional[str] = None
    """verl: a custom reward-loop manager's class (not supported)."""


@dataclass
class CustomRewardFunctionConfig:
    path: Optional[str] = None
    """Python file that defines the score function."""
    name: str = "compute_score"
    """Function name: compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict."""
    reward_kwargs: dict = field(default_factory=dict)
    """Keyword arguments bound to the custom function (verl's `+custom_reward_function.reward_kwargs.*`); needs
    path (for the built-in rewards: reward_model.score_kwargs)."""


def valid_pool(cfg) -> bool:
    rm = cfg.reward_model
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (rm.nnodes, rm.n_gpus_per_node))


def check_reward_pool(cfg, errors):
    """reward_model.enable_resource_pool: both sizes of the pool given, as verl requires them."""
    rm = cfg.reward_model
    if not rm.enable_resource_pool:
        return
    for key, value in (("reward_model.nnodes", rm.nnodes), ("reward_model.n_gpus_per_node", rm.n_gpus_per_node)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            errors.append(f"{key}={value!r}: reward_model.enable_resource_pool=True places the reward model on a pool "
                          f"of its own, reward_model.nnodes x reward_model.n_gpus_per_node GPUs (verl requires both "
                          f"> 0). Fix: {key}=<a positive count>, or reward_model.enable_resource_pool=False "
                          f"(colocated with the actor).")


def check_reward_model(cfg, errors):
    """reward_model.enable: a model to score with, a strategy, and a micro-batch size (or a token budget)."""
    check_reward_pool(cfg, errors)
    rm = cfg.reward_model
    if not rm.enable:
        return
    if not rm.model.path:
        errors.append("reward_model.enable=True needs reward_model.model.path=<a sequence-classification model dir> "
                      "(or builtin://tiny-qwen2-rm; a causal LM with reward_model.judge.enable=True). Fix: set it, or "
                      "reward_model.enable=False.")
    if rm.strategy not in STRATEGIES:
        errors.append(f"reward_model.strategy={rm.strategy!r} is not supported; the reward model is sharded with fsdp "
                      f"or fsdp2. Fix: reward_model.strategy=fsdp2.")
    if rm.use_dynamic_bsz:
        check_positive(errors, "reward_model.forward_max_token_len_per_gpu", rm.forward_max_token_len_per_gpu,
                  "(the token budget of reward_model.use_dynamic_bsz=True)")
    elif rm.micro_batch_size_per_gpu is None and rm.micro_batch_size is None:  # verl 0.9.1: no such key
        check_positive(errors, "reward_model.forward_max_token_len_per_gpu", rm.forward_max_token_len_per_gpu,
                  "(the token budget of the reward model's micro-batches when reward_model.micro_batch_size_per_gpu "
                  "is null)")
    elif (rm.micro_batch_size_per_gpu or rm.micro_batch_size) <= 0:
        errors.append(f"reward_model.micro_batch_size_per_gpu={rm.micro_batch_size_per_gpu!r} must be positive. Fix: "
                      f"reward_model.micro_batch_size_per_gpu=<rows per GPU>.")
    name = rm.rollout.name
    if name is not None and name not in ENGINES:
        errors.append(f"reward_model.rollout.name={name!r}: rlx scores a reward model with its FSDP worker (the "
                      f"classifier's last-token output, what vLLM's classify returns) or generates a judge's "
                      f"verdicts with vLLM or HF; sglang and trtllm are not supported. Fix: "
                      f"reward_model.rollout.name=vllm (or hf, or leave it out).")
    if rm.rollout.dtype is not None:
        check_choice(errors, "reward_model.rollout.dtype", rm.rollout.dtype, ROLLOUT_DTYPES)
    if rm.max_length is not None and rm.max_length <= 0:
        errors.append(f"reward_model.max_length={rm.max_length} must be positive (or null). Fix: "
                      f"reward_model.max_length=null.")


def check_reward(cfg, errors):
    rm = cfg.reward_model
    if rm.num_workers is not None and (isinstance(rm.num_workers, bool) or not isinstance(rm.num_workers, int)
                                       or rm.num_workers < 1):
        errors.append(f"reward_model.num_workers={rm.num_workers!r} must be a whole number of processes, at least 1 "
                      f"(1: score in the driver's process). Fix: reward_model.num_workers=8, or null for rlx's "
                      f"choice.")
    t = rm.score_timeout_s
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
        errors.append(f"reward_model.score_timeout_s={t!r} must be a positive number of seconds. "
                      f"Fix: reward_model.score_timeout_s=300.")
    kwargs = rm.reward_kwargs or {}
    manager_keys = [k for k in ("overlong_buffer_cfg", "max_resp_len") if k in kwargs]
    for other in sorted(set(kwargs) - {"overlong_buffer_cfg", "max_resp_len"}):
        errors.append(f"reward_model.reward_kwargs.{other}={kwargs[other]!r}: verl passes reward_model.reward_kwargs "
                      f"only to the dapo reward manager (overlong_buffer_cfg, max_resp_len), never to the score "
                      f"function, so it would change nothing. Fix: reward_model.score_kwargs.{other}=... for the "
                      f"built-in rewards, or custom_reward_function.reward_kwargs.{other}=... for your function.")
    crf = cfg.custom_reward_function
    if crf.reward_kwargs and not crf.path:
        errors.append(f"custom_reward_function.reward_kwargs={dict(crf.reward_kwargs)!r} binds arguments of a custom "
                      f"function, and custom_reward_function.path is not set (verl ignores them then). Fix: set "
                      f"custom_reward_function.path, or use reward_model.score_kwargs for the built-in rewards.")
    if rm.score_kwargs and crf.path:
        errors.append(f"reward_model.score_kwargs={dict(rm.score_kwargs)!r} configures the built-in rewards, and "
                      f"custom_reward_function.path={crf.path!r} replaces them. Fix: move them to "
                      f"custom_reward_function.reward_kwargs.")
    if manager_keys and rm.reward_manager != "dapo":
        errors.append(f"reward_model.reward_kwargs.{manager_keys[0]} configures verl's dapo reward manager, but "
                      f"reward_model.reward_manager={rm.reward_manager!r}. Fix: reward_model.reward_manager=dapo.")
    if rm.reward_manager == "batch" and not cfg.custom_reward_function.path:
        errors.append("reward_model.reward_manager=batch calls a score function that takes lists, and the built-in "
                      "rewards take one sample. Fix: custom_reward_function.path=<file.py> defining "
                      "compute_score(data_sources, solution_strs, ground_truths, extra_infos) -> list, or "
                      "reward_model.reward_manager=naive.")
    buffer = kwargs.get("overlong_buffer_cfg")
    if rm.reward_manager != "dapo" or buffer is None:
        return
    key = "reward_model.reward_kwargs.overlong_buffer_cfg"
    if not isinstance(buffer, dict):
        errors.append(f"{key}={buffer!r} must be a dict {{enable, len, penalty_factor, log}}. Fix: set its keys, "
                      f"e.g. +{key}.enable=True +{key}.len=4096.")
        return
    unknown = sorted(set(buffer) - set(OVERLONG_BUFFER_KEYS))
    if unknown:
        errors.append(f"{key} has unknown key(s) {unknown}; verl's are {list(OVERLONG_BUFFER_KEYS)}. Fix: remove "
                      f"them.")
    if buffer.get("enable"):
        length = buffer.get("len")
        if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
            errors.append(f"{key}.len={length!r} must be a positive number of tokens with {key}.enable=True. Fix: "
                          f"{key}.len=4096 (tokens before the response limit where the penalty starts).")
        if not isinstance(buffer.get("penalty_factor"), (int, float)):
            errors.append(f"{key}.penalty_factor={buffer.get('penalty_factor')!r} must be a number with "
                          f"{key}.enable=True. Fix: {key}.penalty_factor=1.0.")
