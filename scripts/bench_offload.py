"""Benchmark activation-offload schemes: one FSDP2 training step (fwd+bwd+AdamW), random Qwen2 weights, bf16.

    torchrun --nproc_per_node=1 scripts/bench_offload.py            # everything (about 5-8 min on one H100)
    torchrun --nproc_per_node=1 scripts/bench_offload.py --shapes 7b --schemes none,rlx_offload_ckpt

Needs only torch (>= 2.11) and transformers; imports nothing from rlx but rlx.offload. Each (shape, scheme)
runs in its own process, so one scheme's memory or pinned pool cannot affect the next. Prints, per run, the
loss after each step, then the peak GiB (torch.cuda.max_memory_allocated over the timed steps) and the step
time (median of the timed steps), and a table last. The layer sweep (rlx_offload at 7B dims) prints the
device memory held at the end of forward above the static part (params+optimizer), which does not grow with
the number of layers when offload works.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

SHAPES = {
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
               vocab_size=152064, num_hidden_layers=8, tie_word_embeddings=False),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2,
                 vocab_size=151936, num_hidden_layers=28, tie_word_embeddings=True),
}
SCHEMES = ["none", "hf_ckpt", "save_on_cpu", "rlx_offload", "rlx_offload_ckpt", "rlx_offload_ckpt_head"]
GiB = float(1 << 30)


def worker(a) -> dict:
    import torch
    import torch.nn.functional as F  # noqa: F401
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard

    cuda = torch.cuda.is_available()  # the CPU path only exists to smoke-test this script (--tiny)
    torch.distributed.init_process_group("nccl" if cuda else "gloo")
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(0)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    mem = torch.cuda.memory_allocated if cuda else (lambda: 0)
    shape = dict(SHAPES[a.shape])
    if a.layers:
        shape["num_hidden_layers"] = a.layers
    if a.tiny:
        shape.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                     vocab_size=300)
    cfg = transformers.Qwen2Config(**shape, max_position_embeddings=max(32768, a.seq), use_cache=False,
                                   attn_implementation="sdpa")
    torch.manual_seed(0)
    with dev:
        model = transformers.Qwen2ForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    model.config._attn_implementation = "sdpa"
    model.train()
    if a.scheme == "hf_ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mesh = init_device_mesh(dev.type, (torch.distributed.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    off = None
    if a.scheme.startswith("rlx_offload"):
        from rlx.offload import ActivationOffloadConfig, apply_activation_offload
        ocfg = ActivationOffloadConfig(keep_last_layers=1)
        if a.scheme == "rlx_offload_ckpt_head":
            ocfg = ActivationOffloadConfig(keep_last_layers=0, offload_head=True)
        off = apply_activation_offload(model, ocfg, enable_gradient_checkpointing="ckpt" in a.scheme)
        print(off.describe(), flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(1234)
    data = [torch.randint(0, cfg.vocab_size, (1, a.seq), generator=gen).to(dev) for _ in range(a.steps)]
    losses, times, fwd_held = [], [], []
    static = 0
    for step, ids in enumerate(data):
        if step == a.warmup and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        sync()
        static = mem()
        t0 = time.perf_counter()
        if a.scheme == "save_on_cpu":
            ctx = torch.autograd.graph.save_on_cpu(pin_memory=cuda)
        elif off is not None:
            ctx = off.activate()
        else:
            ctx = torch.enable_grad()
        with ctx:
            out = model(input_ids=ids, labels=ids)
            loss = out.loss
            if a.sweep:
                sync()
                fwd_held.append(mem() - static)
            del out
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if step >= a.warmup:
            times.append(dt)
        print(f"[{a.shape} x{shape['num_hidden_layers']} {a.scheme}] step {step} loss {losses[-1]:.6f} "
              f"time {dt:.3f}s", flush=True)
    res = dict(shape=a.shape, layers=shape["num_hidden_layers"], scheme=a.scheme, losses=losses,
               peak_gib=(torch.cuda.max_memory_allocated() if cuda else 0) / GiB, step_s=statistics.median(times),
               static_gib=static / GiB, fwd_held_gib=(max(fwd_held) / GiB if fwd_held else None),
               device=torch.cuda.get_device_name() if cuda else "cpu", torch=torch.__version__, transformers=transformers.__version__)
    if off is not None:
        res["offload_stats"] = off.stats()
        print(off.describe(), flush=True)
    print("RESULT " + json.dumps(res), flush=True)
    torch.distributed.destroy_process_group()
    return res


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(shape, scheme, a, layers=0, sweep=False, steps=None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}  # else: the agent's store
    env = dict(env, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()), PYTHONUNBUFFERED="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--shape", shape, "--scheme", scheme,
           "--seq", str(a.seq), "--steps", str(steps or a.steps), "--warmup", str(a.warmup),
           "--layers", str(layers)] + (["--sweep"] if sweep else []) + (["--tiny"] if a.tiny else [])
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(a.run_timeout, p.kill)  # one hung run must not take the whole benchmark down
    timer.start()
    res = None
    for line in p.stdout:
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
        elif "UserWarning" not in line and "output = self._register" not in line:
            print(line, end="", flush=True)
    p.wait()
    timer.cancel()
    if res is None:
        res = dict(shape=shape, scheme=scheme, layers=layers, error=f"exit {p.returncode}")
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--shape", default="7b")
    ap.add_argument("--scheme", default="none")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="tiny dims: smoke-test the script (also on CPU)")
    ap.add_argument("--shapes", default="7b,1.5b")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--sweep-layers", default="4,8,16")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=7, help="total steps per run (first --warmup not timed)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--run-timeout", type=float, default=150.0, help="seconds before one run is killed")
    ap.add_argument("--json", default=os.environ.get("OUT") and os.path.join(os.environ["OUT"], "bench.json"))
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    if int(os.environ.get("RANK", "0")) != 0:
        return
    results, sweep = [], []

    def save():
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(results=results, sweep=sweep), f, indent=1)

    for shape in [x for x in a.shapes.split(",") if x]:
        for scheme in a.schemes.split(","):
            results.append(run_one(shape, scheme, a))
            save()
    layers = [int(x) for x in a.sweep_layers.split(",") if x]
    for scheme, ns in (("rlx_offload", layers), ("none", layers[:2])):
        for n in ns:
            sweep.append(run_one("7b", scheme, a, layers=n, sweep=True, steps=a.warmup + 2))
            save()
    print_table(results, sweep, a.seq)


def print_table(results, sweep, seq=8192):
    ref = {r["shape"]: r for r in results if r["scheme"] == "none" and "error" not in r}
    ckpt = {r["shape"]: r for r in results if r["scheme"] == "hf_ckpt" and "error" not in r}
    dev = next((r["device"] for r in results + sweep if "device" in r), "?")
    print(f"\n=== activation offload benchmark: FSDP2, bf16, batch 1, seq {seq}, {dev} ===")
    print(f"{'shape':>10} {'scheme':>22} {'peak GiB':>9} {'step s':>7} {'x hf_ckpt':>9} {'max |dloss|':>11}")
    for r in results:
        name = f"{r['shape']}x{r.get('layers', '?')}"
        if "error" in r:
            print(f"{name:>10} {r['scheme']:>22}  ERROR {r['error']}")
            continue
        n = ref.get(r["shape"])
        dl = max(abs(x - y) for x, y in zip(r["losses"][:6], n["losses"][:6])) if n else float("nan")
        c = ckpt.get(r["shape"])
        rel = r["step_s"] / c["step_s"] if c else float("nan")
        print(f"{name:>10} {r['scheme']:>22} {r['peak_gib']:9.2f} {r['step_s']:7.3f} {rel:9.3f} {dl:11.2e}")
    if sweep:
        print("\nlayer sweep at 7B dims (memory held at the end of forward above params+optimizer, and peak):")
        print(f"{'layers':>7} {'scheme':>12} {'fwd-held GiB':>13} {'peak GiB':>9} {'static GiB':>10} {'step s':>7}")
        for r in sweep:
            if "error" in r:
                print(f"{r['layers']:>7} {r['scheme']:>12}  ERROR {r['error']}")
                continue
            print(f"{r['layers']:>7} {r['scheme']:>12} {r['fwd_held_gib']:13.2f} {r['peak_gib']:9.2f} "
                  f"{r['static_gib']:10.2f} {r['step_s']:7.3f}")


if __name__ == "__main__":
    main()
