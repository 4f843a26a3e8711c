"""An engine's part of a checkpoint, saved and loaded by every rank of its group (the workers' side; no Ray).

Under a step's role folder (`global_step_N/actor/`, `.../critic/`)::

    model/  optim/          torch distributed checkpoints (DCP) of the sharded state dicts that
                            `torch.distributed.checkpoint.state_dict` builds for FSDP1 and FSDP2 alike; they load back
                            at any world size
    extra_rank{r}.pt        the lr scheduler and the rank's RNG states (tensors and numbers only)
    meta.json               written last, by rank 0: the role, world size, contents and the model's record
                            (`rlx.engine.architecture`)
    huggingface/  lora_adapter/     exports (`rlx.checkpoint.export`), never loaded back

Loading never runs code from a file and loads only whole checkpoints of the same model (`rlx.checkpoint.safety`).
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil

import numpy as np
import torch

from rlx.checkpoint.export import export_adapter, export_hf
from rlx.checkpoint.files import atomic_write, barrier, rank_world
from rlx.checkpoint.safety import load_extra, load_whole
from rlx.checkpoint.store import is_complete, mark_complete

log = logging.getLogger("rlx")

CONTENTS = ("model", "optimizer", "extra")
HF_DIR = "huggingface"
ADAPTER_DIR = "lora_adapter"  # verl's folder name for a LoRA adapter in peft's layout
EXPORTS = ("hf_model", "lora_adapter")  # save_contents beyond CONTENTS: exports, never loaded back


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
    np_state = np.random.get_state()
    assert isinstance(np_state, tuple)  # legacy=True (the default): numpy's 5-tuple, not its dict
    name, keys, pos, has_gauss, cached = np_state
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
    atomic_write(os.path.join(path, f"extra_rank{rank}.pt"), extra)


def save_engine(engine, path: str, contents=CONTENTS, hf_export: bool = False, tokenizer=None) -> None:
    """Save `engine` (an FSDPEngine) under `path`. Collective: call on every rank of the engine's group.

    contents: any of model | optimizer | extra (lr scheduler + RNG), plus verl's hf_model (= hf_export: with LoRA
    the merged model) and lora_adapter (the LoRA adapter alone, peft's layout, under lora_adapter/).
    With LoRA, `model` holds the adapters only (the frozen base is the model path's).
    A stale checkpoint at `path` (a crashed earlier save of the same step) is replaced.
    """
    contents = _check_contents(contents, "save_contents")
    hf_export = hf_export or "hf_model" in contents
    rank, world = rank_world()
    if rank == 0:
        for name in os.listdir(path) if os.path.isdir(path) else []:
            if name in ("model", "optim", HF_DIR, ADAPTER_DIR, "meta.json") or name.startswith("extra_rank"):
                p = os.path.join(path, name)
                shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    barrier()
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
    barrier()  # every rank's files are written before rank 0 declares the engine part done
    if rank == 0:
        meta = {"role": engine.role, "world_size": world, "contents": saved, "torch": torch.__version__,
                "model": engine.architecture}
        atomic_write(os.path.join(path, "meta.json"), json.dumps(meta, indent=1))
    barrier()


def load_engine(engine, path: str, contents=CONTENTS) -> None:
    """Restore what `save_engine` wrote (model, optimizer, lr scheduler, RNG). Collective: every rank."""
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)

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
    rank, world = rank_world()
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
            # critic's score head): that rank has no state for them and loads a part of the saved keys.
            # Everything the rank does hold must be in the checkpoint, and every saved key is loaded by some rank.
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
    barrier()


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
            atomic_write(path, {"rng": new_rng, "lr_scheduler": old.get("lr_scheduler")})
            load_extra(path)  # the new file must load the safe way
            done.append(path)
    if done and is_complete(step):
        mark_complete(step)
    return done

