"""End-to-end half of tests/unit/test_async_training.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import pytest
from unit.test_async_training import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    COMMON,
    COMPARED,
    _fit,
)


@pytest.mark.e2e
def test_on_policy_disaggregated_run_equals_the_colocated_run(ray_local, tmp_path):
    """staleness 0: the rollout pool generates batch k with the weights of update k-1, as the colocated rollout
    does; the trainer's losses, gradient norms and scores are the colocated run's, bit for bit."""
    sync = _fit(COMMON, tmp_path / "sync", async_=False)
    disagg = _fit(COMMON + ["actor_rollout_ref.hybrid_engine=False", "rollout.n_gpus_per_node=1",
                            "async_training.staleness_threshold=0"], tmp_path / "async", async_=True)
    for step, (a, b) in enumerate(zip(sync, disagg), start=1):
        for key in COMPARED:
            assert a[key] == b[key], (step, key, a[key], b[key])
        assert b["async/staleness_max"] == 0.0 and b["async/dropped_stale_samples"] == 0.0


@pytest.mark.e2e
def test_one_step_off_trains_on_samples_one_version_old(ray_local, tmp_path):
    """staleness 1 (verl's one-step-off, the default): batch 1 is on-policy, every later batch was generated while
    the previous one trained (lag 1), corrected by token-level IS by default; the weights reach the rollout."""
    hist = _fit(COMMON + ["actor_rollout_ref.hybrid_engine=False", "rollout.n_gpus_per_node=1",
                          "trainer.total_training_steps=4", "trainer.test_freq=4"], tmp_path, async_=True)
    assert [m["async/staleness_max"] for m in hist] == [0.0, 1.0, 1.0, 1.0]
    assert [m["async/rollout_version"] for m in hist] == [1.0, 2.0, 3.0, 4.0]
    assert hist[0]["training/rollout_probs_diff_mean"] < 1e-4  # on-policy: the rollout held the trainer's weights
    assert all(m["training/rollout_probs_diff_mean"] > 1e-4 for m in hist[1:])  # one update behind
    assert all("rollout_corr/rollout_is_mean" in m for m in hist)
    assert "val/synthetic/digits/reward/mean" in hist[-1]
    for m in hist:
        assert 0.0 <= m["async/trainer_idle_ratio"] <= 1.0 and m["perf/sync_weights_gb"] > 0


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_partial_rollout_generates_admitted_batches_together(ray_local, tmp_path, engine):
    """Fully async with partial rollout (staleness 2, segments of 4 tokens): the next batches start while one is
    still generating (the rollout workers advance them in the same calls), and no sample lags more than the bound.
    On vLLM the responses stay live in the engine between calls (continuous batching) and a sync pauses and resumes
    them. (The versions of a response that spans a sync: test_partial_rollout_tags_each_token_with_its_version and
    test_vllm_rollout.py::test_stream_keeps_requests_live_and_resumes_after_a_sync.)"""
    if engine == "vllm":
        pytest.importorskip("vllm")
    hist = _fit(COMMON + [f"actor_rollout_ref.rollout.name={engine}",
                          "actor_rollout_ref.hybrid_engine=False", "rollout.n_gpus_per_node=1",
                          "trainer.total_training_steps=4", "async_training.staleness_threshold=2",
                          "async_training.partial_rollout=True", "async_training.partial_rollout_segment=4"],
                tmp_path, async_=True)
    assert len(hist) == 4
    assert max(m["async/batches_in_flight"] for m in hist) >= 2
    assert all(m["async/staleness_max"] <= 2 and m["async/dropped_stale_samples"] == 0 for m in hist)
    assert [m["async/rollout_version"] for m in hist] == [1.0, 2.0, 3.0, 4.0]
    if engine == "vllm":  # the engine's work between two syncs
        assert sum(m["rollout/engine_steps"] for m in hist) > 0
        assert all(m["rollout/requests_per_engine_step"] > 0 for m in hist if m["rollout/engine_steps"])


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_two_engines_share_one_rollout_slot(ray_local, tmp_path, engine):
    """rollout.engines_per_gpu=2 on one rollout slot: two rollout ranks, each a lone process group, on one bundle;
    the weights reach each through a transfer group of its own (one per engine slot). On-policy (staleness 0) every
    sample's rollout log-probs are the trainer's, so neither engine generated with other weights than the trainer's,
    at every step (a rank left without the sync would sample with its first weights)."""
    if engine == "vllm":
        pytest.importorskip("vllm")
    hist = _fit(COMMON + [f"actor_rollout_ref.rollout.name={engine}", "actor_rollout_ref.hybrid_engine=False",
                          "async_training.staleness_threshold=0", "rollout.n_gpus_per_node=1",
                          "rollout.engines_per_gpu=2", "actor_rollout_ref.rollout.gpu_memory_utilization=0.45"],
                tmp_path, async_=True)
    assert [m["async/rollout_version"] for m in hist] == [1.0, 2.0, 3.0]
    for m in hist:
        assert m["training/rollout_probs_diff_mean"] < 1e-4 and m["async/staleness_max"] == 0.0
        assert m["perf/sync_weights_gb"] > 0
