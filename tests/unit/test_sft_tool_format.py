"""scripts/sft_tool_format.py (the format warm start of the GSM8K tool recipe) on CPU: the loss mask is exactly
the assistant's tokens of the tool agent's trajectory (hand-checked), a tiny random model learns to write a hermes
call the parser accepts, and the recipe (examples/multiturn/run_grpo_gsm8k_tool.sh) run with the warmed model on CPU
calls the tool through the HF async engine."""
import os
import random
import sys

import pytest
import torch

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))
import prepare_gsm8k  # noqa: E402
import sft_tool_format as sft  # noqa: E402

# The recipe's tool with a one-word description and rows without the system message: the same format in ~600
# byte tokens instead of ~950, so that CPU training stays short.
SHORT_TOOLS = """tools:
  - class_name: rlx.workers.rollout.agent.gsm8k_tool.Gsm8kTool
    config: {type: native}
    tool_schema: {type: function, function: {name: calc_gsm8k_reward, description: check,
                  parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}}}
"""


def byte_tokenizer():
    from rlx.models import build_byte_tokenizer

    tok = build_byte_tokenizer()
    assert sft.ensure_tool_template(tok)  # the byte tokenizer's own template ignores tools
    return tok


def test_loss_mask_is_exactly_the_assistant_turns():
    tok = byte_tokenizer()
    row = prepare_gsm8k.convert_rows([{"question": "2+3?", "answer": "so 5\n#### 5"}], "train", multi_turn=True)[0]
    ex = sft.build_examples(sft.make_loop(tok), [row], random.Random(0), p_right=1.0)[0]
    schema = ('{"name": "calc_gsm8k_reward", "description": "Check an answer to the GSM8K problem: reward 1.0 when it '
              'is right, 0.0 otherwise.", "parameters": {"type": "object", "properties": {"answer": {"type": '
              '"string", "description": "The final answer, a number"}}, "required": ["answer"]}}')
    call = '<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "5"}}\n</tool_call>'
    pieces = [  # (text, in the loss)
        ("<|im_start|>system\n" + prepare_gsm8k.TOOL_SYSTEM + "\n\n# Tools\nCall a function by writing <tool_call>\n"
         '{"name": <function name>, "arguments": <JSON object>}\n</tool_call>\nFunctions:\n' + schema + "\n<|eos|>\n"
         "<|im_start|>user\n2+3? " + prepare_gsm8k.INSTRUCTION + "<|eos|>\n<|im_start|>assistant\n", 0),
        (call + "<|eos|>", 1),
        ("\n<|im_start|>tool\nCurrent parsed answer='5' reward=1.0<|eos|>\n<|im_start|>assistant\n", 0),
        ("#### 5<|eos|>", 1)]
    ids, mask = [], []
    for text, m in pieces:
        t = tok(text, add_special_tokens=False)["input_ids"]
        ids += t
        mask += [m] * len(t)
    assert ex["input_ids"] == ids and ex["loss_mask"] == mask
    # byte tokens: the call is 11 + 1 + 59 + 1 + 12 characters, then EOS; "#### 5" is 6, then EOS
    assert sum(ex["loss_mask"]) == (84 + 1) + (6 + 1)
    assert [i for i, m in zip(ids, mask) if m].count(tok.eos_token_id) == 2


def test_a_wrong_first_answer_still_ends_with_the_ground_truth():
    tok = byte_tokenizer()
    row = prepare_gsm8k.convert_rows([{"question": "2+3?", "answer": "#### 5"}], "train", multi_turn=True)[0]
    ex = sft.build_examples(sft.make_loop(tok), [row], random.Random(0), p_right=0.0)[0]
    text = tok.decode(ex["input_ids"])
    assert "reward=0.0" in text and '"answer": "5"' not in text and text.endswith("#### 5<|eos|>")
    # the masked-out middle (the tool's turn) is the tool's reply, between the two assistant turns
    masked = tok.decode([i for i, m in zip(ex["input_ids"], ex["loss_mask"]) if m])
    assert masked.startswith("<tool_call>\n") and masked.endswith("</tool_call><|eos|>#### 5<|eos|>")


def test_sft_loss_is_the_mean_over_masked_next_tokens():
    """Hand-computed: a 1-layer model's logits at the masked positions, cross-entropy by hand."""
    model = tiny_model(byte_tokenizer(), hidden=32, layers=1)
    ids = torch.tensor([[5, 6, 7, 8, 0]])
    batch = {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 1, 0]]),
             "loss_mask": torch.tensor([[0, 0, 1, 1, 0]], dtype=torch.bool)}
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=batch["attention_mask"]).logits[0]
        lp = torch.log_softmax(logits.float(), -1)
        expected = -(lp[1, 7] + lp[2, 8]) / 2  # tokens 2 and 3 are predicted at positions 1 and 2
        assert torch.allclose(sft.sft_loss(model, batch), expected, atol=1e-5)


def tiny_model(tok, hidden=128, layers=2):
    import transformers

    cfg = transformers.AutoConfig.for_model(
        "qwen2", vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def write_rows(path, n, seed):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    pairs = [(rng.randint(1, 60), rng.randint(1, 60)) for _ in range(n)]
    rows = prepare_gsm8k.convert_rows([{"question": f"What is {a} + {b}?", "answer": f"#### {a + b}"}
                                       for a, b in pairs], "train", multi_turn=True)
    for r in rows:
        r["prompt"] = r["prompt"][1:]  # no system message (see SHORT_TOOLS)
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """The warm start through the script's own entry (rows from parquet, tiny random model dir in, model dir out)."""
    root = tmp_path_factory.mktemp("sft")
    from rlx.models import build_byte_tokenizer

    tok = build_byte_tokenizer()  # its template ignores tools, as a random-weight directory's: the script replaces it
    tiny_model(tok).save_pretrained(root / "random")
    tok.save_pretrained(root / "random")
    (root / "tools.yaml").write_text(SHORT_TOOLS)
    (root / "data").mkdir()
    write_rows(root / "data" / "train.parquet", 64, seed=0)
    write_rows(root / "data" / "test.parquet", 8, seed=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is faster than several on a shared CPU
    try:
        result = sft.run(sft.parse_args([
            "--model", str(root / "random"), "--data", str(root / "data" / "train.parquet"),
            "--eval_data", str(root / "data" / "test.parquet"), "--output_dir", str(root / "warm"),
            "--tool_config", str(root / "tools.yaml"), "--steps", "100", "--batch_size", "4", "--lr", "5e-3",
            "--eval_rows", "8", "--max_new_tokens", "90", "--device", "cpu"]))
    finally:
        torch.set_num_threads(threads)
    return root, result


def test_warm_start_learns_a_parsable_tool_call(warmed):
    root, result = warmed
    losses = result["losses"]
    assert sum(losses[:3]) / 3 > 4.0  # ~ln(259) at random
    assert sum(losses[-5:]) / 5 < 0.5
    assert result["before"]["parsable"] == 0.0
    assert result["after"]["parsable"] >= 0.75 and result["after"]["right_tool"] >= 0.75
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(root / "warm")
    assert saved.chat_template == sft.TOOL_TEMPLATE
    assert (root / "warm" / "config.json").exists()
