"""`data`: the prompts (files or synthetic sources), their lengths and batch, and their rules.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from rlx.config.rules import choice, get_key


TRUNCATIONS = ("error", "left", "right", "middle")


# apply_chat_template arguments that rlx's dataset sets itself
CHAT_TEMPLATE_OWN_KWARGS = ("conversation", "tokenize", "add_generation_prompt", "return_dict", "return_tensors")


@dataclass
class DataConfig:
    tokenizer: Optional[str] = None
    """Tokenizer path; null uses the actor model's tokenizer."""
    train_files: Any = "~/data/rlhf/gsm8k/train.parquet"
    """Parquet file(s) in verl's row format, or a built-in synthetic task `synthetic://<task>/size:N/seed:S`
    (verl's default path; the quickstart config uses a synthetic task)."""
    val_files: Any = "~/data/rlhf/gsm8k/test.parquet"
    """Validation parquet file(s) (same format)."""
    prompt_key: str = "prompt"
    """Column holding the chat messages of the prompt."""
    reward_fn_key: str = "data_source"
    """Column whose value picks the reward function (passed to it as `data_source`)."""
    max_prompt_length: int = 512
    """Prompts are left-padded to this many tokens."""
    max_response_length: int = 512
    """Maximum generated tokens per response."""
    train_batch_size: int = 1024
    """Prompts per training step (each sampled rollout.n times)."""
    val_batch_size: Optional[int] = None
    """Prompts per validation batch; null means the whole validation set at once."""
    gen_batch_size: Optional[int] = None
    """Prompts per generation round, the training loader's batch size (null: train_batch_size). With
    algorithm.filter_groups.enable, rounds of gen_batch_size prompts are generated until train_batch_size groups
    are kept (DAPO's dynamic sampling); without it, it must equal train_batch_size."""
    return_raw_chat: bool = True
    """Keep the raw chat messages in the batch."""
    shuffle: bool = True
    """Shuffle the training set each epoch."""
    seed: Optional[int] = None
    """Seed of the training-set shuffle (null: a fixed default seed, 0; verl's null is torch's fixed default
    generator seed)."""
    filter_overlong_prompts: bool = False
    """Drop prompts longer than max_prompt_length when the dataset loads."""
    truncation: str = choice("error", TRUNCATIONS)
    """What to do with an overlong prompt: error | left | right | middle."""
    apply_chat_template: bool = True
    """Format prompts with the tokenizer's chat template when it has one."""
    trust_remote_code: bool = False
    """Passed to the driver's tokenizer loader (as is actor_rollout_ref.model.trust_remote_code: either one)."""
    dataloader_num_workers: int = 8
    """verl key; prompts are tokenized up front, so rlx loads in the driver."""
    use_shm: bool = False
    """Copy each data file (train_files, val_files) to shared memory (/dev/shm) once and read it from there, as
    verl's copy_to_local(use_shm=True); a file already there is reused (see docs/rollout_memory.md)."""
    return_raw_input_ids: bool = False
    """verl key (not supported yet)."""
    return_full_prompt: bool = False
    """verl key (not supported yet)."""
    validation_shuffle: bool = False
    """verl key (not supported yet)."""
    filter_overlong_prompts_workers: int = 1
    """verl key; filtering runs in the driver."""
    image_key: str = "images"
    """verl key (multi-modal data is not supported yet: a row with images in this column is an error)."""
    video_key: str = "videos"
    """verl key (multi-modal data is not supported yet: a row with videos in this column is an error)."""
    custom_cls: dict = field(default_factory=lambda: {"path": None, "name": None})
    """A dataset class of your own, loaded from a Python file: {path: <file.py>, name: <class name>} (null path:
    rlx's RLDataset). The file is imported and run, as verl does: point it only at code you trust. The class is
    built as cls(data_files, tokenizer, config) (config: this data section) and must have rlx's dataset interface
    (__len__, __getitem__, collate, data_sources; subclassing rlx.data.dataset.RLDataset gives all four; see
    docs/data.md); checked before the run starts."""
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments of the tokenizer's apply_chat_template when prompts are formatted (training and
    validation), e.g. {enable_thinking: false} or {reasoning_effort: low}; the chat template reads them."""


def check_data(cfg, errors):
    """The batch and the lengths are positive (data.truncation is a declared choice). Runs before the batch-size
    rules, which read data.train_batch_size only once it is positive."""
    for key in ("data.train_batch_size", "data.max_prompt_length", "data.max_response_length"):
        if get_key(cfg, key) <= 0:
            errors.append(f"{key}={get_key(cfg, key)} must be a positive integer. Fix: {key}=<a positive integer>.")
    val = cfg.data.val_batch_size
    if val is not None and val <= 0:
        errors.append(f"data.val_batch_size={val} must be a positive integer, or null (the whole validation set at "
                      f"once). Fix: data.val_batch_size=null.")


def check_data_keys(cfg, errors):
    """data.apply_chat_template_kwargs and data.custom_cls have the right shape (the class itself is loaded and
    checked by the preflight)."""
    kwargs = cfg.data.apply_chat_template_kwargs
    if not isinstance(kwargs, dict):
        errors.append(f"data.apply_chat_template_kwargs={kwargs!r} must be a mapping of keyword arguments. Fix: "
                      f"set its keys one by one, e.g. data.apply_chat_template_kwargs.enable_thinking=false.")
    else:
        own = [k for k in kwargs if k in CHAT_TEMPLATE_OWN_KWARGS]
        if own:
            errors.append(f"data.apply_chat_template_kwargs sets {own}, which rlx's dataset sets itself (prompts are "
                          f"rendered as text with add_generation_prompt=True, then tokenized). Fix: remove them.")
    custom = cfg.data.custom_cls
    if not isinstance(custom, dict) or set(custom) - {"path", "name"}:
        errors.append(f"data.custom_cls={custom!r} must be {{path: <file.py>, name: <class name>}} (or both null). "
                      f"Fix: data.custom_cls.path=<file.py> data.custom_cls.name=<class name>.")
    elif custom.get("path") and not custom.get("name"):
        errors.append(f"data.custom_cls.path={custom['path']!r} needs data.custom_cls.name. Fix: "
                      f"data.custom_cls.name=<the dataset class in that file>.")
    elif custom.get("name") and not custom.get("path"):
        errors.append(f"data.custom_cls.name={custom['name']!r} without data.custom_cls.path. Fix: "
                      f"data.custom_cls.path=<the Python file that defines it>, or data.custom_cls.name=null.")
