"""Prompt datasets in verl's parquet row format, their collation into left-padded Batches, and a resumable loader.

Row format (one row per prompt)::

    data_source   str                      picks the reward function (the column `data.reward_fn_key` names;
                                           stored as the batch's `data_source` whatever the column)
    prompt        list of chat messages    [{"role": "user", "content": "..."}]   (`data.prompt_key`)
    ability       str                      (unused here)
    reward_model  {"style": "rule", "ground_truth": ...}
    extra_info    dict                     passed to the reward function (and `tools_kwargs` to the tools)
    agent_name    str, optional            the agent loop of the row (rollout.mode=async), e.g. tool_agent

A "file" may also be ``synthetic://<task>?size=N&seed=S`` (see :mod:`rlx.data.synthetic`).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Optional, Sequence

import numpy as np
import torch

from rlx.config.schema import DataConfig
from rlx.data import synthetic
from rlx.protocol import Batch

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right", "middle")
NON_TENSOR_KEYS = ("data_source", "ground_truth", "extra_info", "raw_prompt", "index", "agent_name")


def _as_list(files) -> list[str]:
    if files is None:
        return []
    if isinstance(files, (str, os.PathLike)):
        return [str(files)]
    return [str(f) for f in files]


def _plain(value):
    """parquet round-trips lists as numpy arrays; turn them (recursively) back into plain Python."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _check_ground_truth(truth, origin: str, row: int) -> None:
    """A row's reward_model.ground_truth holds no bytes (alone or in a list): a rule would compare the response
    against their repr ("b'3'") and score every response 0, silently."""
    values = truth if isinstance(truth, (list, tuple)) else [truth]
    bad = next((v for v in values if isinstance(v, (bytes, bytearray))), None)
    if bad is not None:
        raise ValueError(f"data file {origin!r}, row {row}: reward_model.ground_truth holds {type(bad).__name__} "
                         f"({bad!r:.80}), not text; the reward would compare each response with its repr. Fix: write "
                         f"each ground_truth as a string (bytes decoded, e.g. as UTF-8, when the file is made).")


def _shm_copy(path: str) -> str:
    from rlx.models.shm import copy_to_shm

    if not os.path.exists(os.path.expanduser(path)):
        return path  # _read_parquet names the missing file
    return copy_to_shm(path, key="data.use_shm")


def missing_data_files(cfg) -> list[str]:
    """One problem per file of `data.train_files` / `data.val_files` (`cfg`: the data section) that is not there,
    checked without reading any: what the preflight can still say when there is no tokenizer to read them with."""
    problems = []
    for key, files in (("data.train_files", cfg.train_files), ("data.val_files", cfg.val_files)):
        for path in _as_list(files):
            if not synthetic.is_synthetic(path) and not os.path.exists(os.path.expanduser(path)):
                problems.append(f"{key}: data file {path!r} does not exist. Fix: set {key} to existing parquet "
                                f"files (e.g. made by scripts/prepare_gsm8k.py) or a 'synthetic://digits' source.")
    return problems


def _read_parquet(path: str, required: Sequence[str]) -> list[dict]:
    import pyarrow.parquet as pq

    if not os.path.exists(path):
        raise ValueError(f"data file {path!r} does not exist. Fix: set data.train_files / data.val_files to existing "
                         f"parquet files (e.g. made by scripts/prepare_gsm8k.py) or a 'synthetic://digits' source.")
    if os.path.isdir(path):
        raise ValueError(f"data file {path!r} is a directory. Fix: give the parquet file(s) inside it.")
    try:
        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - any reader failure is a bad file
        raise ValueError(f"data file {path!r} is not a readable parquet file ({type(e).__name__}: {e}). "
                         f"Fix: regenerate it (e.g. with scripts/prepare_gsm8k.py).") from e
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise ValueError(f"data file {path!r} lacks column(s) {missing} (has {table.column_names}). Fix: write the "
                         f"rows in verl's format (data_source, prompt, reward_model={{'ground_truth': ...}}, "
                         f"extra_info), or point data.prompt_key / data.reward_fn_key at the right columns.")
    if table.num_rows == 0:
        raise ValueError(f"data file {path!r} has no rows. Fix: regenerate it, or remove it from the data files.")
    try:
        return table.to_pylist()
    except UnicodeDecodeError as e:  # a string column holding bytes that are not UTF-8 (parquet's strings must be)
        raise ValueError(_decode_error(path, table, e)) from None


def _decode_error(path: str, table, error: UnicodeDecodeError) -> str:
    """The file, column and row of the first value that is not valid UTF-8 (read column by column, then row by
    row: only on this error path)."""
    where = "a column"
    for name in table.column_names:
        column = table.column(name)
        try:
            column.to_pylist()
            continue
        except UnicodeDecodeError as e:
            error, where = e, f"column {name!r}"
        row = 0
        for chunk in column.chunks:
            for value in chunk:
                try:
                    value.as_py()
                except UnicodeDecodeError as e:
                    error, where = e, f"column {name!r}, row {row}"
                    break
                row += 1
            else:
                continue
            break
        break
    bad = error.object[error.start:error.start + 8]
    return (f"data file {path!r}, {where}: text that is not valid UTF-8 ({error.reason}: byte {error.start} of the "
            f"value, {bad!r}). Fix: write the file's strings as UTF-8 (decode the source text with its own encoding, "
            f"e.g. latin-1, when making the file), or drop that row.")


class RLDataset:
    """Prompts tokenized once at construction; ``ds[i]`` is a dict ready for :func:`collate_prompts`.

    `cfg` is the `data` section (`rlx.config.schema.DataConfig`)."""

    def __init__(self, files, tokenizer, cfg: DataConfig, tool_schemas: Optional[list[dict]] = None):
        self.files = _as_list(files)
        # the OpenAI function schemas of multi_turn's tools: the chat template renders them into every prompt, as
        # the tool agent does at rollout, so a prompt's length (and filter_overlong_prompts) counts them
        self.tool_schemas = list(tool_schemas) if tool_schemas else None
        if not self.files:
            raise ValueError("no data files given. Fix: set data.train_files / data.val_files "
                             "(parquet paths or e.g. 'synthetic://digits/size:1024/seed:0').")
        self.tokenizer = tokenizer
        self.prompt_key = cfg.prompt_key
        self.reward_fn_key = cfg.reward_fn_key
        self.max_prompt_length = int(cfg.max_prompt_length)
        self.truncation = cfg.truncation
        self.filter_overlong_prompts = bool(cfg.filter_overlong_prompts)
        self.apply_chat_template = bool(cfg.apply_chat_template)
        self.chat_template_kwargs = dict(cfg.apply_chat_template_kwargs or {})
        self.return_raw_chat = bool(cfg.return_raw_chat)
        self.use_shm = bool(cfg.use_shm)  # verl's data.use_shm: read each file from a copy in /dev/shm
        self.media_keys = {"data.image_key": cfg.image_key, "data.video_key": cfg.video_key}
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={self.truncation!r} is not valid. Fix: choose one of "
                             f"{TRUNCATION_MODES}.")
        if self.max_prompt_length <= 0:
            raise ValueError(f"data.max_prompt_length={self.max_prompt_length} must be positive. Fix: "
                             f"data.max_prompt_length=<the longest prompt's tokens>.")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token; cannot left-pad prompts. Fix: use a "
                             "model directory whose tokenizer defines pad_token or eos_token.")
        self.pad_token_id = int(pad)

        rows, origins, in_file = self.read_all_rows()
        texts = [self._render(row, origin, j) for row, origin, j in zip(rows, origins, in_file)]
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []

        over = [i for i, tok in enumerate(ids) if len(tok) > self.max_prompt_length]
        if over and self.truncation == "error" and not self.filter_overlong_prompts:
            raise ValueError(self._overlong_message(over, rows, origins, texts, ids))
        self._items: list[dict] = []
        n_over = 0
        for i, (row, origin, text, tok) in enumerate(zip(rows, origins, texts, ids)):
            if len(tok) > self.max_prompt_length:
                n_over += 1
                if self.filter_overlong_prompts:
                    continue
                tok = self._truncate(tok, text, origin, i)
            rm = row.get("reward_model") or {}
            rm = _plain(rm)
            extra = _plain(row.get("extra_info")) or {}
            truth = rm.get("ground_truth") if isinstance(rm, dict) else None
            _check_ground_truth(truth, origin, in_file[i])
            item = {
                "input_ids": list(tok),
                "data_source": str(row[self.reward_fn_key]),
                "ground_truth": truth,
                "extra_info": dict(extra) if isinstance(extra, dict) else {"value": extra},
                "raw_prompt": text,
                "index": len(self._items),
                "agent_name": row.get("agent_name"),  # verl's column: the agent loop of the row (mode=async)
            }
            if self.return_raw_chat:
                item["raw_chat"] = _plain(row[self.prompt_key])
            self._items.append(item)
        if self.filter_overlong_prompts and n_over:
            logger.warning("filtered %d of %d prompts longer than data.max_prompt_length=%d (files: %s)",
                           n_over, len(rows), self.max_prompt_length, self.files)
        elif n_over:
            logger.warning("truncated (%s) %d of %d prompts longer than data.max_prompt_length=%d",
                           self.truncation, n_over, len(rows), self.max_prompt_length)
        if not self._items:
            raise ValueError(f"no prompts left in {self.files} after filtering prompts longer than "
                             f"data.max_prompt_length={self.max_prompt_length}. Fix: raise data.max_prompt_length, or "
                             f"set data.filter_overlong_prompts=false with data.truncation=left|right|middle.")

    def _overlong_message(self, over, rows, origins, texts, ids) -> str:
        n, first = self.max_prompt_length, over[0]
        longest = max(len(ids[i]) for i in over)
        files = sorted({origins[i] for i in over})
        return (f"{len(over)} of {len(rows)} prompts in {files} are longer than data.max_prompt_length={n} tokens "
                f"(longest {longest}; first: {origins[first]!r} row {first}, {len(ids[first])} tokens, starting "
                f"{texts[first][:80]!r}) and data.truncation='error'. Fix: data.max_prompt_length={longest}, or "
                f"data.filter_overlong_prompts=True (drop them), or data.truncation=left|right|middle.")

    def _check_columns(self, rows: list[dict], origin: str) -> None:
        """The reward column is there (synthetic rows too), and no row carries images or videos (multi-modal data
        is not supported: training on the text alone would be a silent change of task)."""
        if rows and self.reward_fn_key not in rows[0]:
            raise ValueError(f"data file {origin!r} has no column {self.reward_fn_key!r} (data.reward_fn_key); its "
                             f"columns: {sorted(rows[0])}. Fix: data.reward_fn_key=<the column that picks the reward "
                             f"function> (verl's rows call it data_source).")
        for key, column in self.media_keys.items():
            for i, row in enumerate(rows):
                value = _plain(row.get(column))
                if value is not None and not (hasattr(value, "__len__") and len(value) == 0):
                    raise ValueError(f"data file {origin!r}, row {i}: column {column!r} ({key}) holds "
                                     f"{type(value).__name__} data, but rlx does not support multi-modal data yet. "
                                     f"Fix: remove the column (or its values) to train on the text prompts alone.")

    def read_all_rows(self) -> tuple[list[dict], list[str], list[int]]:
        """The rows of every data file (`read_rows`, columns checked), with each row's file and index in that file
        (what an error names)."""
        rows: list[dict] = []
        origins: list[str] = []
        in_file: list[int] = []
        for f in self.files:
            file_rows = self.read_rows(f)
            self._check_columns(file_rows, f)
            rows.extend(file_rows)
            origins.extend([f] * len(file_rows))
            in_file.extend(range(len(file_rows)))
        return rows, origins, in_file

    def read_rows(self, path: str) -> list[dict]:
        """The rows of one data file in verl's row format (see the module docstring): a parquet file or a
        synthetic source. A custom dataset class (data.custom_cls) may subclass RLDataset and override this to read
        another format; tokenizing, truncation and collation stay rlx's."""
        if synthetic.is_synthetic(path):
            return synthetic.generate_rows(path)
        return _read_parquet(_shm_copy(path) if self.use_shm else path,
                             [self.prompt_key, self.reward_fn_key, "reward_model"])

    def data_sources(self) -> set[str]:
        """The distinct `data_source` values (what picks the reward function)."""
        return {item["data_source"] for item in self._items}

    # ---- construction helpers -------------------------------------------------------------------------
    def _render(self, row: dict, origin: str, i: int) -> str:
        prompt = _plain(row.get(self.prompt_key))
        if isinstance(prompt, str):
            return prompt
        if not isinstance(prompt, list) or not all(isinstance(m, dict) and "content" in m for m in prompt):
            raise ValueError(f"data file {origin!r}, row {i}: column {self.prompt_key!r} must be a list of chat "
                             f"messages [{{'role': 'user', 'content': ...}}] or a string, got {prompt!r:.200}. "
                             f"Fix: write each prompt in that form, or point data.prompt_key at the column that "
                             f"holds it.")
        for j, m in enumerate(prompt):  # a message's content is text: bytes would be trained on as their repr
            if not isinstance(m["content"], str):
                raise ValueError(f"data file {origin!r}, row {i}: message {j} of column {self.prompt_key!r} has "
                                 f"content of type {type(m['content']).__name__} ({m['content']!r:.80}), not text. "
                                 f"Fix: write each message's content as a string (bytes decoded, e.g. as UTF-8, when "
                                 f"the file is made).")
        if self.apply_chat_template and getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": m.get("role") or "user", "content": m["content"]} for m in prompt]
            tools = {"tools": self.tool_schemas} if self.tool_schemas else {}
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                      **tools, **self.chat_template_kwargs)
        return "\n".join(str(m["content"]) for m in prompt)

    def _truncate(self, tok: list[int], text: str, origin: str, i: int) -> list[int]:
        n = self.max_prompt_length
        if self.truncation == "left":
            return tok[-n:]
        if self.truncation == "right":
            return tok[:n]
        if self.truncation == "middle":
            left = n // 2
            return tok[:left] + tok[len(tok) - (n - left):]
        raise ValueError(f"data file {origin!r}, row {i}: prompt has {len(tok)} tokens > "
                         f"data.max_prompt_length={n} (data.truncation='error'); the prompt starts {text[:120]!r}. "
                         f"Fix: raise data.max_prompt_length, set data.filter_overlong_prompts=true, or "
                         f"data.truncation=left|right|middle.")

    # ---- dataset protocol -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, idx: int) -> dict:
        item = self._items[idx]
        return {**item, "input_ids": list(item["input_ids"]), "extra_info": dict(item["extra_info"])}

    def collate(self, items: list[dict]) -> Batch:
        return collate_prompts(items, self.pad_token_id, self.max_prompt_length)


def collate_prompts(items: list[dict], pad_token_id: int, max_prompt_length: int) -> Batch:
    """LEFT-pad prompts to exactly ``max_prompt_length`` (so generation appends at a common position)."""
    bsz, width = len(items), int(max_prompt_length)
    input_ids = torch.full((bsz, width), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((bsz, width), dtype=torch.long)
    for b, item in enumerate(items):
        ids = item["input_ids"]
        if len(ids) > width:
            raise ValueError(f"prompt of {len(ids)} tokens exceeds data.max_prompt_length={width}. Fix: raise "
                             f"data.max_prompt_length, or truncate the prompts (data.truncation=left|right|middle).")
        if ids:
            input_ids[b, width - len(ids):] = torch.as_tensor(ids, dtype=torch.long)
            attention_mask[b, width - len(ids):] = 1
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    non_tensors = {k: _object_array([item.get(k) for item in items]) for k in NON_TENSOR_KEYS}
    if items and all("raw_chat" in item for item in items):
        non_tensors["raw_chat"] = _object_array([item["raw_chat"] for item in items])
    return Batch({"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
                 non_tensors)


def _object_array(values: list[Any]) -> np.ndarray:
    # Built element by element: np.asarray on a list of lists/dicts would make a 2-D or mis-shaped array.
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


class PromptLoader:
    """Batches of prompts, epoch after epoch, resumable at the exact batch.

    ``for batch in loader`` yields the *remaining* batches of the current epoch, then moves to the next epoch;
    :meth:`next_batch` crosses epochs forever. The order of epoch ``e`` is a permutation drawn from
    ``(seed, e)``, so a restored ``state_dict()`` (epoch, position, seed) continues with the very next batch.
    """

    def __init__(self, dataset, batch_size: int | None, shuffle: bool = True, seed: int | None = 0,
                 drop_last: bool = True):
        self.dataset = dataset
        self.batch_size = len(dataset) if batch_size is None else int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = 0 if seed is None else int(seed)  # data.seed=null: a fixed default seed
        self.drop_last = bool(drop_last)
        if self.batch_size <= 0:
            raise ValueError(f"batch size must be positive (got {self.batch_size}). Fix: "
                             f"data.train_batch_size=<prompts per step>.")
        if len(self) == 0:
            raise ValueError(f"batch size {self.batch_size} (data.train_batch_size) exceeds the dataset's "
                             f"{len(dataset)} prompts with drop_last. Fix: use more data, or a smaller "
                             f"data.train_batch_size.")
        self.epoch = 0
        self.position = 0  # batches of the current epoch already handed out

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _order(self, epoch: int) -> np.ndarray:
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def _normalise(self) -> None:
        if self.position >= len(self):
            self.epoch += 1
            self.position = 0

    def _batch(self, order: np.ndarray, pos: int) -> Batch:
        idx = order[pos * self.batch_size:(pos + 1) * self.batch_size]
        items = [self.dataset[int(i)] for i in idx]
        if hasattr(self.dataset, "collate"):
            return self.dataset.collate(items)
        return collate_prompts(items, self.dataset.pad_token_id, self.dataset.max_prompt_length)

    def __iter__(self):
        self._normalise()
        epoch = self.epoch
        order = self._order(epoch)
        while self.epoch == epoch and self.position < len(self):
            batch = self._batch(order, self.position)
            self.position += 1  # counted before the yield: a checkpoint taken now resumes after this batch
            yield batch
        if self.epoch == epoch:
            self._normalise()

    def next_batch(self) -> Batch:
        self._normalise()
        batch = self._batch(self._order(self.epoch), self.position)
        self.position += 1
        return batch

    def state_dict(self) -> dict:
        epoch, position = (self.epoch + 1, 0) if self.position >= len(self) else (self.epoch, self.position)
        return {"epoch": epoch, "position": position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.seed = int(state.get("seed", self.seed))
