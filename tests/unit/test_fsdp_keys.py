"""verl's process-group and FSDP keys that rlx takes: `actor_rollout_ref.nccl_timeout` (the actor workers' process
group timeout, a real gloo group here), `fsdp_config.strategy` (verl replaces it by the role's strategy: only its
value is checked), `fsdp_config.use_orig_params` (FSDP1 bookkeeping, listed in NO_OP_BY_DESIGN)."""
from __future__ import annotations

import os
import time

import pytest
import torch

from conftest import load_config

TIMEOUT_S = 3


def _late_collective(rank: int, port: int, out: str) -> None:
    """The actor worker joins its group; rank 1 never enters the all-reduce rank 0 waits in."""
    from rlx.plan import make_plan
    from rlx.workers.actor_worker import ActorRolloutRefWorker

    cfg = load_config(["trainer.device=cpu", f"actor_rollout_ref.nccl_timeout={TIMEOUT_S}"], validate=False)
    worker = ActorRolloutRefWorker(cfg, make_plan(cfg), rank, 2)
    worker.init_distributed("127.0.0.1", port)
    if rank == 1:
        time.sleep(4 * TIMEOUT_S)  # long enough for rank 0 to give up; then leave without joining
        os._exit(0)
    start = time.perf_counter()
    try:
        torch.distributed.all_reduce(torch.ones(1))
        result = "returned"
    except Exception as e:  # noqa: BLE001 - gloo's timeout error type varies across torch versions
        result = f"raised {type(e).__name__}"
    with open(out, "w") as f:
        f.write(f"{result} {time.perf_counter() - start:.1f}")
    os._exit(0)


def test_nccl_timeout_and_engine_strategy_are_checked():
    with pytest.raises(ValueError) as e:
        load_config(["trainer.device=cpu", "actor_rollout_ref.nccl_timeout=0",
                     "actor_rollout_ref.actor.fsdp_config.strategy=megatron"])
    msg = str(e.value)
    assert "actor_rollout_ref.nccl_timeout=0 must be a positive number of seconds" in msg, msg
    assert "actor_rollout_ref.actor.fsdp_config.strategy='megatron' is not one of verl's" in msg, msg
    # verl's values are accepted whatever the role's strategy (verl overwrites this one with it)
    cfg = load_config(["trainer.device=cpu", "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2",
                       "actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.fsdp_config.use_orig_params=True"])
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp"
