"""rlx's calls into transformers keep its deprecation warning and its save progress bar off a run's console: models are
loaded with the dtype keyword the installed transformers takes (`dtype` from 4.56 on, where `torch_dtype` warns), and
a built-in model is written without transformers' "Writing model shards" bar."""
from __future__ import annotations

import logging

import pytest
import torch
from transformers.utils import logging as hf_logging

from rlx.models.hf_compat import dtype_keyword


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def transformers_warnings():
    """What transformers warns inside the test (its warning_once messages free to come again), with its progress
    bars on as by default; its verbosity and bars restored after."""
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_warning()
    hf_logging.enable_progress_bar()
    logging.Logger.warning_once.cache_clear()  # transformers' warning_once: an lru_cache on logging.Logger
    records = _Records()
    root = logging.getLogger("transformers")
    root.addHandler(records)
    yield records.messages
    root.removeHandler(records)
    hf_logging.set_verbosity(verbosity)
    (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()


def dtype_warnings(messages: list[str]) -> list[str]:
    return [m for m in messages if "torch_dtype" in m]


def test_a_builtin_model_is_written_without_a_warning_or_a_progress_bar(tmp_path, monkeypatch, capfd,
                                                                        transformers_warnings):
    from rlx.models import resolve_model_path

    monkeypatch.setenv("RLX_CACHE", str(tmp_path))
    path = resolve_model_path("builtin://tiny-qwen2")  # written now, in this empty cache
    err = capfd.readouterr().err
    assert path.startswith(str(tmp_path))
    assert "Writing model shards" not in err, err
    assert not dtype_warnings(transformers_warnings), transformers_warnings
    assert hf_logging.is_progress_bar_enabled()  # turned off around the save only


def test_the_engine_and_the_hf_rollout_load_in_the_dtype_asked_without_the_deprecation_warning(
        tiny_model_path, transformers_warnings):
    from rlx.engine.fsdp import build_hf_model
    from rlx.workers.rollout.hf_rollout import HFRollout

    actor = build_hf_model(tiny_model_path, "actor", torch.bfloat16)
    critic = build_hf_model(tiny_model_path, "critic", torch.float32)
    rollout = HFRollout(tiny_model_path, max_response_length=4, pad_token_id=0, eos_token_id=2,
                        device=torch.device("cpu"), dtype=torch.bfloat16)
    assert {p.dtype for p in actor.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in critic.parameters()} == {torch.float32}
    assert {p.dtype for p in rollout.model.parameters()} == {torch.bfloat16}
    assert not dtype_warnings(transformers_warnings), transformers_warnings


@pytest.mark.parametrize("version,keyword", [("4.51.3", "torch_dtype"), ("4.55.4", "torch_dtype"),
                                             ("4.56.0", "dtype"), ("5.17.0", "dtype"), ("5.19.0", "dtype"),
                                             ("5.20.0.dev0", "dtype")])
def test_the_dtype_keyword_follows_the_transformers_release(version, keyword):
    assert dtype_keyword(version) == keyword
