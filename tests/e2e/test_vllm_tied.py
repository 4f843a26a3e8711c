"""End-to-end half of tests/unit/test_vllm_tied.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

from e2e.test_vllm_rollout import P, R, EOS, PAD, PROMPTS, left_padded, prompt_batch, rollout_cfg  # noqa: E402
from unit.test_vllm_tied import tied_llama  # noqa: F401 -- fixtures


def test_tied_model_synced_into_a_dummy_engine_generates_like_hf(tied_llama):
    import torch.distributed as dist

    from rlx.workers.rollout import build_rollout

    path, model, tok = tied_llama
    had_group = dist.is_initialized()
    assert tok.pad_token_id == PAD and tok.eos_token_id == EOS
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names  # what the actor's weight iterator yields for a tied model
    rollout = build_rollout("vllm", model_path=path, rollout_cfg=rollout_cfg(load_format="dummy"),
                            max_prompt_length=P, max_response_length=R, rank=0, world_size=1, pad_token_id=PAD,
                            eos_token_id=EOS, dtype="float32", device="cpu")
    try:
        rollout.sync_weights((n, p.detach()) for n, p in model.named_parameters())
        ids, mask = left_padded(tok, PROMPTS)
        out = rollout.generate_sequences(prompt_batch(ids, mask, n=1, do_sample=False))
        hf = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=R,
                            eos_token_id=EOS, pad_token_id=PAD)[:, P:]
        hf = torch.nn.functional.pad(hf, (0, R - hf.shape[1]), value=PAD).masked_fill(out["response_mask"] == 0, PAD)
        assert torch.equal(out["responses"], hf), f"vLLM {out['responses'].tolist()}\nHF   {hf.tolist()}"
    finally:
        rollout.shutdown()
        if dist.is_initialized() and not had_group:  # the engine's own one-rank group (external launcher)
            dist.destroy_process_group()
