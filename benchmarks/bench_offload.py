"""Benchmark activation-offload schemes: one FSDP2 training step (fwd+bwd+AdamW), random Qwen2 weights, bf16.

    torchrun --nproc_per_node=1 benchmarks/bench_offload.py            # everything (about 5-8 min on one H100)
    torchrun --nproc_per_node=1 benchmarks/bench_offload.py --shapes 7b --schemes none,rlx_offload_ckpt

Needs only torch (>= 2.11) and transformers; imports nothing from rlx but rlx.offload. Each (shape, scheme)
runs in its own process, so one scheme's memory or pinned pool cannot affect the next. Prints, per run, the
loss after each step, then the peak GiB (torch.cuda.max_memory_allocated over the timed steps), the step
time (median of the timed steps), the GPU time of forward / backward / optimizer (CUDA events) and the host
time to return from forward, and a table last. `--profile` adds a cProfile of one more step's host time.
Schemes can be limited to one shape ("1.5b:rlx_offload_ckpt"); "none#2" runs `none` again (the loss difference
between two runs of one scheme is the noise floor of the dloss column; `--deterministic` removes it); rlx_offload* names are parsed by
`offload_config` (e.g. rlx_offload_ckpt_k1_nohead, rlx_offload_norb). The layer sweep (rlx_offload at 7B dims) prints the
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
SCHEMES = ["none", "hf_ckpt", "save_on_cpu", "rlx_offload", "rlx_offload_norb", "rlx_offload_ckpt", "rlx_offload_rmlp"]
# rlx_offload[_ckpt][_k<N>][_nohead][_p<N>][_rmlp]: the defaults of ActivationOffloadConfig, then
#   _ckpt: enable_gradient_checkpointing; _k<N>: keep_last_layers=N; _nohead: offload_head=False;
#   _p<N>: prefetch_layers=N; _rmlp: recompute_mlp=True (a different trade-off: the MLP is recomputed);
#   _norb: rebuild_pointwise=False (silu/mul outputs copied like everything else).
#   rlx_offload_ckpt_head (older name) = rlx_offload_ckpt_k0.


def offload_config(scheme: str):
    """(ActivationOffloadConfig kwargs, checkpointing) for a rlx_offload* scheme name."""
    parts = scheme.split("_")[2:]
    kw, ckpt = {}, False
    for p in parts:
        if p == "ckpt":
            ckpt = True
        elif p == "head":
            kw.update(keep_last_layers=0, offload_head=True)
        elif p == "nohead":
            kw["offload_head"] = False
        elif p == "rmlp":
            kw["recompute_mlp"] = True
        elif p == "norb":
            kw["rebuild_pointwise"] = False
        elif p[:1] == "k" and p[1:].isdigit():
            kw["keep_last_layers"] = int(p[1:])
        elif p[:1] == "p" and p[1:].isdigit():
            kw["prefetch_layers"] = int(p[1:])
        else:
            raise ValueError(f"unknown part {p!r} in scheme {scheme!r}")
    return kw, ckpt
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
    kind = a.scheme.split("#")[0]  # "none#2": a second run of `none` (run-to-run noise of the losses)
    if a.deterministic:  # deterministic kernels (cuBLAS workspace set by the launcher): losses reproducible
        torch.use_deterministic_algorithms(True)  # strict: SDPA picks its deterministic backward
        torch.utils.deterministic.fill_uninitialized_memory = False
    if kind == "hf_ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mesh = init_device_mesh(dev.type, (torch.distributed.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    off = None
    if kind.startswith("rlx_offload"):
        from rlx.offload import ActivationOffloadConfig, apply_activation_offload
        kw, ckpt = offload_config(kind)
        off = apply_activation_offload(model, ActivationOffloadConfig(**kw), enable_gradient_checkpointing=ckpt)
        print(off.describe(), flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(1234)
    data = [torch.randint(0, cfg.vocab_size, (1, a.seq), generator=gen).to(dev) for _ in range(a.steps)]
    losses, times, fwd_held, phases = [], [], [], []
    ev = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else None
    static = 0
    for step, ids in enumerate(data):
        if step == a.warmup and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        sync()
        static = mem()
        t0 = time.perf_counter()
        marks = [ev() for _ in range(4)] if cuda else None
        if cuda:
            marks[0].record()
        if kind == "save_on_cpu":
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
            host_fwd = time.perf_counter() - t0
            if cuda:
                marks[1].record()
            loss.backward()
            if cuda:
                marks[2].record()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            marks[3].record()
        sync()
        dt = time.perf_counter() - t0
        if cuda and step >= a.warmup:  # GPU time of forward / backward / optimizer, and host time of forward
            phases.append([marks[i].elapsed_time(marks[i + 1]) / 1e3 for i in range(3)] + [host_fwd])
        losses.append(loss.item())
        if step >= a.warmup:
            times.append(dt)
        print(f"[{a.shape} x{shape['num_hidden_layers']} {a.scheme}] step {step} loss {losses[-1]:.6f} "
              f"time {dt:.3f}s", flush=True)
    res = dict(shape=a.shape, layers=shape["num_hidden_layers"], scheme=a.scheme, losses=losses,
               peak_gib=(torch.cuda.max_memory_allocated() if cuda else 0) / GiB, step_s=statistics.median(times),
               static_gib=static / GiB,
               phases_s=[statistics.median(x) for x in zip(*phases)] if phases else None, fwd_held_gib=(max(fwd_held) / GiB if fwd_held else None),
               device=torch.cuda.get_device_name() if cuda else "cpu", torch=torch.__version__, transformers=transformers.__version__)
    if a.profile:  # host-side profile of one more step: where the Python/host time of forward+backward goes
        import cProfile
        import pstats
        sync()
        pr = cProfile.Profile()
        ctx = off.activate() if off is not None else torch.enable_grad()
        pr.enable()
        with ctx:
            loss = model(input_ids=data[0], labels=data[0]).loss
            loss.backward()
        pr.disable()
        opt.zero_grad(set_to_none=True)
        sync()
        print(f"[{a.shape} {a.scheme}] host profile of one forward+backward (top by own time):", flush=True)
        pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(22)
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
    if a.deterministic:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--shape", shape, "--scheme", scheme,
           "--seq", str(a.seq), "--steps", str(steps or a.steps), "--warmup", str(a.warmup),
           "--layers", str(layers)] + (["--sweep"] if sweep else []) + (["--tiny"] if a.tiny else []) + \
        (["--profile"] if a.profile else []) + (["--deterministic"] if a.deterministic else [])
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
    ap.add_argument("--profile", action="store_true", help="cProfile one extra step's host time per run")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch.use_deterministic_algorithms for every run (losses comparable exactly across runs)")
    ap.add_argument("--tiny", action="store_true", help="tiny dims: smoke-test the script (also on CPU)")
    ap.add_argument("--shapes", default="7b,1.5b")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--sweep-layers", default="4,8,16")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=10, help="total steps per run (first --warmup not timed)")
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
        for scheme in [x for x in a.schemes.split(",") if x]:
            if ":" in scheme:  # "1.5b:rlx_offload_ckpt" runs for that shape only
                only, scheme = scheme.split(":", 1)
                if only != shape:
                    continue
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
    print("(dloss: against `none`, or against hf_ckpt (marked *) when `none` was not run; fwd/bwd/opt: GPU time "
          "of each phase, host fwd: host time to return from forward, medians)")
    print(f"{'shape':>10} {'scheme':>24} {'peak GiB':>9} {'step s':>7} {'x hf_ckpt':>9} {'max |dloss|':>12} "
          f"{'fwd':>6} {'bwd':>6} {'opt':>6} {'host fwd':>8} {'GB moved':>8} {'GB rebuilt':>10}")
    for r in results:
        name = f"{r['shape']}x{r.get('layers', '?')}"
        if "error" in r:
            print(f"{name:>10} {r['scheme']:>24}  ERROR {r['error']}")
            continue
        n, mark = ref.get(r["shape"]), " "
        if n is None:
            n, mark = ckpt.get(r["shape"]), "*"
        dl = max(abs(x - y) for x, y in zip(r["losses"][:6], n["losses"][:6])) if n else float("nan")
        c = ckpt.get(r["shape"])
        rel = r["step_s"] / c["step_s"] if c else float("nan")
        ph = r.get("phases_s") or [float("nan")] * 4
        moved = (r.get("offload_stats") or {}).get("moved_bytes_last_step", 0) / 1e9
        rebuilt = (r.get("offload_stats") or {}).get("rebuilt_bytes_last_step", 0) / 1e9
        print(f"{name:>10} {r['scheme']:>24} {r['peak_gib']:9.2f} {r['step_s']:7.3f} {rel:9.3f} {dl:11.2e}{mark} "
              f"{ph[0]:6.3f} {ph[1]:6.3f} {ph[2]:6.3f} {ph[3]:8.3f} {moved:8.2f} {rebuilt:10.2f}")
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
