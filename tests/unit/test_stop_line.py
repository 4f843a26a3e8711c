"""The line that ends a stopped run (a failed save, SIGTERM, Ctrl-C, a dead worker) says where the same command
starts again, and that is where it does start: the step trainer.resume_mode=auto finds, the first step with
disable, trainer.resume_from_path with resume_path (rlx.checkpoint.store.find_resume_dir decides)."""
from __future__ import annotations

import os

import pytest

from conftest import load_config
from rlx.checkpoint import store
from rlx.trainer.launch import last_checkpoint_note


def saved_step(root, step: int) -> str:
    """A step folder the store counts as a complete, verified checkpoint (its files and its COMPLETE manifest)."""
    d = store.step_dir(str(root), step)
    os.makedirs(os.path.join(d, "actor"))
    with open(os.path.join(d, "actor", "meta.json"), "w") as f:
        f.write("{}")
    store.mark_complete(d)
    return d


@pytest.fixture
def two_steps(tmp_path):
    root = tmp_path / "ckpt"
    return str(root), saved_step(root, 1), saved_step(root, 2)


def config(root: str, *overrides: str):
    return load_config([f"trainer.default_local_dir={root}", *overrides])


def test_auto_resumes_from_the_last_checkpoint(two_steps):
    root, _, last = two_steps
    cfg = config(root, "trainer.resume_mode=auto")
    assert store.find_resume_dir(cfg.trainer) == last
    assert last_checkpoint_note(cfg) == (f"The last complete checkpoint, {last}, is kept: the same command resumes "
                                         f"from it (trainer.resume_mode=auto).")


def test_disable_starts_again_from_the_first_step_and_says_how_to_resume(two_steps):
    root, _, last = two_steps
    cfg = config(root, "trainer.resume_mode=disable")
    assert store.find_resume_dir(cfg.trainer) is None
    note = last_checkpoint_note(cfg)
    assert "resumes from it" not in note, note
    assert note == (f"The last complete checkpoint, {last}, is kept, but the same command starts again from the "
                    f"first step (trainer.resume_mode=disable). To resume from it: trainer.resume_mode=auto.")


def test_resume_path_resumes_from_that_path_again_and_names_the_newer_one(two_steps):
    root, first, last = two_steps
    cfg = config(root, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={first}")
    assert store.find_resume_dir(cfg.trainer) == first
    assert last_checkpoint_note(cfg) == (
        f"The last complete checkpoint, {last}, is kept, but the same command resumes from "
        f"trainer.resume_from_path={first} again (trainer.resume_mode=resume_path). To go on from it: "
        f"trainer.resume_from_path={last}.")
    at_last = config(root, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={last}")
    assert last_checkpoint_note(at_last) == (f"The same command resumes from trainer.resume_from_path={last} "
                                             f"again.")


@pytest.mark.parametrize("mode", ["auto", "disable"])
def test_without_a_checkpoint_the_same_command_starts_from_the_first_step(tmp_path, mode):
    cfg = config(str(tmp_path / "ckpt"), f"trainer.resume_mode={mode}")
    assert store.find_resume_dir(cfg.trainer) is None
    assert last_checkpoint_note(cfg) == ("No checkpoint was saved (trainer.save_freq): the same command starts "
                                         "again from the first step.")
