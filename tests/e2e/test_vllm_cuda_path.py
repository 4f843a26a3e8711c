"""End-to-end half of tests/unit/test_vllm_cuda_path.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from types import SimpleNamespace
import pytest
import torch
from rlx.protocol import Batch
from rlx.workers.rollout.vllm_rollout import SLEEP_TAGS
from unit.test_vllm_cuda_path import FakeLLM, _rollout
from unit.test_vllm_cuda_path import rollout  # noqa: F401 -- fixtures


def test_cuda_engine_args_tp_groups_share_a_seed():
    args = [_rollout(rank)._engine_args({}) for rank in range(4)]
    for a in args:
        assert a["tensor_parallel_size"] == 2 and a["distributed_executor_backend"] == "external_launcher"
        assert a["gpu_memory_utilization"] == 0.4
        assert a["enable_sleep_mode"] is True
        assert a["disable_custom_all_reduce"] is True
        assert "kv_cache_memory_bytes" not in a  # the CPU-only sizing stays off the GPU path
    seeds = [a["seed"] for a in args]
    assert seeds[0] == seeds[1] and seeds[2] == seeds[3] and seeds[0] != seeds[2], seeds
    assert _rollout(free_cache_engine=False)._engine_args({})["enable_sleep_mode"] is False


def test_sync_wakes_weights_and_generation_wakes_the_cache(rollout):
    r, calls = rollout
    r.release()  # what __init__ does after building the engine
    assert calls == [("sleep", 1)]
    calls.clear()
    r.sync_weights(iter([("w", torch.zeros(2))]))
    assert calls == [("wake_up", ("weights",)), ("rpc", "reload_weights", 1), ("reset_prefix_cache",)]
    calls.clear()
    r._wake(*SLEEP_TAGS)  # generate_sequences' first step
    # the cache comes back only now, after torch's cached training blocks went back to the device
    assert calls == [("empty_cache",), ("wake_up", ("kv_cache",))]
    calls.clear()
    r._wake(*SLEEP_TAGS)
    assert calls == []  # already awake
    r.release()
    r.release()
    assert calls == [("sleep", 1)]


def test_generation_without_a_sync_wakes_everything(rollout):
    r, calls = rollout
    r.release()
    calls.clear()
    r.wake_up()
    assert calls == [("empty_cache",), ("wake_up", ("weights", "kv_cache"))]


@pytest.mark.parametrize("version", ["0.22.0", "0.32.0"])
def test_wake_up_of_each_release(monkeypatch, version):
    """0.32 reports whether the engine is fully awake (and schedules only then): a wake that leaves it asleep is an
    error instead of a generation that waits forever; 0.22 reports nothing."""
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    calls = []
    r = _rollout(vllm_version=version)
    r._llm_kwargs = r._engine_args({})
    engine_says_awake = [True]
    reply = (lambda tags: engine_says_awake[0] or "kv_cache" not in tags) if version == "0.32.0" else None
    r.llm = FakeLLM(calls, reply)
    r.release()
    r.wake_up("weights")
    r.wake_up()
    assert r._asleep == set()
    r.release()
    engine_says_awake[0] = False  # e.g. an allocation tag that rlx did not wake
    if version == "0.32.0":
        r.wake_up("weights")  # partly awake is expected here
        with pytest.raises(RuntimeError, match="reports the engine still asleep"):
            r.wake_up("kv_cache")
    else:
        r.wake_up()


def test_no_sleep_mode_means_no_sleep_calls(rollout):
    r, calls = rollout
    r._llm_kwargs["enable_sleep_mode"] = False
    r.release()
    r.sync_weights(iter([]))
    assert [c[0] for c in calls] == ["rpc", "reset_prefix_cache"]


def test_generate_sequences_wakes_before_generating(rollout):
    pytest.importorskip("vllm")
    r, calls = rollout
    r.release()
    r.pad_token_id, r.eos_token_id, r.calculate_log_probs = 0, 2, False
    out = SimpleNamespace(outputs=[SimpleNamespace(index=0, token_ids=[5, 2], logprobs=None)])
    r.llm.generate = lambda prompts, params, use_tqdm: calls.append(("generate",)) or [out] * len(prompts)
    calls.clear()
    ids = torch.tensor([[0, 3, 4]])
    mask = torch.tensor([[0, 1, 1]])
    res = r.generate_sequences(Batch({"input_ids": ids, "attention_mask": mask, "position_ids": mask},
                                     meta=dict(n=1, do_sample=False)))
    assert calls == [("empty_cache",), ("wake_up", ("weights", "kv_cache")), ("generate",)]
    assert res["responses"][0, :2].tolist() == [5, 2]


def test_tp_dispatch_gives_each_tp_group_the_same_prompts(monkeypatch):
    """run_dp(replicas=tp): ranks 2k and 2k+1 (one vLLM TP group) get the same chunk; rank 2k's result is kept."""
    from rlx.workers import group

    class Rank:
        def __init__(self, rank):
            self.rank = rank
            self.seen = None
            self.generate_sequences = SimpleNamespace(remote=self._call)

        def _call(self, chunk):
            self.seen = chunk["x"].tolist()
            return Batch({"x": chunk["x"] * 10 + self.rank})

    monkeypatch.setattr(group.ray, "get", lambda refs: refs)
    wg = group.WorkerGroup.__new__(group.WorkerGroup)
    wg.world_size, wg.workers = 4, [Rank(i) for i in range(4)]
    out = wg.run_dp("generate_sequences", Batch({"x": torch.arange(6)}), replicas=2)
    assert [w.seen for w in wg.workers] == [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]]
    assert out["x"].tolist() == [0, 10, 20, 32, 42, 52]  # rank 0's and rank 2's results


def test_bundles_numbered_node_by_node(monkeypatch):
    """Ray may interleave a placement group's bundles over nodes; ranks follow the nodes, so a TP group of
    consecutive ranks stays on one node."""
    from rlx.workers import group

    ready = object()
    monkeypatch.setattr(group.ray, "cluster_resources", lambda: {"GPU": 4.0, "CPU": 8.0})
    monkeypatch.setattr(group, "placement_group", lambda bundles, **kw: SimpleNamespace(ready=lambda: ready))
    monkeypatch.setattr(group.ray, "wait", lambda refs, timeout: (refs, []))
    monkeypatch.setattr(group, "placement_group_table",
                        lambda pg: {"bundles_to_node_id": {0: "nodeA", 1: "nodeB", 2: "nodeA", 3: "nodeB"}})
    pool = group.ResourcePool(nnodes=2, n_gpus_per_node=2, device="cuda", roles=2)
    assert pool.bundle_of_rank == [0, 2, 1, 3]
    assert pool.node_of_rank == ["nodeA", "nodeA", "nodeB", "nodeB"]
    opts = pool.options(1)
    assert opts["num_gpus"] == 0.5 and opts["num_cpus"] == 0.5
    assert opts["scheduling_strategy"].placement_group_bundle_index == 2
    # rollout.engines_per_gpu=2: ranks 2b and 2b+1 share bundle b (node by node), each with half of it
    two = group.ResourcePool(nnodes=2, n_gpus_per_node=2, device="cuda", roles=1, ranks_per_bundle=2)
    assert (two.bundles, two.world_size) == (4, 8)
    assert two.bundle_of_rank == [0, 0, 2, 2, 1, 1, 3, 3]
    assert two.options(3)["num_gpus"] == 0.5 and two.options(3)["scheduling_strategy"].placement_group_bundle_index == 2
