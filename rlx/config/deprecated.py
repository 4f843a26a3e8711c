"""verl's deprecated global micro-batch keys, turned into the per-GPU keys that replace them, as verl's workers do.

`actor.ppo_micro_batch_size`, `rollout.log_prob_micro_batch_size`, `ref.log_prob_micro_batch_size`,
`critic.ppo_micro_batch_size` and `critic.forward_micro_batch_size` count sequences over the whole data-parallel
world. verl's FSDP workers divide each by the number of data-parallel groups, world size // sp (integer division),
and use the result as the `*_per_gpu` key: the actor, rollout and ref keys by the actor's
`ulysses_sequence_parallel_size` (verl's actor/rollout/ref worker reads the actor's), the critic's by the critic's.
rlx does the same when the config loads, before validation, and says so in one `rlx: note:` line per key.

Setting a deprecated key and its replacement both is refused, as verl refuses it (unless that role forms
micro-batches by tokens, `use_dynamic_bsz`, where neither is used). A key left set after this step (both set, or a
global size smaller than the data-parallel size) is reported by validation (rlx.config.validate).
verl ignores `critic.forward_micro_batch_size` unless `critic.ppo_micro_batch_size` is set too; rlx derives it on its
own as well (the value-forward micro-batch changes speed and memory, not values).
"""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from rlx.config.verl_compat import DEPRECATED, DIVIDED_BY, data_parallel_size  # noqa: F401 (DIVIDED_BY: its table)

def _select(cfg: DictConfig, key: str):
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=False)
    except Exception:  # noqa: BLE001 - a broken interpolation is reported when the config is typed
        return None


def _set_by_user(cfg: DictConfig, key: str) -> bool:
    """The key holds a value of its own, not null and not its schema's interpolation of another key."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent)
    return not OmegaConf.is_interpolation(node, leaf) and node[leaf] is not None


def derive_micro_batch_sizes(cfg: DictConfig) -> list[str]:
    """Replace each deprecated global micro-batch key of `cfg` (the merged, unresolved config; changed in place) by
    its per-GPU key; returns the notes to print."""
    notes = []
    world = None
    nnodes, gpus = _select(cfg, "trainer.nnodes"), _select(cfg, "trainer.n_gpus_per_node")
    if isinstance(nnodes, int) and isinstance(gpus, int):
        world = nnodes * gpus
    for key, (sp_key, dynamic_key) in DIVIDED_BY.items():
        value = _select(cfg, key)
        if value is None:
            continue
        replacement = DEPRECATED[key]
        if _set_by_user(cfg, replacement):
            if _select(cfg, dynamic_key) is True:  # neither is used: micro-batches are formed by tokens
                OmegaConf.update(cfg, key, None)
                notes.append(f"rlx: note: {key}={value} is deprecated (verl's global micro-batch) and unused here "
                             f"({dynamic_key}=True); {replacement} is set. Remove {key}.")
            continue  # both set: refused by validation, as verl refuses it
        dp = data_parallel_size(world, _select(cfg, sp_key) if sp_key else 1)
        if dp is None or value // dp < 1:
            continue  # validation names the problem
        per_gpu = value // dp
        OmegaConf.update(cfg, replacement, per_gpu)
        OmegaConf.update(cfg, key, None)
        sp = _select(cfg, sp_key) if sp_key else 1
        notes.append(f"rlx: note: {key}={value} is deprecated; taken as verl takes it: {replacement}={per_gpu} "
                     f"({value} // {dp} data-parallel groups: world size {world} // sp {sp}). Use that key.")
    return notes
