"""Loading a checkpoint never runs code: `extra_rank{r}.pt` loads with `torch.load(weights_only=True)`."""
from __future__ import annotations

import io
import json
import os
import random

import numpy as np
import pytest
import torch

from ranks import end_rank
from rlx import checkpoint as ckpt
from rlx.checkpoint import engine_state
from rlx.trainer.cli import main


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
    state = engine_state._rng_state()
    expected = random.random(), np.random.rand(), torch.rand(1).item()
    # plain torch.load with weights_only=True and no allow-list: the format is tensors, dicts and numbers only
    buf = io.BytesIO()
    torch.save({"rng": state, "lr_scheduler": {"last_epoch": 2, "base_lrs": [0.1]}}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    engine_state._set_rng_state(loaded["rng"])
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
    engine_state._set_rng_state(loaded["rng"])
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
    engine_state._set_rng_state(new["rng"])
    assert (random.random(), np.random.rand()) == expected


def test_a_checkpoint_that_would_run_code_is_refused_before_training(tmp_path, capsys, monkeypatch):
    from unit.test_checkpoint_lock import _no_ray

    _no_ray(monkeypatch)
    marker = tmp_path / "code_ran"
    step = _step_dir(tmp_path / "ckpts", {"rng": _WritesAFile(str(marker)), "lr_scheduler": None})
    assert ckpt.verify(step) == [], "the manifest matches: only the loader can stop it"
    out = tmp_path / "out"
    code = main(["--config-name", "quickstart", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={step}",
                 f"trainer.default_local_dir={out}", "trainer.logger=[console,file]", "trainer.save_freq=1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not marker.exists(), "unpickling ran the checkpoint's code"
    assert "extra_rank0.pt" in err and "weights_only=True" in err and "trainer.resume_mode=disable" in err, err
    assert "resave-extra" not in err, "re-saving loads the file the unsafe way: never advised for a refused file"
    assert not out.exists(), "nothing may start: no logs, no checkpoints"
    with pytest.raises(ckpt.UnsafeCheckpointError, match="extra_rank0.pt"):  # and the worker's loader refuses it too
        ckpt.load_extra(os.path.join(step, "actor", "extra_rank0.pt"))
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------- every file of a step
@pytest.fixture(scope="module")
def real_step(tmp_path_factory):
    """A complete global_step_1 as rlx writes it for the quickstart job's actor (one rank): DCP model and optimizer
    (AdamW after one step: byte items for its param_groups), extra state, meta.json with the model's record,
    driver_state.json, the COMPLETE manifest."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    from rlx.engine.architecture import describe
    from rlx.engine.fsdp import build_hf_model
    from rlx.models import resolve_model_path

    step = tmp_path_factory.mktemp("ckpts") / "global_step_1"
    actor = step / "actor"
    model = build_hf_model(resolve_model_path("builtin://tiny-qwen2"), "actor", torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[5, 6, 7]])).logits.sum().backward()
    opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's note that it saves in a single process
        dcp.save(get_model_state_dict(model), checkpoint_id=str(actor / "model"))
        dcp.save(get_optimizer_state_dict(model, opt), checkpoint_id=str(actor / "optim"))
    torch.save({"rng": engine_state._rng_state(), "lr_scheduler": None}, actor / "extra_rank0.pt")
    (actor / "meta.json").write_text(json.dumps({"role": "actor", "world_size": 1, "contents": ["model", "optimizer",
                                                 "extra"], "model": describe(model, None)}))
    ckpt.save_driver_state(str(step), {"global_step": 1})
    ckpt.mark_complete(str(step))
    return step


def _plant_in_metadata(path, payload):
    """The DCP metadata, still a valid Metadata for plain pickle, carrying `payload` in its planner data."""
    import pickle

    with open(path, "rb") as f:
        metadata = pickle.load(f)  # the file rlx wrote in the fixture: trusted here
    metadata.planner_data = {"x": payload}
    with open(path, "wb") as f:
        pickle.dump(metadata, f)


def _plant_in_byte_item(optim_dir, payload) -> str:
    """Point the byte item param_groups.0.lr at a torch.save of `payload` appended to its .distcp file."""
    import dataclasses
    import pickle

    meta_path = optim_dir / ".metadata"
    with open(meta_path, "rb") as f:
        metadata = pickle.load(f)
    key = next(k for k in metadata.storage_data if k.fqn == "param_groups.0.lr")
    info = metadata.storage_data[key]
    shard = optim_dir / info.relative_path
    buf = io.BytesIO()
    torch.save(payload, buf)
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(buf.getvalue())
    metadata.storage_data[key] = dataclasses.replace(info, offset=offset, length=len(buf.getvalue()))
    with open(meta_path, "wb") as f:
        pickle.dump(metadata, f)
    return info.relative_path


PLANTS = {
    "extra": lambda step, p: torch.save({"rng": p, "lr_scheduler": None}, step / "actor" / "extra_rank0.pt")
    or "actor/extra_rank0.pt",
    "model_metadata": lambda step, p: _plant_in_metadata(step / "actor" / "model" / ".metadata", p)
    or "actor/model/.metadata",
    "optim_metadata": lambda step, p: _plant_in_metadata(step / "actor" / "optim" / ".metadata", p)
    or "actor/optim/.metadata",
    "optim_byte_item": lambda step, p: "actor/optim/" + _plant_in_byte_item(step / "actor" / "optim", p),
    "driver_state": lambda step, p: (step / "driver_state.json").write_bytes(__import__("pickle").dumps(p))
    and "driver_state.json",
    "meta_json": lambda step, p: (step / "actor" / "meta.json").write_bytes(__import__("pickle").dumps(p))
    and "actor/meta.json",
}


def _planted(real_step, tmp_path, where):
    import shutil

    step = tmp_path / "ckpts" / "global_step_1"
    shutil.copytree(real_step, step)
    marker = tmp_path / "code_ran"
    rel = PLANTS[where](step, _WritesAFile(str(marker)))
    ckpt.mark_complete(str(step))  # the manifest rewritten to match: only the loaders stand in the way
    assert ckpt.verify(str(step)) == []
    return step, marker, rel


def test_torchs_own_dcp_reader_and_planner_run_the_planted_code(real_step, tmp_path):
    """Why rlx has its own: the plain FileSystemReader / DefaultLoadPlanner execute the plants of the tests below."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    step, marker, _ = _planted(real_step, tmp_path, "model_metadata")
    FileSystemReader(str(step / "actor" / "model")).read_metadata()
    assert marker.exists()
    marker.unlink()
    step, marker, _ = _planted(real_step, tmp_path / "b", "optim_byte_item")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load({"param_groups.0.lr": None}, checkpoint_id=str(step / "actor" / "optim"), no_dist=True)
    assert marker.exists()


@pytest.mark.parametrize("where", list(PLANTS))
def test_a_planted_payload_in_any_file_runs_nothing_and_is_named(real_step, tmp_path, where):
    from rlx.checkpoint import check_resume_files

    step, marker, rel = _planted(real_step, tmp_path, where)
    problems = check_resume_files(str(step))
    assert not marker.exists(), "reading the checkpoint ran its code"
    assert len(problems) == 1 and str(step / rel) in problems[0], problems


UNSAFE_ADVICE = ("weights_only=False", "`weights_only` set to `False`", "trust", "can still be loaded", "safe_globals",
                 "resave-extra")


@pytest.mark.parametrize("where", list(PLANTS))
def test_a_refusal_line_has_no_escape_codes_and_no_advice_to_load_unsafely(real_step, tmp_path, where):
    """Issue 51: the refusal of a planted file is one plain line: no terminal escape codes, nothing quoted from
    torch's hint to load the file with weights_only=False or to allow its global, no advice to re-save it (which
    loads it the unsafe way); where torch names the global, the line names it."""
    from rlx.checkpoint import check_resume_files

    step, _, _ = _planted(real_step, tmp_path, where)
    problems = check_resume_files(str(step))
    assert len(problems) == 1, problems
    line = problems[0]
    assert line.isprintable(), repr(line)  # no ESC, no newline or tab
    assert not [a for a in UNSAFE_ADVICE if a in line], line
    if where in ("extra", "optim_byte_item"):
        assert "(global builtins.exec)" in line, line


def test_the_clean_step_passes_and_loads_whole(real_step, tmp_path):
    """The fixture's own files pass; the safe reader and planner load the model and optimizer back (byte items
    included); a model with a layer less is refused by key, naming both sides."""
    import warnings

    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    from rlx.checkpoint import check_resume_files
    from rlx.checkpoint.safety import load_whole
    from rlx.engine.fsdp import build_hf_model
    from rlx.models import resolve_model_path

    assert check_resume_files(str(real_step)) == []
    path = resolve_model_path("builtin://tiny-qwen2")
    model = build_hf_model(path, "actor", torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    sd, osd = get_model_state_dict(model), get_optimizer_state_dict(model, opt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_whole(sd, str(real_step / "actor" / "model"), "fix")
        load_whole(osd, str(real_step / "actor" / "optim"), "fix", partial=True)
    assert all(v.abs().sum() > 0 for k, v in sd.items() if "norm" not in k)
    assert {g["lr"] for g in osd["param_groups"]} == {1e-3}
    smaller = build_hf_model(path, "actor", torch.float32, override_config={"num_hidden_layers": 3})
    with pytest.raises(ValueError, match=r"saved from another model: \d+ saved keys the model does not have "
                                         r"\(e.g. \['model.layers.3"):
        load_whole(get_model_state_dict(smaller), str(real_step / "actor" / "model"), "fix")


@pytest.mark.parametrize("where", ["model_metadata", "optim_byte_item", "driver_state"])
def test_main_refuses_a_planted_step_before_ray(real_step, tmp_path, capsys, monkeypatch, where):
    from unit.test_checkpoint_lock import _no_ray

    _no_ray(monkeypatch)
    step, marker, rel = _planted(real_step, tmp_path, where)
    out = tmp_path / "out"
    code = main(["--config-name", "quickstart", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={step}",
                 f"trainer.default_local_dir={out}", "trainer.logger=[console]"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not marker.exists(), "reading the checkpoint ran its code"
    assert str(step / rel) in err, err
    assert "\x1b" not in err and not [a for a in UNSAFE_ADVICE if a in err], err


def test_a_checkpoint_of_another_model_is_refused_before_ray(real_step, tmp_path, capsys, monkeypatch):
    """The fixture's 4-layer actor into a 2-layer model (exit 0 before: the layers beyond 2 were dropped silently):
    refused by the preflight, both named."""
    import shutil

    from unit.test_checkpoint_lock import _no_ray

    _no_ray(monkeypatch)
    step = tmp_path / "ckpts" / "global_step_1"
    shutil.copytree(real_step, step)
    code = main(["--config-name", "quickstart", "trainer.resume_mode=auto", f"trainer.default_local_dir={step.parent}",
                 "trainer.logger=[console]", "actor_rollout_ref.model.override_config.num_hidden_layers=2"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{step / 'actor' / 'meta.json'}: the checkpoint's actor is another model" in err, err
    assert "num_hidden_layers: checkpoint 4, this run 2" in err, err


def test_a_shard_truncated_after_its_checksums_is_named_with_its_sizes_before_ray(real_step, tmp_path, capsys,
                                                                                   monkeypatch):
    """Issue 51: a model shard cut short, the COMPLETE manifest rewritten to match (it verifies): the preflight names
    the file and both sizes in one line (before: an 87-line Ray traceback ending in a bare EOFError)."""
    import shutil

    from unit.test_checkpoint_lock import _no_ray

    from rlx.checkpoint import check_resume_files

    _no_ray(monkeypatch)
    step = tmp_path / "ckpts" / "global_step_1"
    shutil.copytree(real_step, step)
    shard = step / "actor" / "model" / "__0_0.distcp"
    full = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(full // 2)
    ckpt.mark_complete(str(step))
    assert ckpt.verify(str(step)) == []
    problems = check_resume_files(str(step))
    assert len(problems) == 1 and "\n" not in problems[0], problems
    assert f"{shard} is truncated: {full // 2} bytes" in problems[0] and f"up to byte {full}" in problems[0], problems
    code = main(["--config-name", "quickstart", "trainer.resume_mode=auto", f"trainer.default_local_dir={step.parent}",
                 "trainer.logger=[console]"])
    err = capsys.readouterr().err
    assert code == 2 and f"{shard} is truncated: {full // 2} bytes" in err, err


def _without_record(real_step, tmp_path):
    """The fixture's step as an earlier rlx wrote it: meta.json without the model record."""
    import shutil

    step = tmp_path / "ckpts" / "global_step_1"
    shutil.copytree(real_step, step)
    meta = json.loads((step / "actor" / "meta.json").read_text())
    del meta["model"]
    (step / "actor" / "meta.json").write_text(json.dumps(meta))
    ckpt.mark_complete(str(step))
    return step


@pytest.mark.parametrize("override,found", [
    ("num_hidden_layers=2", "saved keys the model does not have (e.g. ['model.layers.2"),
    ("intermediate_size=192", "shapes differ (e.g. ['model.layers.0.mlp.down_proj.weight saved [128, 256], here "
                              "[128, 192]"),
])
def test_an_earlier_checkpoint_without_a_model_record_is_refused_before_ray(real_step, tmp_path, capsys, monkeypatch,
                                                                           override, found):
    """Issue 51: a checkpoint of an earlier rlx (no model record in meta.json) resumed with another model: the
    preflight compares its saved keys and shapes with the model built on the meta device and refuses in one line,
    naming the file and the fix (before: a raw Ray traceback from the load). The same model passes."""
    from unit.test_checkpoint_lock import _no_ray

    from conftest import load_config

    _no_ray(monkeypatch)
    step = _without_record(real_step, tmp_path)
    code = main(["--config-name", "quickstart", "trainer.resume_mode=auto", f"trainer.default_local_dir={step.parent}",
                 "trainer.logger=[console]", f"actor_rollout_ref.model.override_config.{override}"])
    err = capsys.readouterr().err
    assert code == 2, err
    line = next(x for x in err.splitlines() if "has no model record" in x)
    assert f"{step / 'actor' / 'model' / '.metadata'}: the checkpoint's actor" in line and found in line, line
    assert "Fix: resume with the model it was saved from" in line, line
    from rlx.checkpoint.safety import unrecorded_model_problems

    same = load_config([]).actor_rollout_ref.model
    assert unrecorded_model_problems(same, "actor_rollout_ref.model", "actor", str(step / "actor" / "meta.json")) == []


def _set_state_then(target: tuple, state, real: bytes) -> bytes:
    """A pickle that pushes the global `target` (module, name), sets `state` on it (BUILD), drops it, and goes on
    to unpickle `real` (a protocol-2 pickle of the true Metadata), whose result the file's is."""
    import pickle

    module, name = target
    head = pickle.dumps(state, protocol=2)[2:-1]  # the state's opcodes, without PROTO and STOP
    return b"\x80\x02c" + f"{module}\n{name}\n".encode() + head + pickle.BUILD + pickle.POP + real[2:]


@pytest.mark.parametrize("target,state", [
    (("torch.distributed.checkpoint.metadata", "Metadata"), (None, {"planted": 1})),
    (("torch.distributed.checkpoint.metadata", "StorageMeta"), (None, {"__eq__": None})),
    (("pathlib", "PurePosixPath"), (None, {"planted": 1})),
    (("torch.serialization", "_get_layout"), {"planted": 1}),
])
def test_the_metadata_reader_sets_no_state_on_what_it_allows(real_step, tmp_path, target, state):
    """Issue 51: a `.metadata` that sets attributes on a class (or function) the reader allows, then holds a real
    Metadata: refused, naming the file, and nothing is set (before: accepted, the attribute set in the driver and
    in every rank that read it)."""
    import importlib
    import pickle
    import shutil

    from rlx.checkpoint import check_resume_files

    step = tmp_path / "ckpts" / "global_step_1"
    shutil.copytree(real_step, step)
    path = step / "actor" / "model" / ".metadata"
    real = pickle.dumps(pickle.loads(path.read_bytes()), protocol=2)  # the fixture's own file: trusted here
    path.write_bytes(_set_state_then(target, state, real))
    obj = getattr(importlib.import_module(target[0]), target[1])
    name = next(iter(state[1] if isinstance(state, tuple) else state))
    before = obj.__dict__.get(name, "unset")
    try:
        problems = check_resume_files(str(step))
        assert obj.__dict__.get(name, "unset") == before, f"{target} got {name} from the file"
    finally:
        if obj.__dict__.get(name, "unset") != before:
            delattr(obj, name) if before == "unset" else setattr(obj, name, before)
    assert len(problems) == 1 and str(path) in problems[0] and "would run code" in problems[0], problems
    assert f"{target[0]}.{target[1]}" in problems[0], problems


def test_the_metadata_reader_sets_only_plain_attributes_on_a_dcp_instance(real_step, tmp_path):
    """Issue 51: a DCP metadata object's state may not change its class (slot state `__class__`), only set its
    attributes; the fixture's own file still loads."""
    import pickle
    import shutil

    from torch.distributed.checkpoint.metadata import Metadata

    from rlx.checkpoint.safety import load_metadata

    step = tmp_path / "global_step_1"
    shutil.copytree(real_step, step)
    path = step / "actor" / "model" / ".metadata"
    assert isinstance(load_metadata(str(path)), Metadata)
    real = pickle.loads(path.read_bytes())
    # a Metadata whose BUILD carries slot state turning it into a StorageMeta: Metadata(...) then (dict, slots)
    body = pickle.dumps(real, protocol=2)
    cut = len(body) - 2
    assert body[cut:] == pickle.BUILD + pickle.STOP  # the outermost object's BUILD, then STOP
    slots = pickle.dumps({"__class__": None}, protocol=2)[2:-1].replace(b"N", b"ctorch.distributed.checkpoint."
                                                                         b"metadata\nStorageMeta\n", 1)
    path.write_bytes(body[:cut] + slots + pickle.TUPLE2 + body[cut:])
    with pytest.raises(ckpt.UnsafeCheckpointError, match=r"__class__"):
        load_metadata(str(path))


def _two_ranks(rank: int, world: int, port: int, root: str, where: str) -> None:
    """Save a sharded optimizer from 2 gloo ranks, plant a payload (rank 0), load it back on both ranks."""
    import warnings

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from rlx.checkpoint.safety import load_whole

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        step = __import__("pathlib").Path(root) / "global_step_1"
        dcp.save(get_optimizer_state_dict(model, opt), checkpoint_id=str(step / "actor" / "optim"))
        marker = __import__("pathlib").Path(root) / "code_ran"
        if rank == 0:
            PLANTS[where](step, _WritesAFile(str(marker)))
        dist.barrier()
        with pytest.raises(ckpt.UnsafeCheckpointError, match="actor/optim/"):
            load_whole(get_optimizer_state_dict(model, opt), str(step / "actor" / "optim"), "fix", partial=True)
        assert not marker.exists(), f"rank {rank}: loading ran the checkpoint's code"
    finally:
        end_rank()


# ---------------------------------------------------------------------------------------------- whole: every key
def test_an_optimizer_key_the_checkpoint_lacks_is_refused_naming_the_file(tmp_path):
    """An optimizer being loaded that holds state the checkpoint lacks (a layer more) was filled in part and trained
    on (partial loading skipped the keys it did not find): now refused, naming the checkpoint's file and the keys."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from rlx.checkpoint.safety import load_whole

    def trained(layers):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(layers)])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        return model, opt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's note that it saves in a single process
        dcp.save(get_optimizer_state_dict(*trained(1)), checkpoint_id=str(tmp_path / "optim"))
        bigger = get_optimizer_state_dict(*trained(2))
        with pytest.raises(ValueError) as e:
            load_whole(bigger, str(tmp_path / "optim"), "the fix", partial=True)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'optim' / '.metadata'}: 6 keys being loaded are not in the checkpoint"), msg
    assert "'state.1.bias.exp_avg'" in msg and msg.endswith("Fix: the fix"), msg


def _fsdp1_optimizer_ranks(rank: int, world: int, port: int, root: str) -> None:
    """FSDP1 over 2 gloo ranks, one flat shard: the last layer's few elements all sit on rank 1, so rank 0 holds no
    optimizer state for them. Saved with a distinctive lr, loaded into a fresh optimizer: every rank's param_groups
    (lr, initial_lr) must come back."""
    import warnings

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from rlx.checkpoint.safety import load_whole

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        def build(lr):
            torch.manual_seed(0)
            model = FSDP(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)), use_orig_params=True,
                         device_id=torch.device("cpu"), sync_module_states=False)
            return model, torch.optim.AdamW(model.parameters(), lr=lr)

        model, opt = build(0.123)
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        path = os.path.join(root, "optim")
        dcp.save(get_optimizer_state_dict(model, opt), checkpoint_id=path)
        fresh, fresh_opt = build(1e-3)
        osd = get_optimizer_state_dict(fresh, fresh_opt)
        load_whole(osd, path, "fix", partial=True)
        set_optimizer_state_dict(fresh, fresh_opt, osd)
        assert [g["lr"] for g in fresh_opt.param_groups] == [0.123], f"rank {rank}: {fresh_opt.param_groups[0]['lr']}"
        assert all(torch.equal(opt.state[p]["exp_avg"], fresh_opt.state[q]["exp_avg"])
                   for p, q in zip(model.parameters(), fresh.parameters()) if p in opt.state)
    finally:
        end_rank()
