"""Model directories written whole: into a temp folder beside the target, then renamed, so no process ever reads a
half-written model (a reader waits for the `.rlx-complete` mark)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from rlx.models.hf_compat import no_progress_bars

COMPLETE = ".rlx-complete"


def save_whole(model, tokenizer, target: Path) -> None:
    """`model.save_pretrained` (safetensors) and `tokenizer.save_pretrained` into `target`, all at once."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        with no_progress_bars():  # transformers' "Writing model shards" bar, for a file or two
            model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / COMPLETE).touch()
        if target.exists():  # an incomplete leftover of an interrupted build
            shutil.rmtree(target)
        os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
