"""verl's `RLHFDataset` as rlx serves it (`rlx.verl_names`): a `data.custom_cls` written for verl subclasses it.

It is rlx's `RLDataset` (tokenizing, filtering and truncation by data.*, collation) built with verl's constructor,
attributes and hooks, so that a verl subclass that changes how rows are read or mapped runs unchanged:

    cls(data_files, tokenizer, config, processor=None, max_samples=-1)
    _read_files_and_tokenize()   sets `self.dataframe`: a HF `datasets.Dataset` (or any sequence of row dicts) of
                                 verl's rows; the base reads the files with rlx's reader, then takes `max_samples`
                                 rows and calls `maybe_filter_out_long_prompts`
    maybe_filter_out_long_prompts(dataframe)   the rows unchanged: rlx drops (data.filter_overlong_prompts) or
                                 truncates the long prompts itself, by the same count, once the rows are read
    _build_messages(example)     the chat messages of one row (the base: its `data.prompt_key` column)

`self.config` is the `data` section as an omegaconf DictConfig (what verl hands over: `config.get(key, default)`
works); `self.dataframe`'s rows are then turned into rlx's items. A subclass's own `__getitem__` must return
rlx's items (`RLDataset.__getitem__`'s). Images and videos (a `processor`) are refused, as by rlx's dataset.
"""
from __future__ import annotations

import dataclasses

from rlx.config.schema import DataConfig
from rlx.data.dataset import RLDataset, _as_list


class RLHFDataset(RLDataset):
    """verl's `verl.utils.dataset.RLHFDataset`, served by rlx (see the module docstring)."""

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples: int = -1):
        if processor is not None:
            raise ValueError(f"{type(self).__name__} was given a processor (images, videos), but rlx does not "
                             f"support multi-modal data yet. Fix: train on the text prompts (no processor).")
        cfg = config if isinstance(config, DataConfig) else DataConfig(**dict(config))
        from omegaconf import OmegaConf

        self.data_files = _as_list(data_files)
        self.original_data_files = list(self.data_files)
        self.processor, self.max_samples = None, int(max_samples)
        self.config = OmegaConf.create(dataclasses.asdict(cfg))
        self.image_key, self.video_key = cfg.image_key, cfg.video_key
        self.apply_chat_template_kwargs = dict(cfg.apply_chat_template_kwargs or {})
        self.shuffle, self.seed = cfg.shuffle, cfg.seed
        self.dataframe = None
        super().__init__(self.data_files, tokenizer, cfg)

    # ---- verl's hooks --------------------------------------------------------------------------------
    def _read_files_and_tokenize(self) -> None:
        datasets = hf_datasets()
        rows = []
        for f in self.data_files:
            file_rows = self.read_rows(f)
            self._check_columns(file_rows, f)
            rows.extend(file_rows)
        frame = datasets.Dataset.from_list(rows)
        if 0 < self.max_samples < len(frame):
            frame = frame.select(range(self.max_samples))
        self.dataframe = self.maybe_filter_out_long_prompts(frame)

    def maybe_filter_out_long_prompts(self, dataframe=None):
        return dataframe

    def _build_messages(self, example: dict):
        return example[self.prompt_key]

    # ---- into rlx's dataset --------------------------------------------------------------------------
    def read_all_rows(self) -> tuple[list[dict], list[str], list[int]]:
        """The rows of `self.dataframe` as `_read_files_and_tokenize` left it, each with its prompt from
        `_build_messages`."""
        self._read_files_and_tokenize()
        frame = self.dataframe
        if frame is None:
            raise ValueError(f"{type(self).__name__}._read_files_and_tokenize() left self.dataframe unset. Fix: set "
                             f"self.dataframe to the rows (a datasets.Dataset), as verl's RLHFDataset does.")
        rows = frame.to_list() if hasattr(frame, "to_list") else [dict(row) for row in frame]
        origin = f"{type(self).__name__}.dataframe of {self.data_files}"
        self._check_columns(rows, origin)
        rows = [{**row, self.prompt_key: self._build_messages(dict(row))} for row in rows]
        return rows, [origin] * len(rows), list(range(len(rows)))


def hf_datasets():
    """The HF `datasets` package, or a ValueError with the line to install it."""
    try:
        import datasets
    except ImportError as e:
        raise ValueError(f"verl's RLHFDataset keeps its rows in a HF datasets.Dataset, and the `datasets` package is "
                         f"not installed ({e}). Fix: pip install datasets.") from e
    return datasets
