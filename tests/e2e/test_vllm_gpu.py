"""The vLLM rollout on CUDA with the real engine, in Ray workers as the trainer runs it (vLLM 0.22 on the GPU image).

1. Engine lifecycle in a Ray worker: sleep mode, syncs from FSDP2 and FSDP1, generate, sleep, wake; sleep gives back
   >= 90% of what the engine held; greedy output survives a sleep/wake cycle with a re-sync of unchanged weights;
   a weight update changes it.
2. Rollout vs actor: with rollout.calculate_log_probs=True, training/rollout_probs_diff_mean <= 0.01 in bf16 on
   every step of the default job (the max is printed).
3. The default job learns with vLLM on GPU: validation >= 0.4 after 20 steps (the same run as 2).
4. PPO with a critic, colocated, vLLM and activation offload on both: the memory budget holds at
   examples/ppo_trainer/run_ppo_gsm8k.sh's gpu_memory_utilization, and vLLM really holds that share while it generates.
5. examples/grpo_trainer/run_grpo_gsm8k.sh and examples/ppo_trainer/run_ppo_gsm8k.sh on one GPU, 3 steps each, on
   Qwen2.5-0.5B dims with random weights (rlx.models.random_weights) and GSM8K prepared from $RLX_GSM8K_DIR (its
   train.jsonl / test.jsonl); skipped when that is unset.

All of it: ~8-10 min on one H100. Run with
    python -m pytest -m gpu tests/e2e/test_vllm_gpu.py -x -q -s
"""
import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO, example

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="needs vLLM (e.g. 0.22 for torch 2.11; see README 'vLLM versions')")]

# "The default job": the tiny GRPO job of rlx's quick start. Every test that runs it goes through default_job(), so
# where that job's config lives (the base config's defaults, or a config of its own such as
# `--config-name quickstart`) is decided here, once.
DEFAULT_JOB_CONFIG_NAME = "quickstart"
DEFAULT_JOB_OVERRIDES: list[str] = []
ON_ONE_GPU = ["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.name=vllm"]


def default_job(*overrides: str):
    from rlx.config import load_config

    return load_config(DEFAULT_JOB_OVERRIDES + ON_ONE_GPU + list(overrides), config_name=DEFAULT_JOB_CONFIG_NAME)


def _fit(cfg):
    from rlx.plan import make_plan
    from rlx.trainer.ppo_trainer import RayPPOTrainer

    trainer = RayPPOTrainer(cfg, make_plan(cfg))
    trainer.init_workers()
    try:
        history = trainer.fit()
    finally:
        trainer.shutdown()
    return trainer, history


def _recipe_value(script: str, key: str) -> str:
    text = open(example(script)).read()
    m = re.search(rf"^\s*{re.escape(key)}=(\S+)", text, re.M)
    assert m, f"{key} not in {example(script)}"
    return m.group(1)


# ---- 1. engine lifecycle in a Ray worker --------------------------------------------------------------------------
import ray  # noqa: E402
import ray.cloudpickle  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the probe class travels to its worker by value

R = 24  # response tokens of the lifecycle probe
PROMPTS = ["hello world", "The quick brown", "1 2 3 4", "abc abc abc"]


@ray.remote(num_gpus=1, num_cpus=1)
class EngineProbe:
    """One actor rank's view: FSDP2 and FSDP1 copies of the policy and a sleep-mode vLLM engine in one process."""

    def __init__(self, port: int):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rlx.models import resolve_model_path
        from rlx.engine.fsdp import init_distributed

        os.environ["LOCAL_RANK"] = "0"
        self.device = init_distributed("cuda", 0, 1, "127.0.0.1", port)
        self.path = resolve_model_path("builtin://tiny-qwen2")
        self.tok = AutoTokenizer.from_pretrained(self.path)
        load = lambda: AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float32).to(self.device)  # noqa
        self.fsdp2 = load()
        mesh = init_device_mesh("cuda", (1,))
        for layer in self.fsdp2.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.fsdp2, mesh=mesh)
        self.fsdp1 = FSDP(load(), device_id=self.device, use_orig_params=False)
        self.rollout = None

    def used(self) -> int:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return total - free

    def build(self, utilization: float) -> dict:
        from rlx.config.schema import RolloutConfig
        from rlx.workers.rollout.vllm_rollout import VLLMRollout

        torch.cuda.empty_cache()
        before = self.used()
        cfg = RolloutConfig(name="vllm", tensor_model_parallel_size=1, gpu_memory_utilization=utilization, free_cache_engine=True,
                            enforce_eager=True, dtype="bfloat16", max_num_seqs=64)
        self.rollout = VLLMRollout(self.path, cfg, max_prompt_length=16, max_response_length=R, rank=0,
                                   world_size=1, pad_token_id=self.tok.pad_token_id,
                                   eos_token_id=self.tok.eos_token_id, dtype="bfloat16", device="cuda")
        asleep_after_build = self.used()
        self.rollout.wake_up()
        awake = self.used()
        self.rollout.release()
        asleep = self.used()
        return dict(before=before, asleep_after_build=asleep_after_build, awake=awake, asleep=asleep,
                    total=torch.cuda.mem_get_info()[1], sleep_enabled=self.rollout.sleep_enabled,
                    version=self.rollout.api.name)

    def _prompts(self):
        from rlx.protocol import Batch

        rows = [self.tok.encode(t, add_special_tokens=False)[-16:] for t in PROMPTS]
        ids = torch.full((len(rows), 16), self.tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), 16), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, 16 - len(r):], mask[i, 16 - len(r):] = torch.tensor(r), 1
        return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
                     meta=dict(n=1, do_sample=False))

    def cycle(self, source: str | None) -> list[list[int]]:
        """What the actor worker does per rollout: wake the weights, sync from `source` (fsdp2 | fsdp1 | None: no
        sync), wake the cache, generate greedily, sleep. Returns the responses."""
        from rlx.engine.weights import iter_full_params

        self.rollout.wake_up("weights")
        if source is not None:
            self.rollout.sync_weights(iter_full_params(getattr(self, source)))
        self.rollout.wake_up("kv_cache")
        out = self.rollout.generate_sequences(self._prompts())
        self.rollout.release()
        return out["responses"].tolist()

    def train_step(self, lr: float = 1e-2) -> None:
        """One AdamW step of the FSDP2 policy on next-token CE over a fixed text: every weight moves."""
        ids = torch.tensor([self.tok.encode("the cat sat on the mat. " * 4, add_special_tokens=False)],
                           device=self.device)
        opt = torch.optim.AdamW(self.fsdp2.parameters(), lr=lr, weight_decay=0.0)
        self.fsdp2(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def shutdown(self) -> None:
        if self.rollout is not None:
            self.rollout.shutdown()


def test_engine_lifecycle_in_a_ray_worker(ray_local):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probe = EngineProbe.remote(port)
    try:
        mem = ray.get(probe.build.remote(0.3), timeout=600)
        gib = {k: v / 2**30 for k, v in mem.items() if isinstance(v, int) and not isinstance(v, bool)}
        held, freed = gib["awake"] - gib["before"], gib["awake"] - gib["asleep"]
        print(f"\nvLLM {mem['version']}: before the engine {gib['before']:.2f} GiB in use, awake {gib['awake']:.2f}, "
              f"asleep {gib['asleep']:.2f} (after build: {gib['asleep_after_build']:.2f}) of {gib['total']:.1f}: the "
              f"engine held {held:.2f} GiB, sleep gave back {freed:.2f} ({freed / held:.1%})")
        assert mem["sleep_enabled"]
        assert held >= 0.25 * gib["total"], "vLLM did not take its gpu_memory_utilization share"
        assert freed >= 0.9 * held, gib
        assert gib["asleep_after_build"] - gib["before"] <= 0.1 * held, "the engine is not asleep after its build"

        dummy = ray.get(probe.cycle.remote(None))        # load_format=dummy: random weights until the first sync
        first = ray.get(probe.cycle.remote("fsdp2"))
        again = ray.get(probe.cycle.remote("fsdp2"))     # sleep/wake in between, same weights re-synced
        from_fsdp1 = ray.get(probe.cycle.remote("fsdp1"))  # the same initial weights through FSDP1's gather
        assert first != dummy, "the sync did not replace the engine's dummy weights"
        assert again == first, f"greedy output changed over a sleep/wake cycle:\n{first}\n{again}"
        assert from_fsdp1 == first, f"FSDP1 and FSDP2 syncs of the same weights differ:\n{first}\n{from_fsdp1}"
        ray.get(probe.train_step.remote())
        trained = ray.get(probe.cycle.remote("fsdp2"))
        assert trained != first, "after a weight update the next sync did not change the outputs"
        print(f"greedy responses: dummy {dummy[0][:8]}..., synced {first[0][:8]}..., trained {trained[0][:8]}...")
    finally:
        try:
            ray.get(probe.shutdown.remote(), timeout=120)
        finally:
            ray.kill(probe)


# ---- 2 and 3. the default job with vLLM: rollout vs actor probabilities, and it learns -----------------------------
@pytest.fixture(scope="module")
def default_run(ray_local, tmp_path_factory):
    cfg = default_job("actor_rollout_ref.rollout.calculate_log_probs=True", "trainer.total_training_steps=20",
                      "trainer.logger=[console,file]",
                      f"trainer.default_local_dir={tmp_path_factory.mktemp('default_job')}")
    assert cfg.trainer.device == "cuda" and cfg.actor_rollout_ref.rollout.dtype == "bfloat16"
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision["param_dtype"] == "bf16"
    trainer, history = _fit(cfg)
    return trainer, history


def test_rollout_probs_match_the_actor_in_bf16(default_run):
    _, history = default_run
    diffs = [m["training/rollout_probs_diff_mean"] for m in history]
    print(f"\ntraining/rollout_probs_diff_mean over {len(diffs)} steps: max {max(diffs):.5f} (step "
          f"{diffs.index(max(diffs)) + 1}), mean {sum(diffs) / len(diffs):.5f}; "
          f"training/rollout_probs_diff_max max {max(m['training/rollout_probs_diff_max'] for m in history):.4f}")
    assert len(diffs) == 20
    assert all(d <= 0.01 for d in diffs), diffs


def test_default_job_learns_with_vllm(default_run):
    trainer, history = default_run
    key = next(k for k in trainer.val_history[-1] if k.endswith("/reward/mean"))
    first, last = trainer.val_history[0][key], trainer.val_history[-1][key]
    step_s = sorted(m["timing_s/step"] for m in history)[len(history) // 2]
    gen = sorted(m["timing_s/rollout/generate"] for m in history)[len(history) // 2]
    print(f"\n{key}: {first:.4f} -> {last:.4f} after {len(history)} steps; median step {step_s:.2f}s "
          f"(generate {gen:.2f}s); GPU memory after sleep "
          f"{history[-1]['perf/gpu_memory_gib/after_sleep']:.2f} GiB, after generate "
          f"{history[-1]['perf/gpu_memory_gib/after_generate']:.2f} GiB")
    assert last >= 0.4, (first, last)


# ---- 4. PPO with a critic, colocated, offload on both, at the recipe's vLLM share ----------------------------------
OFFLOAD_BOTH = [f"{p}.{k}" for p in ("actor_rollout_ref.model", "critic.model")
                for k in ("enable_gradient_checkpointing=True", "enable_activation_offload=True",
                          "use_remove_padding=True",  # the tiny model's activations are small: offload them all
                          "activation_offload.min_tensor_bytes=0", "activation_offload.keep_last_layers=0")]


def test_ppo_critic_colocated_vllm_offload_memory_budget(ray_local, tmp_path):
    util = float(_recipe_value("run_ppo_gsm8k.sh", "actor_rollout_ref.rollout.gpu_memory_utilization"))
    cfg = default_job("algorithm.adv_estimator=gae", "trainer.total_training_steps=2", *OFFLOAD_BOTH,
                      f"actor_rollout_ref.rollout.gpu_memory_utilization={util}",
                      "actor_rollout_ref.actor.fsdp_config.param_offload=True",
                      "actor_rollout_ref.actor.use_dynamic_bsz=True", "critic.use_dynamic_bsz=True",
                      f"trainer.default_local_dir={tmp_path}")
    trainer, history = _fit(cfg)
    assert len(history) == 2
    for step, m in enumerate(history, 1):
        total = m["perf/gpu_memory_gib/total"]
        after = {k.rsplit("after_", 1)[1]: v for k, v in m.items() if k.startswith("perf/gpu_memory_gib/after_")}
        print(f"step {step}: GPU memory in use (GiB of {total:.1f}): "
              + ", ".join(f"{k} {v:.2f}" for k, v in after.items())
              + f"; critic/vf_loss {m['critic/vf_loss']:.4f}")
        assert m["critic/grad_norm"] > 0 and m["actor/grad_norm"] > 0
        assert m["perf/update_actor/offloaded_activation_gb"] > 0
        assert m["perf/update_critic/offloaded_activation_gb"] > 0
        # vLLM holds its share of the GPU next to the colocated critic while generating ...
        assert after["generate"] >= 0.9 * util * total, (after, util, total)
        # ... and gives it back before the log-prob, value and update passes
        assert after["sleep"] <= after["generate"] - 0.8 * util * total, after
        assert max(after.values()) <= 0.98 * total


# ---- 5. the GSM8K recipes on one GPU --------------------------------------------------------------------------------
GSM8K_DIR = os.environ.get("RLX_GSM8K_DIR")
RECIPE_STEPS = ["trainer.total_training_steps=3", "data.train_batch_size=8",
                "actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.save_freq=-1", "trainer.n_gpus_per_node=1"]


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    if not GSM8K_DIR:
        pytest.skip("set RLX_GSM8K_DIR to a directory holding GSM8K's train.jsonl and test.jsonl")
    out = tmp_path_factory.mktemp("gsm8k")
    subprocess.run([sys.executable, os.path.join(REPO, "scripts", "prepare_gsm8k.py"), "--input_dir", GSM8K_DIR,
                    "--output_dir", str(out)], check=True, timeout=300)
    import pandas as pd

    test = pd.read_parquet(out / "test.parquet")
    test.head(32).to_parquet(out / "test.parquet")  # validation runs twice per recipe: keep it short
    return str(out)


@pytest.fixture(scope="module")
def random_0_5b():
    from rlx.models.random_weights import random_model_dir

    return random_model_dir("qwen2.5-0.5b")


@pytest.mark.parametrize("script", ["run_grpo_gsm8k.sh", "run_ppo_gsm8k.sh"])
def test_gsm8k_recipe_on_one_gpu(script, gsm8k, random_0_5b, tmp_path):
    env = dict(os.environ, MODEL_PATH=random_0_5b, DATA_DIR=gsm8k, N_GPUS="1", PYTHON=sys.executable,
               VLLM_ENABLE_V1_MULTIPROCESSING="0", TENSORBOARD_DIR=str(tmp_path / "tb"))
    env.pop("RAY_ADDRESS", None)
    extra = RECIPE_STEPS + ["trainer.logger=[console,file]", f"trainer.default_local_dir={tmp_path}"]
    proc = subprocess.run(["bash", example(script), *extra], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=480)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    steps = [json.loads(line) for line in open(tmp_path / "logs" / "metrics.jsonl") if '"timing_s/step"' in line]
    assert len(steps) == 3, tail
    for m in steps:
        print(f"{script} step {m['step'] if 'step' in m else '?'}: score {m['critic/score/mean']:.3f}, response "
              f"{m['response_length/mean']:.0f} tokens, step {m['timing_s/step']:.1f}s (generate "
              f"{m['timing_s/rollout/generate']:.1f}s, {m['perf/rollout/generated_tokens_per_s']:.0f} tokens/s)")
        # random weights score 0 on GSM8K: GRPO's advantages (and gradient) are then 0; GAE's are not
        assert all(math.isfinite(m[k]) for k in ("actor/pg_loss", "actor/grad_norm", "response_length/mean")), m
        if script == "run_ppo_gsm8k.sh":
            assert m["critic/grad_norm"] > 0 and m["actor/grad_norm"] > 0, m
