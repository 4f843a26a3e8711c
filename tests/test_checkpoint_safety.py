"""Loading a checkpoint never runs code: `extra_rank{r}.pt` loads with `torch.load(weights_only=True)`."""
from __future__ import annotations

import io
import json
import os
import random

import numpy as np
import pytest
import torch

from rlx import checkpoint as ckpt
from rlx.trainer.main_ppo import main


class _WritesAFile:
    """A pickled object whose unpickling creates a file (what a malicious checkpoint would do, harmlessly)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def _step_dir(root, extra) -> str:
    """A complete, verifying global_step_1 whose actor extra state is `extra` (as torch.save writes it)."""
    step = root / "global_step_1"
    (step / "actor").mkdir(parents=True)
    torch.save(extra, step / "actor" / "extra_rank0.pt")
    (step / "actor" / "meta.json").write_text(json.dumps({"role": "actor", "world_size": 1, "contents": ["extra"]}))
    (step / "driver_state.json").write_text(json.dumps({"global_step": 1}))
    ckpt.mark_complete(str(step))
    return str(step)


def test_new_format_loads_weights_only_and_restores_every_rng():
    random.seed(3), np.random.seed(4), torch.manual_seed(5)
    state = ckpt._rng_state()
    expected = random.random(), np.random.rand(), torch.rand(1).item()
    # plain torch.load with weights_only=True and no allow-list: the format is tensors, dicts and numbers only
    buf = io.BytesIO()
    torch.save({"rng": state, "lr_scheduler": {"last_epoch": 2, "base_lrs": [0.1]}}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    ckpt._set_rng_state(loaded["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_earlier_format_still_resumes(tmp_path):
    """The format before this change (Python's tuple, numpy's tuple with an ndarray) loads the safe way."""
    random.seed(7), np.random.seed(8)
    old = {"rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
           "lr_scheduler": None}
    expected = random.random(), np.random.rand()
    path = tmp_path / "extra_rank0.pt"
    torch.save(old, path)
    loaded = ckpt.load_extra(str(path))
    random.seed(0), np.random.seed(0)
    ckpt._set_rng_state(loaded["rng"])
    assert (random.random(), np.random.rand()) == expected


def test_resave_converts_to_the_plain_format(tmp_path):
    random.seed(9), np.random.seed(10)
    old = {"rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
           "lr_scheduler": {"last_epoch": 1}}
    expected = random.random(), np.random.rand()
    step = _step_dir(tmp_path, old)
    assert ckpt.resave_extra(step) == [os.path.join(step, "actor", "extra_rank0.pt")]
    assert ckpt.verify(step) == [], "the manifest must be rewritten with the new checksums"
    new = torch.load(os.path.join(step, "actor", "extra_rank0.pt"), weights_only=True)  # no allow-list needed
    assert new["lr_scheduler"] == {"last_epoch": 1}
    ckpt._set_rng_state(new["rng"])
    assert (random.random(), np.random.rand()) == expected


def test_a_checkpoint_that_would_run_code_is_refused_before_training(tmp_path, capsys):
    marker = tmp_path / "code_ran"
    step = _step_dir(tmp_path / "ckpts", {"rng": _WritesAFile(str(marker)), "lr_scheduler": None})
    assert ckpt.verify(step) == [], "the manifest matches: only the loader can stop it"
    out = tmp_path / "out"
    code = main(["--config-name", "quickstart", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={step}",
                 f"trainer.default_local_dir={out}", "trainer.logger=[console,file]", "trainer.save_freq=1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not marker.exists(), "unpickling ran the checkpoint's code"
    assert "extra_rank0.pt" in err and "weights_only=True" in err and "resave-extra" in err, err
    assert not out.exists(), "nothing may start: no logs, no checkpoints"
    import ray
    assert not ray.is_initialized()
    with pytest.raises(ckpt.UnsafeCheckpointError, match="extra_rank0.pt"):  # and the worker's loader refuses it too
        ckpt.load_extra(os.path.join(step, "actor", "extra_rank0.pt"))
    assert not marker.exists()
