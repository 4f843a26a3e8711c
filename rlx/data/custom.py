"""The dataset a job reads: rlx's `RLDataset`, or a class of your own from a Python file (`data.custom_cls`).

rlx's dataset interface (what the trainer uses of a dataset; `RLDataset` is the reference implementation)::

    cls(data_files, tokenizer, config)   data_files: list[str] (data.train_files or data.val_files), tokenizer: the
                                         job's HF tokenizer (custom_chat_template applied), config: the `data`
                                         section (rlx.config.schema.DataConfig)
    len(ds)                              number of prompts
    ds[i] -> dict                        one prompt: input_ids (list[int], at most data.max_prompt_length),
                                         data_source (str: picks the reward function), ground_truth, extra_info
                                         (dict), raw_prompt (str), index (int); optionally raw_chat
    ds.collate(items) -> Batch           left-padded to data.max_prompt_length: tensors input_ids,
                                         attention_mask, position_ids; non-tensors data_source, ground_truth,
                                         extra_info, raw_prompt, index (`rlx.data.dataset.collate_prompts` does it)
    ds.data_sources() -> set[str]        the distinct data_source values (checked against the reward functions)

Subclassing `RLDataset` gives all of it; override `read_rows(path)` to read another file format into verl's rows.
Loading a class from a file runs that file's code in the driver, by design (as verl's data.custom_cls): point it only
at code you trust.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Optional

from rlx import verl_names
from rlx.config.schema import DataConfig
from rlx.data.dataset import NON_TENSOR_KEYS, RLDataset
from rlx.protocol import Batch

ITEM_KEYS = ("input_ids", *NON_TENSOR_KEYS)
METHODS = ("__len__", "__getitem__", "collate", "data_sources")
BATCH_TENSORS = ("input_ids", "attention_mask", "position_ids")


def dataset_class(cfg: DataConfig) -> type:
    """`data.custom_cls.name` from the file `data.custom_cls.path`, or `RLDataset` when no path is set. A file or
    class that is missing, or a class without the interface's methods, is a ValueError naming the key."""
    path, name = (cfg.custom_cls or {}).get("path"), (cfg.custom_cls or {}).get("name")
    if not path:
        return RLDataset
    where = f"data.custom_cls.path={path!r}"
    file = os.path.expanduser(str(path))
    if not os.path.isfile(file):
        raise ValueError(f"{where} is not a file. Fix: give the Python file that defines the dataset class "
                         f"data.custom_cls.name={name!r}.")
    spec = importlib.util.spec_from_file_location(f"rlx_custom_dataset_{abs(hash(os.path.abspath(file)))}", file)
    if spec is None or spec.loader is None:
        raise ValueError(f"{where} is not a Python source file. Fix: give a .py file.")
    module = importlib.util.module_from_spec(spec)
    verl_names.install()  # a class written for verl imports its names: rlx serves them when verl is not installed
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - any failure while importing the user's file
        line = verl_names.refusal_of(e)
        if line:
            raise ValueError(f"{where} failed to import: {line}") from e
        raise ValueError(f"{where} failed to import ({type(e).__name__}: {e}). Fix: make the file import on its "
                         f"own (python <the file> shows the error).") from e
    cls = getattr(module, str(name), None)
    if not isinstance(cls, type):
        found = sorted(k for k, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__)
        what = "is not defined" if cls is None else f"is a {type(cls).__name__}, not a class"
        raise ValueError(f"data.custom_cls.name={name!r} {what} in {where}. Fix: name one of the classes "
                         f"defined there: {found}.")
    missing = [m for m in METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(f"data.custom_cls {name} (from {path!r}) lacks {missing} of rlx's dataset interface "
                         f"({', '.join(METHODS)}). Fix: subclass rlx.data.dataset.RLDataset, which has them all "
                         f"(see docs/data.md).")
    return cls


def build_dataset(files, tokenizer, cfg: DataConfig, tool_schemas: Optional[list[dict]] = None):
    """The dataset of `files` with the class `dataset_class(cfg)` picks; a custom class is built as
    `cls(files, tokenizer, cfg)` and its first prompt collated, so a class that does not fit rlx's interface fails
    here (a ValueError naming data.custom_cls) instead of in the training loop. `tool_schemas`: multi_turn's tools,
    rendered into rlx's own dataset's prompts (a custom class renders its prompts itself)."""
    cls = dataset_class(cfg)
    if cls is RLDataset:
        return RLDataset(files, tokenizer, cfg, tool_schemas=tool_schemas)
    key = f"data.custom_cls {cls.__name__} (from {cfg.custom_cls['path']!r})"
    file_list = [str(files)] if isinstance(files, (str, os.PathLike)) else [str(f) for f in files or []]
    try:
        ds = cls(file_list, tokenizer, cfg)
    except ValueError:  # the dataset's own report of a bad file or row
        raise
    except Exception as e:  # noqa: BLE001 - a constructor that does not take rlx's arguments, or fails on them
        raise ValueError(f"{key}: cls(data_files, tokenizer, config) failed ({type(e).__name__}: {e}). Fix: a "
                         f"constructor that takes the data files, the tokenizer and the data config section, as rlx "
                         f"builds a dataset.") from e
    _check_fits(ds, cfg, key)
    return ds


def _check_fits(ds, cfg: DataConfig, key: str) -> None:
    try:
        n = len(ds)
        item = ds[0] if n > 0 else None
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{key}: len(ds) / ds[0] failed ({type(e).__name__}: {e}). Fix: the class's __len__ and "
                         f"__getitem__ (rlx.data.dataset.RLDataset's are the model).") from e
    if not n:
        raise ValueError(f"{key} holds no prompts for files {cfg.train_files!r} / {cfg.val_files!r}. Fix: check the "
                         f"files, or how the class reads them.")
    if not isinstance(item, dict) or [k for k in ITEM_KEYS if k not in item]:
        have = sorted(item) if isinstance(item, dict) else type(item).__name__
        raise ValueError(f"{key}: ds[0] must be a dict with keys {list(ITEM_KEYS)}; got {have}. Fix: return those "
                         f"keys from __getitem__ (as rlx.data.dataset.RLDataset does).")
    ids = item["input_ids"]
    if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) for t in ids):
        raise ValueError(f"{key}: ds[0]['input_ids'] must be a list of token ids (int); got {type(ids).__name__}. "
                         f"Fix: return the prompt's token ids as a list of int.")
    if len(ids) > cfg.max_prompt_length:
        raise ValueError(f"{key}: ds[0] has {len(ids)} prompt tokens > data.max_prompt_length="
                         f"{cfg.max_prompt_length}. Fix: truncate or filter in the dataset, or raise "
                         f"data.max_prompt_length.")
    try:
        batch = ds.collate([item])
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{key}: collate([ds[0]]) failed ({type(e).__name__}: {e}). Fix: collate with "
                         f"rlx.data.dataset.collate_prompts.") from e
    is_batch = isinstance(batch, Batch)
    shapes = {k: tuple(batch.tensors[k].shape) for k in BATCH_TENSORS if k in batch.tensors} if is_batch else {}
    if not is_batch or any(shapes.get(k) != (1, cfg.max_prompt_length) for k in BATCH_TENSORS) \
            or any(k not in batch.non_tensors for k in NON_TENSOR_KEYS):
        raise ValueError(f"{key}: collate([ds[0]]) must return an rlx.protocol.Batch with tensors {list(BATCH_TENSORS)}"
                         f" of shape [1, data.max_prompt_length={cfg.max_prompt_length}] (left-padded) and non-tensors "
                         f"{list(NON_TENSOR_KEYS)}; got tensors {shapes}. Fix: collate with "
                         f"rlx.data.dataset.collate_prompts, which does it.")
