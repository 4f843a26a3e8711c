"""The CUDA path of the vLLM rollout, tested without a GPU or vLLM: engine arguments, sleep/wake order around a
weight sync, the GPU memory budget, and the tensor-parallel dispatch and placement the driver does for it."""

import pytest
import torch

from rlx.config.schema import RolloutConfig
from rlx.workers.rollout import vllm_compat
from rlx.workers.rollout.vllm_rollout import VLLMRollout, check_gpu_memory_budget

GIB = 1 << 30


def _rollout(rank=0, world_size=4, tp=2, device="cuda", vllm_version="0.22.0", **cfg):
    """A VLLMRollout with its attributes set as __init__ sets them, minus the engine."""
    r = VLLMRollout.__new__(VLLMRollout)
    r.api = vllm_compat.api_for(vllm_version)
    base = dict(tensor_model_parallel_size=tp, gpu_memory_utilization=0.4, free_cache_engine=True, seed=7,
                enforce_eager=True, max_num_seqs=64, max_model_len=None, enable_chunked_prefill=True,
                max_num_batched_tokens=8192, disable_log_stats=True)
    base.update(cfg)
    r.cfg = RolloutConfig(**base)
    r.model_path, r.device, r.dtype, r.trust_remote_code = "/nonexistent", device, "bfloat16", False
    r.ignore_eos = r.cfg.ignore_eos
    r.tied_head = False
    r.rank, r.world_size, r.tp, r.dp_rank = rank, world_size, tp, rank // tp
    r.max_prompt_length, r.max_response_length = 16, 32
    r.free_cache_engine, r.sleep_level, r._asleep = base["free_cache_engine"], 1, set()
    return r


class FakeLLM:
    def __init__(self, calls, awake_reply=None):
        self.calls, self.awake_reply = calls, awake_reply

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags else None))
        return self.awake_reply(tags) if self.awake_reply else None

    def collective_rpc(self, method, kwargs):
        self.calls.append(("rpc", method, len(list(kwargs["weights_iterator"]))))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


@pytest.fixture
def rollout(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty_cache",)))
    r = _rollout()
    r._llm_kwargs = r._engine_args({})
    r.llm = FakeLLM(calls)
    return r, calls


def test_gpu_memory_budget():
    check_gpu_memory_budget(0.5, free_bytes=100 * GIB, total_bytes=140 * GIB, held_bytes=30 * GIB)
    with pytest.raises(ValueError) as e:
        check_gpu_memory_budget(0.5, free_bytes=50 * GIB, total_bytes=140 * GIB, held_bytes=80 * GIB)
    msg = str(e.value)
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.5" in msg
    assert "only 50.0 GiB are free" in msg and "hold 80.0 GiB" in msg
    assert "gpu_memory_utilization=0.33" in msg  # 50/140 with a 5% margin, rounded down
    assert "param_offload=True" in msg
