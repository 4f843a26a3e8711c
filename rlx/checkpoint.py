"""Checkpoints: sharded engine save/load (every rank) and the driver's bookkeeping (rank-agnostic). No Ray.

Layout under the root (`trainer.default_local_dir`)::

    global_step_N/actor/{model/, optim/, extra_rank{r}.pt, meta.json, huggingface/}
    global_step_N/critic/...
    global_step_N/driver_state.json
    global_step_N/COMPLETE                      written last, by the driver: the step is resumable; holds
                                                the size and sha256 of every other file of the step
    latest_checkpointed_iteration.txt           verl's pointer, written after COMPLETE

`model/` and `optim/` are torch distributed checkpoints (DCP) of the sharded state dicts that
`torch.distributed.checkpoint.state_dict` builds for FSDP1 and FSDP2 alike; they load back at any world size.
`extra_rank{r}.pt` holds the lr scheduler and the rank's RNG states. `huggingface/` (optional) is a plain HF
model directory (config, safetensors, tokenizer) for `from_pretrained` and vLLM.

Integrity: resume only starts from a step whose files all match the checksums in its COMPLETE marker
(`verify`); a step that does not (bytes overwritten, a truncated or unreadable file, a marker without
checksums) is reported by file and skipped for the newest earlier one that does, or stops the run
(`trainer.on_damaged_checkpoint`).

Safety: loading never runs code from a file and loads only whole checkpoints of the same model
(`rlx.checkpoint_safety`; `meta.json` records the model, `rlx.engine.architecture`); one run at a time writes a
root (`rlx.checkpoint_lock`). docs/faults.md has the whole story.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil

import numpy as np
import torch
import torch.distributed as dist

from rlx.checkpoint_errors import DamagedCheckpointError, UnsafeCheckpointError  # noqa: F401 (re-exported)
from rlx.config.schema import TrainerConfig

log = logging.getLogger("rlx")

CONTENTS = ("model", "optimizer", "extra")
COMPLETE = "COMPLETE"
LATEST = "latest_checkpointed_iteration.txt"
DRIVER_STATE = "driver_state.json"
HF_DIR = "huggingface"
ADAPTER_DIR = "lora_adapter"  # verl's folder name for a LoRA adapter in peft's layout
EXPORTS = ("hf_model", "lora_adapter")  # save_contents beyond CONTENTS: exports, never loaded back
_STEP_RE = re.compile(r"^global_step_(\d+)$")


# ---------------------------------------------------------------------------------------------- engine (all ranks)
def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _check_contents(contents, what: str) -> set:
    contents = set(contents)
    unknown = contents - set(CONTENTS) - set(EXPORTS)
    if unknown:
        raise ValueError(f"checkpoint {what}={sorted(contents)}: unknown {sorted(unknown)}; "
                         f"choose from {list(CONTENTS) + list(EXPORTS)}")
    return contents


def _rng_state() -> dict:
    """The rank's RNG states as tensors and plain numbers only, so that the file loads with
    `torch.load(..., weights_only=True)` (no pickled objects, nothing that runs code when loaded)."""
    version, words, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": {"version": version, "state": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
             "numpy": {"name": str(name), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    py, npy = state["python"], state["numpy"]
    if isinstance(py, dict):
        random.setstate((py["version"], tuple(int(w) for w in py["state"].tolist()), py["gauss"]))
        np.random.set_state((npy["name"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                             npy["cached_gaussian"]))
    else:  # the format before weights_only loading: Python's tuple and numpy's tuple with an ndarray
        random.setstate(py)
        np.random.set_state(npy)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
    import pickle

    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        if "weights_only" not in str(e) and "Unsupported global" not in str(e):
            raise DamagedCheckpointError(f"{path} is unreadable (UnpicklingError: {e}); resume from an earlier "
                                         f"global_step_N dir (trainer.resume_from_path)") from None
        found = re.search(r"(?:Unsupported global|GLOBAL):? ?(\S+)", str(e))
        raise UnsafeCheckpointError(
            f"{path} holds a pickled object ({found.group(1) if found else 'a global'}) that would run code when "
            f"loaded; rlx loads checkpoint files with torch.load(weights_only=True) and refuses it. Nothing was "
            f"loaded or trained. If you wrote this checkpoint yourself and trust it, re-save its extra state in "
            f"the safe format: python -m rlx.checkpoint resave-extra {os.path.dirname(os.path.dirname(path))}"
        ) from None
    except Exception as e:  # noqa: BLE001 - EOFError, RuntimeError: a truncated or damaged file
        raise DamagedCheckpointError(f"{path} is unreadable ({type(e).__name__}: {e}); resume from an earlier "
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


def _state_dict_options(engine):
    """With LoRA only the adapters are saved and loaded: the frozen base is the model path's, unchanged."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    lora = engine.lora is not None
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora)


def _save_model(engine, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    dcp.save(get_model_state_dict(engine.module, options=_state_dict_options(engine)),
             checkpoint_id=os.path.join(path, "model"))


def _save_optimizer(engine, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save(get_optimizer_state_dict(engine.module, engine.optimizer), checkpoint_id=os.path.join(path, "optim"))


def _save_extra(engine, path: str, rank: int) -> None:
    extra = {"rng": _rng_state(),
             "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None}
    _atomic_write(os.path.join(path, f"extra_rank{rank}.pt"), extra)


def save_engine(engine, path: str, contents=CONTENTS, hf_export: bool = False, tokenizer=None) -> None:
    """Save `engine` (an FSDPEngine) under `path`. Collective: call on every rank of the engine's group.

    contents: any of model | optimizer | extra (lr scheduler + RNG), plus verl's hf_model (= hf_export: with LoRA
    the merged model) and lora_adapter (the LoRA adapter alone, peft's layout, under lora_adapter/).
    With LoRA, `model` holds the adapters only (the frozen base is the model path's).
    A stale checkpoint at `path` (a crashed earlier save of the same step) is replaced.
    """
    contents = _check_contents(contents, "save_contents")
    hf_export = hf_export or "hf_model" in contents
    rank, world = _rank_world()
    if rank == 0:
        for name in os.listdir(path) if os.path.isdir(path) else []:
            if name in ("model", "optim", HF_DIR, ADAPTER_DIR, "meta.json") or name.startswith("extra_rank"):
                p = os.path.join(path, name)
                shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    _barrier()
    os.makedirs(path, exist_ok=True)
    saved = []
    with engine.phase(with_optimizer=engine.optimizer is not None):
        if "model" in contents:
            _save_model(engine, path)
            saved.append("model")
        if "optimizer" in contents and engine.optimizer is not None:
            _save_optimizer(engine, path)
            saved.append("optimizer")
        if "extra" in contents:
            _save_extra(engine, path, rank)
            saved.append("extra")
        if hf_export:  # merged base + adapters with LoRA: a plain HF model
            export_hf(engine.module, os.path.join(path, HF_DIR), tokenizer=tokenizer,
                      named=engine.policy_weights(to_cpu=True))
        if "lora_adapter" in contents:
            export_adapter(engine, os.path.join(path, ADAPTER_DIR))
    _barrier()  # every rank's files are written before rank 0 declares the engine part done
    if rank == 0:
        meta = {"role": engine.role, "world_size": world, "contents": saved, "torch": torch.__version__,
                "model": engine.architecture}
        _atomic_write(os.path.join(path, "meta.json"), json.dumps(meta, indent=1))
    _barrier()


def load_engine(engine, path: str, contents=CONTENTS) -> None:
    """Restore what `save_engine` wrote (model, optimizer, lr scheduler, RNG). Collective: every rank."""
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)

    from rlx.checkpoint_safety import load_whole  # nothing in the files runs; only whole checkpoints load
    from rlx.engine.base import MODEL_KEYS

    contents = _check_contents(contents, "load_contents") - set(EXPORTS)
    meta_path = os.path.join(path, "meta.json")
    if not os.path.exists(meta_path):
        raise FileNotFoundError(f"{path}: not a complete engine checkpoint (no meta.json)")
    with open(meta_path) as f:
        meta = json.load(f)
    if engine.optimizer is None:
        contents.discard("optimizer")
    missing = contents - set(meta["contents"])
    if missing:
        raise ValueError(f"{path} holds {meta['contents']} but load_contents asks for {sorted(missing)}; "
                         f"drop them from checkpoint.load_contents or resume from another checkpoint")
    rank, world = _rank_world()
    key = MODEL_KEYS.get(engine.role, "the role's model")
    fix = (f"resume with the model the checkpoint was saved from ({key}.path, override_config and LoRA keys as "
           f"then), or start fresh (trainer.resume_mode=disable)")
    with engine.phase(with_optimizer=engine.optimizer is not None):
        if "model" in contents:
            opts = _state_dict_options(engine)
            sd = get_model_state_dict(engine.module, options=opts)
            load_whole(sd, os.path.join(path, "model"), fix)
            set_model_state_dict(engine.module, sd, options=opts)
        if "optimizer" in contents:
            osd = get_optimizer_state_dict(engine.module, engine.optimizer)  # initialises empty Adam state
            # FSDP1 can leave a rank whose flat shard holds none of a small module's parameters (e.g. the
            # critic's score head): that rank has no state for them, which strict loading takes for a
            # missing key. Everything the rank does hold must still be in the checkpoint, and every saved key
            # must be loaded by some rank.
            load_whole(osd, os.path.join(path, "optim"), fix, partial=True)
            set_optimizer_state_dict(engine.module, engine.optimizer, osd)
    if "extra" in contents:
        own = os.path.join(path, f"extra_rank{rank}.pt")
        same_world = meta["world_size"] == world and os.path.exists(own)
        if not same_world:
            log.warning("%s was saved by %d ranks, loading on %d: RNG states are not restored",
                        path, meta["world_size"], world)
        extra_path = own if same_world else os.path.join(path, "extra_rank0.pt")
        extra = load_extra(extra_path)
        if extra["lr_scheduler"] is not None and engine.lr_scheduler is not None:
            engine.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        if same_world:
            _set_rng_state(extra["rng"])
    _barrier()


# ---------------------------------------------------------------------------------------------- HF export
def _unwrap_hf(module):
    from transformers import PreTrainedModel

    inner = getattr(module, "_fsdp_wrapped_module", module)  # FSDP1 root
    inner = getattr(inner, "_checkpoint_wrapped_module", inner)
    cls = next(c for c in type(inner).__mro__ if issubclass(c, PreTrainedModel)
               and not c.__name__.startswith("FSDP"))  # FSDP2 prepends a dynamic FSDP<cls> subclass
    return inner, cls


def _persistent_buffers(module):
    from rlx.engine.weights import clean_param_name

    for mod_name, mod in module.named_modules():
        for name, buf in mod._buffers.items():
            if buf is not None and name not in mod._non_persistent_buffers_set:
                yield clean_param_name(f"{mod_name}.{name}" if mod_name else name), buf


def export_adapter(engine, out_dir: str) -> None:
    """Write the engine's LoRA adapter alone (peft's adapter_config.json + adapter_model.safetensors), loadable
    with `PeftModel.from_pretrained(base, out_dir)`. Collective; rank 0 writes."""
    from rlx.engine.lora import adapter_params, save_adapter
    from rlx.engine.weights import iter_full_params

    if engine.lora is None:
        raise ValueError("checkpoint save_contents has lora_adapter but the model has no LoRA adapters; set "
                         "model.lora_rank > 0 or drop lora_adapter from save_contents")
    rank, _ = _rank_world()
    tensors = {k: v.clone() for k, v in adapter_params(iter_full_params(engine.module, to_cpu=True))}
    if rank == 0:
        hf, _ = _unwrap_hf(engine.module)
        tmp = out_dir.rstrip("/") + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        save_adapter(engine.lora, tensors, tmp, base_model_path=getattr(hf.config, "_name_or_path", None))
        _make_readable(tmp)
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(tmp, out_dir)
    _barrier()


def export_hf(module, out_dir: str, tokenizer=None, dtype: torch.dtype | None = None,
              max_shard_bytes: int = 5 * 2**30, named=None) -> None:
    """Write an HF model dir (config, safetensors shards + index, tokenizer) from an FSDP1/FSDP2/plain module.

    Collective: all ranks gather (one parameter at a time for FSDP2), rank 0 keeps CPU copies and writes.
    Without `tokenizer`, the tokenizer/generation files of the model's source directory are copied. `named`
    replaces the module's own `(hf_name, full tensor)` iterator (the engine's merged LoRA weights).
    """
    import copy

    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    from rlx.engine.weights import iter_full_params

    rank, _ = _rank_world()
    sd = {}
    if named is None:
        named = iter_full_params(module, to_cpu=True, dtype=dtype)
    for name, t in named:
        if rank == 0:
            sd[name] = t.clone().contiguous()
    if rank == 0:
        hf, cls = _unwrap_hf(module)
        for name, buf in _persistent_buffers(hf):
            sd.setdefault(name, buf.detach().cpu().clone())
        tmp = out_dir.rstrip("/") + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        config = copy.deepcopy(hf.config)
        config.architectures = [cls.__name__]
        config.use_cache = True
        first = next((t for t in sd.values() if t.is_floating_point()), None)
        if first is not None:
            config.dtype = first.dtype
        config.save_pretrained(tmp)
        split = split_torch_state_dict_into_shards(sd, max_shard_size=max_shard_bytes)
        for fname, names in split.filename_to_tensors.items():
            save_file({n: sd[n] for n in names}, os.path.join(tmp, fname), metadata={"format": "pt"})
        if split.is_sharded:
            index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
            _atomic_write(os.path.join(tmp, "model.safetensors.index.json"), json.dumps(index, indent=1))
        src = getattr(config, "_name_or_path", "") or ""
        if os.path.isdir(src):
            for fname in os.listdir(src):
                if fname == "generation_config.json" or (tokenizer is None and _is_tokenizer_file(fname)):
                    shutil.copy2(os.path.join(src, fname), os.path.join(tmp, fname))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        _make_readable(tmp)
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(tmp, out_dir)
    _barrier()


def _make_readable(directory: str) -> None:
    """Give every file the mode a plain `open` would (0644 under the usual umask): safetensors writes 0600,
    and an export is meant to be read by other users and services (vLLM servers, evaluation jobs)."""
    umask = os.umask(0)
    os.umask(umask)
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            os.chmod(path, 0o666 & ~umask)


def _is_tokenizer_file(fname: str) -> bool:
    return fname.startswith("tokenizer") or fname in ("special_tokens_map.json", "vocab.json", "merges.txt",
                                                      "added_tokens.json", "chat_template.jinja",
                                                      "chat_template.json")


# ---------------------------------------------------------------------------------------------- driver side
def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{int(step)}")


def _atomic_write(path: str, data) -> None:
    """Write `data` (str, or any object for torch.save) to a temp file, fsync, then rename over `path`."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w" if isinstance(data, str) else "wb") as f:
        f.write(data) if isinstance(data, str) else torch.save(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_latest(root: str, step: int) -> None:
    """Point verl's `latest_checkpointed_iteration.txt` at `step` (after the step's COMPLETE marker)."""
    os.makedirs(root, exist_ok=True)
    _atomic_write(os.path.join(root, LATEST), str(int(step)))


MANIFEST_FORMAT = "rlx-checkpoint-manifest/1"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)  # hashlib drops the GIL on large buffers: the thread pool hashes files in parallel
    return h.hexdigest()


def _files(directory: str) -> list[str]:
    """Every file of a step dir (relative paths), the marker itself and temp files of atomic writes excluded."""
    out = []
    for dirpath, _, names in os.walk(directory):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), directory)
            if rel != COMPLETE and ".tmp." not in name:
                out.append(rel)
    return sorted(out)


def _hash_all(directory: str, rels: list[str]) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        digests = pool.map(lambda rel: _sha256(os.path.join(directory, rel)), rels)
        return dict(zip(rels, digests))


def mark_complete(directory: str) -> None:
    """Declare a step's checkpoint resumable: call last, after every engine part and the driver state.

    The marker records the size and sha256 of every file of the step, so that resume can tell a damaged
    checkpoint from a good one (`verify`)."""
    rels = _files(directory)
    digests = _hash_all(directory, rels)
    files = {rel: {"size": os.path.getsize(os.path.join(directory, rel)), "sha256": digests[rel]} for rel in rels}
    _atomic_write(os.path.join(directory, COMPLETE), json.dumps({"format": MANIFEST_FORMAT, "files": files},
                                                                indent=1))


def is_complete(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, COMPLETE))


def verify(directory: str) -> list[str]:
    """Check a complete step against its COMPLETE manifest; returns the problems (file and what is wrong), or [].

    Sizes are checked first (a truncated file costs no hashing), then every checksum."""
    try:
        with open(os.path.join(directory, COMPLETE)) as f:
            manifest = json.load(f)
        files = manifest["files"] if manifest.get("format") == MANIFEST_FORMAT else None
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        files = None
    if not isinstance(files, dict):
        return [f"{COMPLETE}: holds no checksums (a marker from an older rlx, or damaged), so the checkpoint "
                f"cannot be verified"]
    problems, to_hash = [], []
    for rel, entry in sorted(files.items()):
        path = os.path.join(directory, rel)
        try:
            size = os.path.getsize(path)
        except OSError as e:
            problems.append(f"{rel}: missing or unreadable ({e.strerror or e})")
            continue
        if size != entry["size"]:
            problems.append(f"{rel}: {size} bytes, {entry['size']} when saved (truncated or rewritten)")
        else:
            to_hash.append(rel)
    try:
        digests = _hash_all(directory, to_hash)
    except OSError as e:
        return problems + [f"{os.path.relpath(e.filename, directory) if e.filename else '?'}: unreadable "
                           f"({e.strerror or e})"]
    problems += [f"{rel}: contents differ from the checksum recorded when it was saved (overwritten or corrupted)"
                 for rel in to_hash if digests[rel] != files[rel]["sha256"]]
    return problems


def list_steps(root: str, complete_only: bool = True) -> list[int]:
    """Steps with a `global_step_N` dir under `root` (only complete ones by default), ascending."""
    if not os.path.isdir(root):
        return []
    steps = [int(m.group(1)) for m in map(_STEP_RE.match, os.listdir(root)) if m]
    return sorted(s for s in steps if not complete_only or is_complete(step_dir(root, s)))


def _damage_report(directory: str, problems: list[str]) -> str:
    shown = problems[:5] + ([f"... and {len(problems) - 5} more"] if len(problems) > 5 else [])
    return f"checkpoint {directory} is damaged:\n    " + "\n    ".join(shown)


def find_resume_dir(trainer_cfg: TrainerConfig) -> str | None:
    """The verified step dir to resume from per `trainer.resume_mode`, or None to start fresh.

    auto: the newest complete step under `trainer.default_local_dir` whose files match their checksums (the
    latest pointer is only trusted as far as it names such a dir; incomplete dirs from crashed saves are
    ignored). A damaged step is reported by file; with `trainer.on_damaged_checkpoint=previous` the newest
    earlier one that verifies is taken, with `error` (or when none verifies) a `DamagedCheckpointError` stops
    the run. disable: None. resume_path: `trainer.resume_from_path`, a complete step dir that verifies.
    """
    mode = trainer_cfg.resume_mode
    if mode == "disable":
        return None
    if mode == "auto":
        root = trainer_cfg.default_local_dir
        damaged = []
        for step in reversed(list_steps(root)):
            d = step_dir(root, step)
            problems = verify(d)
            if not problems:
                if damaged:
                    log.warning("%s\n  resuming from the previous complete checkpoint %s instead "
                                "(trainer.on_damaged_checkpoint=previous)", "\n".join(damaged), d)
                return d
            damaged.append(_damage_report(d, problems))
            if trainer_cfg.on_damaged_checkpoint == "error":
                raise DamagedCheckpointError(
                    f"{damaged[-1]}\n  Fix: restore it, or resume from an earlier step with "
                    f"trainer.resume_mode=resume_path trainer.resume_from_path=<global_step_N dir>, or set "
                    f"trainer.on_damaged_checkpoint=previous")
        if damaged:
            raise DamagedCheckpointError(
                "\n".join(damaged) + f"\n  No checkpoint under {root} verifies, so there is nothing to resume "
                f"from. Fix: restore one, or start fresh with trainer.resume_mode=disable (or another "
                f"trainer.default_local_dir)")
        return None
    if mode == "resume_path":
        path = trainer_cfg.resume_from_path
        if not path or not os.path.isdir(path):
            raise ValueError(f"trainer.resume_from_path={path!r} does not exist (trainer.resume_mode=resume_path); "
                             f"give a global_step_N checkpoint dir or set trainer.resume_mode=auto")
        if not is_complete(path):
            raise ValueError(f"trainer.resume_from_path={path!r} is not a complete checkpoint (no {COMPLETE} "
                             f"marker: its save did not finish); give a global_step_N dir that has one")
        problems = verify(path)
        if problems:
            raise DamagedCheckpointError(f"trainer.resume_from_path: {_damage_report(path, problems)}\n  Fix: "
                                         f"give an earlier global_step_N dir, or trainer.resume_mode=auto")
        return path
    raise ValueError(f"trainer.resume_mode={mode!r}: choose auto | disable | resume_path")


def _json_dtype(name, numpy: bool):
    """A dtype named in the driver state: a torch or numpy number type, nothing else (an object dtype or any other
    attribute of torch is refused as damage)."""
    if numpy:
        dtype = np.dtype(name) if isinstance(name, str) else None
        if dtype is None or dtype.kind not in "biufc":
            raise ValueError(f"dtype {name!r} is not a numpy number type")
        return dtype
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype {name!r} is not a torch dtype")
    return dtype


_JSON_TAGS = {"__tensor__": lambda v, d: torch.tensor(v, dtype=_json_dtype(d, numpy=False)),
              "__ndarray__": lambda v, d: np.asarray(v, dtype=_json_dtype(d, numpy=True))}


def _to_json(x):
    if isinstance(x, (torch.Tensor, np.ndarray)):
        tag = "__tensor__" if isinstance(x, torch.Tensor) else "__ndarray__"
        return {tag: x.tolist(), "dtype": str(x.dtype).replace("torch.", "")}
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (tuple, list)):
        items = [_to_json(v) for v in x]
        return {"__tuple__": items} if isinstance(x, tuple) else items
    if isinstance(x, dict):
        return {str(k): _to_json(v) for k, v in x.items()}
    return x


def _from_json(x):
    if isinstance(x, list):
        return [_from_json(v) for v in x]
    if not isinstance(x, dict):
        return x
    for tag, build in _JSON_TAGS.items():
        if tag in x:
            return build(x[tag], x["dtype"])
    if "__tuple__" in x:
        return tuple(_from_json(v) for v in x["__tuple__"])
    return {k: _from_json(v) for k, v in x.items()}


def save_driver_state(directory: str, state: dict) -> None:
    """JSON (atomic) of the driver's state: global_step, dataloader state, kl controller value, ...
    Tensors, numpy arrays and tuples survive the round trip."""
    os.makedirs(directory, exist_ok=True)
    _atomic_write(os.path.join(directory, DRIVER_STATE), json.dumps(_to_json(state), indent=1))


def load_driver_state(directory: str) -> dict:
    path = os.path.join(directory, DRIVER_STATE)
    try:
        with open(path) as f:
            return _from_json(json.load(f))
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise DamagedCheckpointError(f"{path} is unreadable ({type(e).__name__}: {e}); resume from the previous "
                                     f"step: trainer.resume_mode=resume_path trainer.resume_from_path=<an "
                                     f"earlier global_step_N dir>") from None


def rotate(root: str, keep: int | None, subdir: str) -> list[str]:
    """Keep `subdir` (actor | critic) of the newest `keep` steps that have it; remove it from older steps.

    A step that loses a part is no longer resumable: its COMPLETE marker goes first, and the whole step dir
    once neither actor nor critic is left. Incomplete steps newer than the newest complete one are left
    alone. keep None or <= 0: keep everything. Returns the removed paths.
    """
    if subdir not in ("actor", "critic"):
        raise ValueError(f"rotate: subdir={subdir!r}, expected actor | critic")
    if not keep or keep <= 0:
        return []
    complete = list_steps(root)
    if not complete:
        return []
    having = [s for s in list_steps(root, complete_only=False)
              if s <= complete[-1] and os.path.isdir(os.path.join(step_dir(root, s), subdir))]
    if len(having) <= keep:
        return []
    cutoff = having[-keep]
    removed = []
    for step in list_steps(root, complete_only=False):
        d = step_dir(root, step)
        if step >= cutoff or not os.path.isdir(os.path.join(d, subdir)):
            continue
        if is_complete(d):
            os.remove(os.path.join(d, COMPLETE))
        shutil.rmtree(os.path.join(d, subdir))
        removed.append(os.path.join(d, subdir))
        if not any(os.path.isdir(os.path.join(d, s)) for s in ("actor", "critic")):
            shutil.rmtree(d)
    return removed


# ---------------------------------------------------------------------------------------------- re-save (by hand)
def resave_extra(step: str) -> list[str]:
    """Rewrite every `extra_rank*.pt` of a step dir in the weights-only format, loading the old files with
    `weights_only=False`: THIS RUNS WHATEVER CODE THE FILES HOLD, so it is only ever called by a user on a
    checkpoint they wrote themselves (`python -m rlx.checkpoint resave-extra <global_step_N dir>`), never by
    training. The step's COMPLETE manifest is rewritten with the new checksums. Returns the files rewritten."""
    done = []
    for role in sorted(os.listdir(step)):
        role_dir = os.path.join(step, role)
        if not os.path.isdir(role_dir):
            continue
        for name in sorted(n for n in os.listdir(role_dir) if re.fullmatch(r"extra_rank\d+\.pt", n)):
            path = os.path.join(role_dir, name)
            old = torch.load(path, weights_only=False, map_location="cpu")  # the user vouched for this file
            rng = old.get("rng") or {}
            saved = random.getstate(), np.random.get_state()
            try:  # convert through the RNGs themselves, so the new format is exactly what _rng_state writes
                if isinstance(rng.get("python"), tuple):
                    random.setstate(rng["python"])
                if isinstance(rng.get("numpy"), tuple):
                    np.random.set_state(rng["numpy"])
                new_rng = {**_rng_state(), "torch": rng.get("torch", torch.get_rng_state())}
                if "cuda" in rng:
                    new_rng["cuda"] = rng["cuda"]
                else:
                    new_rng.pop("cuda", None)
            finally:
                random.setstate(saved[0])
                np.random.set_state(saved[1])
            _atomic_write(path, {"rng": new_rng, "lr_scheduler": old.get("lr_scheduler")})
            load_extra(path)  # the new file must load the safe way
            done.append(path)
    if done and is_complete(step):
        mark_complete(step)
    return done


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "resave-extra":
        print("usage: python -m rlx.checkpoint resave-extra <global_step_N dir>\n  Rewrites the step's "
              "extra_rank*.pt files so that they load with torch.load(weights_only=True). It loads the old files "
              "the unsafe way: run it only on a checkpoint you wrote yourself.", file=sys.stderr)
        sys.exit(2)
    for p in resave_extra(sys.argv[2]):
        print(f"re-saved {p}")


def check_resume_files(step: str) -> list[str]:
    """The problems of every file of a step dir that resume reads, each read as resume reads it (nothing in them
    runs); [] when all load. The driver calls this before any worker starts."""
    from rlx.checkpoint_safety import _check_meta_json, check_dcp_dir

    problems = []
    try:
        load_driver_state(step)
    except ValueError as e:
        problems.append(str(e))
    for role in sorted(os.listdir(step)):
        role_dir = os.path.join(step, role)
        if not os.path.isdir(role_dir):
            continue
        if os.path.exists(os.path.join(role_dir, "meta.json")):
            problems += _check_meta_json(os.path.join(role_dir, "meta.json"))
        for part in ("model", "optim"):
            if os.path.isdir(os.path.join(role_dir, part)):
                problems += check_dcp_dir(os.path.join(role_dir, part))
    return problems + check_extra_files(step)
