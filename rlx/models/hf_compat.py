"""What differs between the transformers versions rlx runs on (pyproject: transformers>=4.51), and transformers'
console output that rlx keeps off a run's console.

- A model's dtype is the `dtype` keyword of from_pretrained / from_config from transformers 4.56 on, which warns
  "`torch_dtype` is deprecated" for the old keyword; before 4.56 only `torch_dtype` sets it.
- save_pretrained draws a "Writing model shards" progress bar even for one small file: rlx writes its built-in
  models without it (`no_progress_bars`).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

DTYPE_KEYWORD_SINCE = (4, 56)
"""The transformers release whose from_pretrained / from_config take `dtype` (and deprecate `torch_dtype`)."""


def dtype_keyword(version: str) -> str:
    """The keyword that sets a model's dtype in transformers `version`: "dtype" from 4.56 on, else "torch_dtype"."""
    from packaging.version import Version

    return "dtype" if Version(version).release[:2] >= DTYPE_KEYWORD_SINCE else "torch_dtype"


@functools.cache
def _installed_keyword() -> str:
    import transformers

    return dtype_keyword(transformers.__version__)


def dtype_kwargs(dtype: Any) -> dict[str, Any]:
    """The keyword argument that sets a model's dtype in the installed transformers' from_pretrained /
    from_config: {"dtype": dtype}, or {"torch_dtype": dtype} before 4.56."""
    return {_installed_keyword(): dtype}


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' own progress bars off inside the block (save_pretrained's "Writing model shards"), then as
    they were."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
