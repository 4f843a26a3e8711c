"""Loading a checkpoint never runs code from it: the DCP reader and planner resume uses, the loader of the extra
state files, and the checks of every file of the step to resume from (`rlx.checkpoint.store.check_resume_files`,
before Ray starts).

torch's own `FileSystemReader.read_metadata` unpickles `.metadata` with `pickle.load`, and `DefaultLoadPlanner`
loads every byte item (the optimizer's `param_groups.*`) with `torch.load(weights_only=False)`: a pickle planted in
either runs on every rank at resume. Here, through public DCP extension points only (a `FileSystemReader` subclass,
a `DefaultLoadPlanner` subclass), so that it holds on every torch rlx supports (2.11 .. 2.13):

- `.metadata` is unpickled by `_MetadataUnpickler`, which resolves only data types: the dataclasses and enums of
  torch.distributed.checkpoint's own modules (checked by module prefix, so a class added or moved by a torch release
  is still found), `torch.Size`, torch dtypes / layouts / memory formats, `pathlib` paths (DCP records the
  checkpoint id) and a few containers. Any other global is refused by name: nothing is called. State (pickle's
  BUILD) is set only on instances of DCP's metadata dataclasses, as their attributes: never on a class or function
  the file names, so that a file cannot change them in the driver or a rank.
- byte items load with `torch.load(weights_only=True)` (`SafeLoadPlanner.load_bytes`).
- `extra_rank*.pt` (lr scheduler, RNG states) loads with `torch.load(weights_only=True)` (`load_extra`).

`store.check_resume_files(step)` reads every file resume reads the way resume reads it: `driver_state.json`, each
role's `meta.json` (JSON), `extra_rank*.pt`, the `.metadata` and every byte item of `model/` and `optim/` (as
above); tensor items are left alone (DCP always loads them with `weights_only=True`).

Only whole checkpoints load (`load_whole`): a model's state must be the saved one key for key and shape for shape.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib
import io
import logging
import os
import pathlib
import pickle
import re
from typing import Any, Callable, ClassVar

import numpy as np
import torch
from torch.distributed.checkpoint import CheckpointException, FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, create_default_local_load_plan
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta

from rlx.checkpoint.errors import DamagedCheckpointError, UnsafeCheckpointError

log = logging.getLogger("rlx")

METADATA = ".metadata"
_DCP_PREFIX = "torch.distributed.checkpoint"
_CONTAINERS = {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset")}


def _allowed_global(module: str, name: str):
    """The object `module.name` if a DCP metadata pickle may use it (data types only), else None."""
    if "." in name or name.startswith("__"):
        return None
    if module == _DCP_PREFIX or module.startswith(_DCP_PREFIX + "."):
        try:
            obj = getattr(importlib.import_module(module), name, None)  # torch's own modules only
        except ImportError:
            return None
        if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
            return obj  # constructing one assigns fields; none of DCP's defines __post_init__
        return None
    if module == "torch":
        obj = getattr(torch, name, None)
        if obj is torch.Size or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
            return obj
        return None
    if module == "torch.serialization" and name == "_get_layout":  # how a torch.layout pickles: a name lookup
        return torch.serialization._get_layout
    if module == "pathlib" or module.startswith("pathlib."):  # StorageMeta.checkpoint_id
        obj = getattr(pathlib, name, None)
        return obj if isinstance(obj, type) and issubclass(obj, pathlib.PurePath) else None
    if (module, name) in _CONTAINERS:
        return getattr(importlib.import_module(module), name)
    return None


class _Refused(pickle.UnpicklingError):
    """What the metadata unpickler refuses: a global outside DCP's metadata types, or state set where it may not."""


class _MetadataUnpickler(pickle._Unpickler):  # the pure-Python unpickler, whose BUILD can be replaced
    """Builds only the types `_allowed_global` resolves, and sets state (pickle's BUILD) only on an instance of one
    of DCP's metadata dataclasses: through the class's own `__setstate__` (torch's), else as its plain attributes.
    Never on a class, a function or any other object: a file cannot set attributes on what it may name."""

    dispatch: ClassVar[dict[int, Callable[[Any], None]]] = dict(pickle._Unpickler.dispatch)
    stack: list[Any]  # the pure-Python unpickler's stack (set by its load)

    def find_class(self, module, name):
        obj = _allowed_global(module, name)
        if obj is None:
            raise _Refused(f"global {module}.{name} is not a DCP metadata type")
        return obj

    def persistent_load(self, pid):
        raise _Refused("persistent ids are not DCP metadata")

    def _load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        cls = type(inst)
        named = getattr(inst, "__qualname__", None) if isinstance(inst, type) or callable(inst) else None
        what = (f"{getattr(inst, '__module__', '?')}.{named}" if isinstance(named, str)
                else f"a {cls.__module__}.{cls.__qualname__}")
        if isinstance(inst, type) or not dataclasses.is_dataclass(cls) or \
                _allowed_global(cls.__module__, cls.__name__) is not cls:
            raise _Refused(f"state set on {what}, which is not a DCP metadata object")
        setstate = getattr(cls, "__setstate__", None)  # the class's own method (torch's), not the instance's
        if setstate is not None:
            setstate(inst, state)
            return
        attrs, slots = state if isinstance(state, tuple) and len(state) == 2 else (state, None)
        fields = {f.name for f in dataclasses.fields(cls)}
        for part, allowed in ((attrs, None), (slots, fields)):
            if part is None:
                continue
            bad = [k for k in part if not isinstance(k, str) or k.startswith("__") or
                   (allowed is not None and k not in allowed)] if isinstance(part, dict) else [type(part).__name__]
            if bad:
                raise _Refused(f"state {bad[:3]} set on {what}, which are not its attributes")
        inst.__dict__.update(attrs or {})
        for key, value in (slots or {}).items():
            object.__setattr__(inst, key, value)  # a field (frozen dataclasses too, as pickle's BUILD does)

    dispatch[pickle.BUILD[0]] = _load_build


def _refusal(path: str, what: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"{path} holds {what}, which would run code when loaded; rlx loads DCP checkpoints with an unpickler that "
        f"takes DCP's metadata types only and byte items with torch.load(weights_only=True), and refuses it. Nothing "
        f"was loaded or trained. Fix: resume from a checkpoint rlx wrote (trainer.resume_from_path=<an earlier "
        f"global_step_N dir>), or start fresh (trainer.resume_mode=disable)")


_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|[\x00-\x1f\x7f]")


def quoted(e: BaseException) -> str:
    """An error of torch (or any library) as a refusal line may quote it: `Type: first line`, without terminal
    escape codes or control characters; torch's weights-only refusal, whose text advises loading the file with
    weights_only=False or allowing its global, is told by the global it names alone."""
    text = str(e)
    found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if found or "Weights only load failed" in text:
        name = found.group(1) if found else "a global the weights-only loader does not allow"
        return f"global {'builtins.' if found and '.' not in name else ''}{name}"
    first = next((line for line in text.splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {_ESCAPES.sub('', first).strip()}"[:300] if first else type(e).__name__


def load_metadata(path: str) -> Metadata:
    """Unpickle a DCP `.metadata` file allowing DCP's metadata types only; `UnsafeCheckpointError` naming the file
    for anything else, `DamagedCheckpointError` for a file that is not a metadata pickle at all."""

    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except _Refused as e:
        raise _refusal(path, f"a pickled object outside DCP's metadata ({_ESCAPES.sub('', str(e))})") from None
    except pickle.UnpicklingError as e:
        raise DamagedCheckpointError(f"{path} is unreadable ({quoted(e)}); resume from an earlier "
                                     f"global_step_N dir (trainer.resume_from_path)") from None
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - EOFError, a truncated or garbled file
        raise DamagedCheckpointError(f"{path} is unreadable ({quoted(e)}); resume from an earlier "
                                     f"global_step_N dir (trainer.resume_from_path)") from None
    if not isinstance(metadata, Metadata):
        raise DamagedCheckpointError(f"{path} holds a {type(metadata).__name__}, not DCP metadata; resume from an "
                                     f"earlier global_step_N dir (trainer.resume_from_path)")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """`FileSystemReader` whose metadata is unpickled with DCP's metadata types only (`load_metadata`)."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        rank = kwargs.get("rank")
        name = METADATA if rank is None else f"__{rank}{METADATA}"
        metadata = load_metadata(os.path.join(os.fspath(self.path), name))
        storage_meta = getattr(metadata, "storage_meta", None)
        if storage_meta is None:  # as FileSystemReader.read_metadata does
            storage_meta = metadata.storage_meta = StorageMeta()
        storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """`DefaultLoadPlanner` whose byte items load with `torch.load(weights_only=True)`, and that finds every key it is
    asked to load in the checkpoint or refuses, naming the file (`fix`: what the refusal tells the user to do). It
    records the keys it plans to load (`planned`), so that the caller can tell saved keys nothing consumed.

    DCP's own planner, when a saved key is not being loaded, retries the key format of checkpoints older than torch
    2.4 (which rlx never wrote): on an FSDP1 rank that holds no optimizer state for some parameters, that flattened
    the rank's `param_groups` into one key the checkpoint lacks, and a partial load skipped it, so that the rank
    trained on with its fresh learning rate. The plan here is DCP's default plan of the state's own keys."""

    def __init__(self, checkpoint_dir: str, fix: str = "resume from a checkpoint of this model", **kwargs):
        super().__init__(**kwargs)
        self.checkpoint_dir, self.fix = checkpoint_dir, fix
        self.planned: set[str] = set()

    def create_local_plan(self):
        assert self.metadata is not None  # DCP calls set_up_planner(state_dict, metadata) first
        saved = self.metadata.state_dict_metadata
        missing = sorted(k for k in self.state_dict if k not in saved)
        if missing:
            raise ValueError(f"{os.path.join(self.checkpoint_dir, METADATA)}: {len(missing)} keys being loaded are not "
                             f"in the checkpoint (e.g. {missing[:3]}): it was saved from another model or optimizer. "
                             f"Fix: {self.fix}")
        plan = create_default_local_load_plan(self.state_dict, self.metadata, True)
        self.planned = {item.dest_index.fqn for item in plan.items}
        return plan

    def _file_of(self, read_item) -> str:
        storage = getattr(getattr(self, "metadata", None), "storage_data", None) or {}
        info = storage.get(read_item.storage_index)
        rel = getattr(info, "relative_path", None)
        return os.path.join(self.checkpoint_dir, rel) if rel else self.checkpoint_dir

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True, map_location="cpu")
        except pickle.UnpicklingError as e:
            raise _refusal(f"{self._file_of(read_item)} (item {read_item.dest_index.fqn})",
                           f"a pickled object ({quoted(e)})") from None
        # what weights_only produced (tensors, containers, numbers, strings) pickles back to the same plain types:
        # the parent's torch.load(weights_only=False) of it runs nothing, and keeps DCP's own placement logic
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        super().load_bytes(read_item, buf)


def unwrap_checkpoint_error(e: BaseException) -> BaseException:
    """What a rank raised inside `dcp.load` (which wraps per-rank failures in a `CheckpointException`, a
    BaseException): the first `UnsafeCheckpointError` among them, else the first failure, else `e` itself."""
    inner = [f[0] if isinstance(f, tuple) else f for f in (getattr(e, "failures", None) or {}).values()]
    return next((x for x in inner if isinstance(x, UnsafeCheckpointError)), inner[0] if inner else e)


def _fit_problems(saved: dict, have: dict, optional: frozenset = frozenset()) -> list[str]:
    """How a model's keys and shapes (`have`: name -> shape) differ from the saved ones; [] when they agree.
    `optional`: keys of `have` that may be absent from the checkpoint (a tied weight's second name)."""
    extra, missing = sorted(set(saved) - set(have)), sorted(set(have) - set(saved) - optional)
    shapes = [f"{k} saved {list(saved[k])}, here {list(have[k])}" for k in sorted(set(saved) & set(have))
              if saved[k] != have[k]]
    return ([f"{len(extra)} saved keys the model does not have (e.g. {extra[:3]})"] if extra else []) + \
        ([f"{len(missing)} model keys not in the checkpoint (e.g. {missing[:3]})"] if missing else []) + \
        ([f"{len(shapes)} shapes differ (e.g. {shapes[:3]})"] if shapes else [])


def _saved_shapes(metadata: Metadata) -> dict:
    return {k: tuple(getattr(md, "size", None) or ()) for k, md in metadata.state_dict_metadata.items()}


def _check_fits(state: dict, metadata: Metadata, directory: str, fix: str) -> None:
    """A flat state dict (a model's: name -> tensor) must be the saved one: the same keys, the same (global) shapes."""
    have = {k: tuple(v.size()) if callable(getattr(v, "size", None)) else () for k, v in state.items()}  # global
    parts = _fit_problems(_saved_shapes(metadata), have)
    if parts:
        raise ValueError(f"{os.path.join(directory, METADATA)} was saved from another model: {'; '.join(parts)}. "
                         f"Fix: {fix}")


def model_fit_problems(model, lora: bool, directory: str) -> list[str]:
    """How the DCP model checkpoint at `directory` differs from `model` (as the engine builds it, before FSDP; e.g.
    on the meta device) in keys and shapes, as the load will compare them (`_check_fits`); [] when it fits. With
    `lora` only the trainable parameters are saved (`engine_state._state_dict_options`). Reads the metadata only."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(ignore_frozen_params=lora, strict=not lora))
    seen, optional = set(), set()
    for name, tensor in model.state_dict(keep_vars=True).items():  # a tied weight: either of its names may be saved
        if id(tensor) in seen:
            optional.add(name)
        seen.add(id(tensor))
    have = {k: tuple(v.size()) for k, v in state.items() if isinstance(v, torch.Tensor)}  # a model's: tensors only
    return _fit_problems(_saved_shapes(load_metadata(os.path.join(directory, METADATA))), have, frozenset(optional))


def unrecorded_model_problems(model_cfg, key: str, role: str, meta_path: str) -> list[str]:
    """A checkpoint of an earlier rlx (its meta.json has no model record): the model's saved keys and shapes
    (`model/.metadata`) against the model `model_cfg` builds on the meta device, as the load will compare them; the
    preflight's one line when they differ, else []."""
    from rlx.engine.architecture import build_meta

    model_dir = os.path.join(os.path.dirname(meta_path), "model")
    if not os.path.isdir(model_dir):
        return []
    try:
        model, lora = build_meta(model_cfg, role)
        diffs = model_fit_problems(model, lora is not None, model_dir)
    except DamagedCheckpointError:  # said by check_resume_files
        return []
    except Exception as e:  # noqa: BLE001 - the model path's own problem is reported by the preflight's model check
        log.warning("%s: the model could not be built on the meta device to compare with %s (%s: %s)", key,
                    model_dir, type(e).__name__, (str(e).strip().splitlines() or [""])[0])
        return []
    if not diffs:
        return []
    return [f"{os.path.join(model_dir, METADATA)}: the checkpoint's {role} (an earlier rlx's: {meta_path} has no "
            f"model record) is another model than the one {key} builds ({key}.path={model_cfg.path!r}): "
            f"{'; '.join(diffs)}. Fix: resume with the model it was saved from ({key}.path, override_config and "
            f"LoRA keys as then), or start fresh (trainer.resume_mode=disable, or another "
            f"trainer.default_local_dir)."]


def _check_consumed(planner: SafeLoadPlanner, metadata: Metadata, directory: str, fix: str) -> None:
    """Every saved key was loaded by some rank (a partial load may skip keys per rank, not overall)."""
    import torch.distributed as dist

    planned = planner.planned
    if dist.is_available() and dist.is_initialized():
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, planned)
        planned = set().union(*every)
    left = sorted(set(metadata.state_dict_metadata) - planned)
    if left:
        raise ValueError(f"{os.path.join(directory, METADATA)}: {len(left)} saved keys fit nothing being loaded (e.g. "
                         f"{left[:3]}): it was saved from another model or optimizer. Fix: {fix}")


def load_whole(state: dict, directory: str, fix: str, partial: bool = False) -> None:
    """`dcp.load(state)` from `directory` through the safe reader and planner, and only whole: every key of `state`
    must be in the checkpoint (on every rank), and every saved key must be loaded. A model's flat state dict must
    equal the saved keys and shapes (checked before anything is read); with `partial` (an optimizer's, where a rank
    may hold no state for some parameters) a rank may load a part of the saved keys, and every one must be loaded
    by some rank. Collective. `fix`: what the error tells the user to do."""
    import torch.distributed.checkpoint as dcp

    metadata = load_metadata(os.path.join(directory, METADATA))
    if not partial:
        _check_fits(state, metadata, directory, fix)
    planner = SafeLoadPlanner(directory, fix)
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(directory), planner=planner)
    except CheckpointException as e:  # a BaseException: each rank's failure comes back wrapped
        inner = unwrap_checkpoint_error(e)
        if isinstance(inner, ValueError):  # a refusal of ours (or a bad value): said as it was raised
            raise inner from None
        raise
    if partial:
        _check_consumed(planner, metadata, directory, fix)


def check_dcp_dir(path: str) -> list[str]:
    """Read the DCP checkpoint at `path` as resume will (its metadata, then every byte item); [] when nothing in it
    would run code or fail to load, else the problems, each naming the file."""
    import torch.distributed.checkpoint as dcp


    reader = SafeFileSystemReader(path)
    try:
        metadata = reader.read_metadata()
    except (UnsafeCheckpointError, DamagedCheckpointError) as e:
        return [str(e)]
    except OSError as e:
        return [f"{os.path.join(path, METADATA)}: missing or unreadable ({e.strerror or e})"]
    short = _short_files(path, metadata)
    if short:
        return short
    byte_keys = [k for k, md in metadata.state_dict_metadata.items() if isinstance(md, BytesStorageMetadata)]
    if not byte_keys:
        return []
    try:
        dcp.load({k: None for k in byte_keys}, storage_reader=SafeFileSystemReader(path),
                 planner=SafeLoadPlanner(path, flatten_state_dict=False), no_dist=True)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - a refusal or a damaged item: not resumable
        err = unwrap_checkpoint_error(e)
        if isinstance(err, UnsafeCheckpointError):
            return [str(err)]
        return [f"{path}: a byte item does not load ({quoted(err)}); resume from an earlier global_step_N dir "
                f"(trainer.resume_from_path)"]
    return []


def _short_files(path: str, metadata: Metadata) -> list[str]:
    """Each data file of a DCP checkpoint that is missing or shorter than its items' extent in the metadata (a shard
    truncated after the step's checksums were rewritten), with both sizes; [] when every file holds its items."""
    needed: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        rel = getattr(info, "relative_path", None)
        if isinstance(rel, str):
            needed[rel] = max(needed.get(rel, 0), int(info.offset) + int(info.length))
    problems = []
    for rel, end in sorted(needed.items()):
        file = os.path.join(path, rel)
        try:
            size = os.path.getsize(file)
        except OSError as e:
            problems.append(f"{file}: missing or unreadable ({e.strerror or e}), though {METADATA} lists items in it; "
                            f"resume from an earlier global_step_N dir (trainer.resume_from_path)")
            continue
        if size < end:
            problems.append(f"{file} is truncated: {size} bytes, but {os.path.join(path, METADATA)} places its "
                            f"items up to byte {end}; resume from an earlier global_step_N dir "
                            f"(trainer.resume_from_path)")
    return problems


def check_meta_json(path: str) -> list[str]:
    import json

    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        return [f"{path} is unreadable ({quoted(e)}): not the JSON record rlx writes; resume from an earlier "
                f"global_step_N dir (trainer.resume_from_path)"]
    if not isinstance(meta, dict) or not isinstance(meta.get("contents"), list):
        return [f"{path} is not the record rlx writes (no list of contents); resume from an earlier global_step_N "
                f"dir (trainer.resume_from_path)"]
    return []


def _numpy_array_globals() -> list:
    """What an ndarray inside a checkpoint of the earlier format needs to be rebuilt: numpy's array constructor
    and dtypes. Data only: none of them can call anything else."""
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_extra(path: str) -> dict:
    """An `extra_rank{r}.pt` file, loaded with `weights_only=True`: tensors, dicts, lists and numbers only, so
    loading it never runs code. The earlier format (numpy's RNG state as an ndarray) loads too, numpy's array
    type being allowed as data. Anything else is an `UnsafeCheckpointError` naming the file; a file that is not
    a torch file at all is a `DamagedCheckpointError`."""
    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        if "weights_only" not in str(e) and "Unsupported global" not in str(e):
            raise DamagedCheckpointError(f"{path} is unreadable ({quoted(e)}); resume from an earlier "
                                         f"global_step_N dir (trainer.resume_from_path)") from None
        raise UnsafeCheckpointError(
            f"{path} holds a pickled object ({quoted(e)}) that would run code when loaded; rlx loads checkpoint "
            f"files with torch.load(weights_only=True) and refuses it. Nothing was loaded or trained. Fix: resume "
            f"from a checkpoint rlx wrote (trainer.resume_from_path=<an earlier global_step_N dir>), or start fresh "
            f"(trainer.resume_mode=disable)") from None
    except Exception as e:  # noqa: BLE001 - EOFError, RuntimeError: a truncated or damaged file
        raise DamagedCheckpointError(f"{path} is unreadable ({quoted(e)}); resume from an earlier "
                                     f"global_step_N dir (trainer.resume_from_path)") from None


def check_extra_files(step: str) -> list[str]:
    """The problems of every `extra_rank*.pt` under a step dir (its actor/ and critic/), each file loaded as
    resume loads it; [] when all load. The driver calls this before any worker starts."""
    problems = []
    for role in sorted(os.listdir(step)) if os.path.isdir(step) else []:
        role_dir = os.path.join(step, role)
        if not os.path.isdir(role_dir):
            continue
        for name in sorted(n for n in os.listdir(role_dir) if re.fullmatch(r"extra_rank\d+\.pt", n)):
            try:
                load_extra(os.path.join(role_dir, name))
            except ValueError as e:
                problems.append(str(e))
    return problems
