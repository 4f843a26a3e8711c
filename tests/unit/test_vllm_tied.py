"""A model with tied input/output embeddings (SmolLM2, Qwen2.5-0.5B) in the vLLM rollout on CPU: the engine starts
from dummy weights (verl's dummy load format) and the actor's parameters, which name the shared tensor once
(``model.embed_tokens.weight``), must make it generate what HF generates."""
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

from rlx.workers.rollout.vllm_rollout import with_tied_head  # noqa: E402


def test_with_tied_head_names_the_head_after_the_embedding():
    e, n = torch.ones(2), torch.zeros(2)
    got = list(with_tied_head(iter([("model.embed_tokens.weight", e), ("model.norm.weight", n)])))
    assert [k for k, _ in got] == ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
    assert got[1][1] is e


@pytest.fixture
def tied_llama(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlx.models import build_byte_tokenizer

    tok = build_byte_tokenizer()
    cfg = AutoConfig.for_model("llama", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                               max_position_embeddings=128, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
                               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # a sharper distribution than the init's, so greedy tokens differ from row to row
        model.model.embed_tokens.weight.mul_(20)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return str(tmp_path), model.eval(), tok
