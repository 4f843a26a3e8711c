"""benchmarks/bench_floor.py: the FLOPs of a forward worked by hand, and the floor table from a metrics file shaped as
a resumed GPU run writes it (the job run, vLLM alone and the launch split on a real run: tests/e2e/test_bench_floor.py).
"""
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import bench_floor  # noqa: E402
from bench_floor import Dims, Hardware, Job  # noqa: E402

TINY = Dims(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=10, tied=False)


def test_forward_flops_by_hand():
    # one layer's matmul weights: q 8x8 + o 8x8 + k 8x4 + v 8x4 + MLP 3 x 8x16 = 64 + 64 + 32 + 32 + 384 = 576
    assert TINY.layer_matmul_params == 576
    # a sequence of 3 tokens, 2 of them response: 3 tokens x 2 FLOP x 576 x 2 layers = 6912; the head at the 2
    # response positions: 2 x 2 x 8 x 10 = 320; attention: 2 layers x 2 x 2 heads x 4 x (3 x 4 causal pairs x 2) =
    # 32 x 12 = 384
    assert bench_floor.forward_flops(TINY, [3], [2]) == 6912 + 320 + 384
    # a critic's value head instead of the LM head: 2 x 2 x 8 x 1 = 32
    assert bench_floor.forward_flops(TINY, [3], [2], value_head=True) == 6912 + 32 + 384
    # sequences add up; one token with no response: its body and attention over 1 x 2 pairs
    assert bench_floor.forward_flops(TINY, [3, 1], [2, 0]) == 7616 + 2304 + 64
    # Qwen2.5-0.5B (the GRPO recipe's model): HF counts 494,032,768 parameters; 2 x 357,826,560 layer FLOPs a token
    qwen = bench_floor.load_dims("qwen2.5-0.5b")
    assert qwen.params == 494_032_768
    assert 2 * qwen.layer_matmul_params * qwen.layers == 715_653_120


def _step(step: int, old: float, **extra) -> dict:
    """A step of 512 rows of 100 + 300 tokens; `old` seconds of old log-prob, the rest in proportion."""
    return {"step": step, "perf/total_num_tokens": 512 * 400, "prompt_length/mean": 100.0,
            "response_length/mean": 300.0, "timing_s/old_log_prob": old, "timing_s/ref": old,
            "timing_s/update_actor": 4 * old, "timing_s/gen": 6.4 * old, "timing_s/rollout/generate": 6 * old,
            "timing_s/rollout/sync": old / 7.5, "timing_s/step": 12.827 * old, **extra}


LAUNCH = {"timing_s/launch/before_ray": 9.0, "timing_s/launch/ray_init": 4.0, "timing_s/launch/workers": 8.0,
          "timing_s/launch/init_actor": 60.0, "timing_s/launch/rollout_engine": 40.0,
          "timing_s/launch/validation": 22.0, "timing_s/launch/total": 105.0}


@pytest.fixture
def metrics(tmp_path):
    """Two runs in one file, as a resumed run appends: each run's first step is slow (left out with --skip 1)."""
    records = [{"step": 0, "val/x/reward/mean": 0.1},
               _step(1, 100.0, **{k: v / 2 for k, v in LAUNCH.items()}), _step(2, 1.0), _step(3, 2.0),
               {"step": 2, "val/x/reward/mean": 0.2},  # resumed from step 2: validation, then steps 3 and 4
               _step(3, 50.0, **LAUNCH), _step(4, 1.5)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(path)


def test_table_from_metrics(metrics):
    from rlx.trainer.phases import read

    records = read(metrics)
    m, steps = bench_floor.steady_mean(records, skip=1)
    assert steps == [2, 3, 4]  # the first step of each run left out
    assert m["timing_s/old_log_prob"] == pytest.approx(1.5)
    qwen = bench_floor.load_dims("qwen2.5-0.5b")
    hw = Hardware("H100", 989.0, 3350.0, "spec")
    alone = dict(tokens_per_s=20_000.0, build_s=30.0)
    rows = {r[0]: r[1:] for r in bench_floor.floor_rows(m, qwen, None, Job(), hw, alone,
                                                        bench_floor.launch_record(records))}
    # by hand: a row of 400 tokens, 300 response: 400 x 715,653,120 + 300 x 2 x 896 x 151,936 (the head) +
    # 2 x 24 x 14 x 64 x 400 x 401 (attention) = 374,840,524,800 FLOP; 512 rows: 1.919e14 FLOP; at 50% of 989
    # TFLOP/s: 0.388 s; measured 1.5 s: 128 TFLOP/s, 12.9% of the peak, 3.86 x the floor
    fwd = 512 * 374_840_524_800
    assert bench_floor.mean_forward_flops(qwen, m) == fwd
    assert rows["old log-prob (forward)"] == ("1.50 s (127.9 TFLOP/s, 12.9% of peak)", "0.39 s (1.92e+14 FLOP)",
                                              "3.86")
    assert rows["ref log-prob (forward)"][2] == "3.86"
    # the update: 3 x the forward (backward = 2 x forward), 6.0 s against 1.164 s
    assert rows["update actor (fwd + bwd, ppo_epochs=1)"] == ("6.00 s (95.96 TFLOP/s, 9.7% of peak)",
                                                               "1.16 s (5.76e+14 FLOP)", "5.15")
    # generation: 512 x 300 tokens at vLLM alone's 20,000 tok/s = 7.68 s; gen took 9.6 s
    assert rows["generate (gen: wake, sync, generate, sleep)"] == ("9.60 s (16,000 tok/s)",
                                                                    "7.68 s (vLLM alone: 20,000 tok/s)", "1.25")
    assert rows["gen: the engine's generate"] == ("9.00 s (17,067 tok/s)", "7.68 s", "1.17")
    # the weight sync: 494,032,768 bf16 params = 0.988 GB in 0.2 s; the floor reads and writes them at 3350 GB/s
    assert rows["weight sync"] == ("0.20 s (4.94 GB/s)", "0.6 ms (0.988 GB read + written at 3350 GB/s)", "339")
    # the step's floor: the phases' floors summed, 7.68 + 0.388 + 0.388 + 1.164 = 9.62 s; the step took 19.24 s
    assert rows["step"] == ("19.24 s", "9.62 s (the floors above)", "2.00")
    # the launch: the second run's (the last that logged it), in the launch's order, the total last
    launch = [k for k in rows if k.startswith("launch: ")]
    assert launch == ["launch: before_ray", "launch: ray_init", "launch: workers", "launch: init_actor",
                      "launch: rollout_engine", "launch: validation", "launch: total"]
    assert rows["launch: total"] == ("105.00 s", "-", "-")
    assert rows["launch: rollout_engine"] == ("40.00 s", "30.00 s (vLLM alone's build)", "1.33")
    # without vLLM alone: no generation floor, so the step's floor is a lower bound without a ratio
    rows = {r[0]: r[1:] for r in bench_floor.floor_rows(m, qwen, None, Job(), hw)}
    assert rows["generate (gen: wake, sync, generate, sleep)"][1:] == ("vLLM alone: not measured (--vllm-alone)",
                                                                        "-")
    assert rows["step"] == ("19.24 s", "> 1.94 s (generation not measured)", "-")
    # two GPUs: each holds half the tokens and brings its own peak
    rows = {r[0]: r[1:] for r in bench_floor.floor_rows(m, qwen, None, Job(gpus=2), hw)}
    assert rows["old log-prob (forward)"] == ("1.50 s (63.97 TFLOP/s, 6.5% of peak)", "0.19 s (1.92e+14 FLOP)",
                                              "7.73")


def test_skip_that_leaves_no_step_names_the_flag(metrics):
    from rlx.trainer.phases import read

    with pytest.raises(ValueError, match="--skip 3 leaves no step"):
        bench_floor.steady_mean(read(metrics), skip=3)


def test_peak_by_gpu_name_or_given():
    def hw(**kw):
        args = dict(gpu=None, peak_tflops=None, memory_gbs=None)
        args.update(kw)
        return bench_floor.hardware(type("Args", (), args))

    h200 = hw(gpu="NVIDIA H200")
    assert (h200.peak_tflops, h200.memory_gbs) == (989.0, 4800.0)
    pcie = hw(gpu="NVIDIA H100 PCIe")
    assert (pcie.peak_tflops, pcie.memory_gbs) == (756.0, 2000.0)
    given = hw(gpu="NVIDIA H100 80GB HBM3", peak_tflops="790")
    assert (given.peak_tflops, given.memory_gbs, given.source) == (790.0, 3350.0, "--peak-tflops")
    with pytest.raises(ValueError, match="--peak-tflops"):
        hw(gpu="Some Future GPU")


def test_model_dims_from_a_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 8, "intermediate_size": 16,
                                "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 10}))
    assert bench_floor.load_dims(str(tmp_path)) == Dims(2, 8, 16, 2, 1, 4, 10, False)
    with pytest.raises(ValueError, match="--model-config"):
        bench_floor.load_dims(str(tmp_path / "nope"))
