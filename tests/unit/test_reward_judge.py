"""The generative reward model (`reward_model.judge.*`): the verdict parser on malformed outputs, the judging prompt,
the judge generating with the HF engine on the built-in tiny model (its scores are what parsing its own greedy
verdicts gives), validation, and GRPO scored by the judge through the entry point (2 CPU workers)."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from rlx.config.judge import TEMPLATE, TEMPLATE_WITH_REFERENCE
from rlx.reward.judge import fill_template, parse_score, question_of, render_chat
from rlx.models import resolve_model_path
from rlx.protocol import Batch

from conftest import load_config

JUDGE = ["reward_model.enable=True", "reward_model.model.path=builtin://tiny-qwen2", "reward_model.judge.enable=True",
         "reward_model.rollout.name=hf"]


# ---------------------------------------------------------------------------------------------- the parser
@pytest.mark.parametrize("verdict,expected", [
    ("Score: 7", 7.0),
    ("The answer is right.\nScore: 9", 9.0),
    ("score=3.5", 3.5),
    ("My final rating is 8 because the reasoning holds.", 8.0),
    ("GRADE: 4/10", 4.0),
    ("7/10", 7.0),                                          # a denominator is not the score
    ("I'd give it 6 out of 10.", 6.0),
    ("The student says 42 but it is 40. Score: 2", 2.0),    # the keyword wins over later/earlier numbers
    ("Score: 3. On reflection, Score: 5", 5.0),             # several keyed scores: the last
    ("The student says 42 but it is 40, so 1", 1.0),        # no keyword: the last number
    ("<think>maybe Score: 9</think>\nScore: 2", 2.0),       # the reasoning part is not read
    ("<think>Score: 9</think> no idea", None),              # nothing after the reasoning
    ("no number here", None),
    ("", None),
    ("Score: 11", None),                                    # out of [0, 10]
    ("Score: -1", None),
    ("Score: 10", 10.0),                                    # the bounds are in range
    ("Score:0", 0.0),
    ("Answer: 123456", None),                               # no keyword, last number out of range
])
def test_parse_score(verdict, expected):
    assert parse_score(verdict, 0.0, 10.0) == expected


def test_parse_score_other_range():
    assert parse_score("rating: 0.25", 0.0, 1.0) == 0.25
    assert parse_score("rating: 3", 0.0, 1.0) is None
    assert parse_score("Score: -2", -5.0, 5.0) == -2.0


# ---------------------------------------------------------------------------------------------- the prompt
def test_question_of_prefers_extra_info_then_last_user_message():
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1?"},
            {"role": "assistant", "content": "2"}, {"role": "user", "content": "2+2?"}]
    assert question_of(chat, "rendered", {"question": "What is 3+3?"}) == "What is 3+3?"
    assert question_of(chat, "rendered", {}) == "2+2?"
    assert question_of(None, "rendered text", None) == "rendered text"


def test_fill_template_builtin_and_custom():
    cfg = load_config(JUDGE).reward_model.judge
    with_ref = fill_template(cfg, "2+2?", "It is 4.", "4")
    assert with_ref == TEMPLATE_WITH_REFERENCE.format(question="2+2?", response="It is 4.", ground_truth="4",
                                                      min_score=0, max_score=10)
    assert "Reference answer (known to be correct):\n4\n" in with_ref and "from 0 (wrong) to 10" in with_ref
    no_ref = fill_template(cfg, "2+2?", "It is 4.", None)
    assert no_ref == TEMPLATE.format(question="2+2?", response="It is 4.", min_score=0, max_score=10)
    custom = load_config(JUDGE + ["reward_model.judge.prompt_template='Q={question} A={response} T={ground_truth} "
                                  "{{0..{max_score}}}'", "reward_model.judge.max_score=5.5"]).reward_model.judge
    assert fill_template(custom, "q", "a", 7) == "Q=q A=a T=7 {0..5.5}"
    assert fill_template(custom, "q", "a", None) == "Q=q A=a T= {0..5.5}"


def test_render_chat_uses_the_judges_chat_template():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin://tiny-qwen2"))
    # the tiny model's template writes each message's content, nothing else
    assert render_chat(tok, "Rate: 1+1=2") == tok("Rate: 1+1=2", add_special_tokens=False)["input_ids"]
    tok.chat_template = ("{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<|bos|>assistant:{% endif %}")
    ids = render_chat(tok, "hi")
    assert tok.decode(ids) == "<|bos|>user: hi<|bos|>assistant:"
    tok.chat_template = None
    assert render_chat(tok, "hi") == tok("hi")["input_ids"]


# ---------------------------------------------------------------------------------------------- the judge
def _obj(values):
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _batch(tok, questions, responses, truths, width=12) -> Batch:
    """A generated batch as the trainer hands it over: right-padded responses (EOS kept), their mask."""
    ids = torch.full((len(responses), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(responses), width), dtype=torch.long)
    for i, r in enumerate(responses):
        row = (tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])[:width]
        ids[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
    return Batch({"responses": ids, "response_mask": mask},
                 {"raw_prompt": _obj(questions), "ground_truth": _obj(truths),
                  "extra_info": _obj([{} for _ in questions])})


@pytest.fixture(scope="module")
def hf_judge():
    from transformers import AutoTokenizer

    from rlx.workers.judge import Judge

    cfg = load_config(JUDGE + ["reward_model.rollout.response_length=10", "trainer.n_gpus_per_node=1",
                               "reward_model.judge.prompt_template='{question} {response} {ground_truth} Score:'"])
    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin://tiny-qwen2"))
    return Judge(cfg, tok, rank=0, world_size=1, device=torch.device("cpu"), engine="hf"), tok


def test_judge_scores_its_own_greedy_verdicts(hf_judge):
    """The judge's score of each response is what parsing its greedy verdict gives, the verdict being what HF's
    own generate writes for the judging prompt alone (unpadded)."""
    from transformers import AutoModelForCausalLM

    judge, tok = hf_judge
    batch = _batch(tok, ["1 2 3", "9 9", "4 0 4 0"], ["3", "18 is it", "8080"], ["3", "18", None])
    out = judge.score(batch)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("builtin://tiny-qwen2"), torch_dtype=torch.float32)
    expected_prompts = ["1 2 3 3 3 Score:", "9 9 18 is it 18 Score:", "4 0 4 0 8080  Score:"]
    for i, text in enumerate(expected_prompts):
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
        verdict = tok.decode(gen.tolist(), skip_special_tokens=True)
        assert out["judge_verdict"][i] == verdict
        parsed = parse_score(verdict, 0.0, 10.0)
        assert out["judge_score"][i].item() == (0.0 if parsed is None else parsed)
        assert out["judge_failed"][i].item() == float(parsed is None)
        assert out["judge_tokens"][i].item() == len(gen[gen != tok.pad_token_id])
    assert out["judge_prompt_cut"].sum() == 0


def test_judge_scores_known_verdicts(hf_judge, monkeypatch):
    """Forced verdicts (the engine's generate replaced): the parsed score on the last valid token, failures scored
    reward_model.judge.failure_score and counted."""
    from rlx.reward.rm_inputs import place_scores
    from rlx.reward.judge import judge_metrics

    judge, tok = hf_judge
    verdicts = ["Good work. Score: 8", "hmm", "Score: 12", "<think>9?</think>6/10"]
    # the first ends with EOS; the last is cut at response_length=10 tokens (no EOS), the others end early
    ids = [tok(v, add_special_tokens=False)["input_ids"] for v in verdicts]
    ids[0].append(tok.eos_token_id)
    ids[3] = ids[3][:10]
    monkeypatch.setattr(judge, "generate", lambda prompts: ids)
    monkeypatch.setattr(judge.judge_cfg, "failure_score", -1.0)
    batch = _batch(tok, ["a", "b", "c", "d"], ["1", "22", "333", "4"], [None] * 4, width=5)
    out = judge.score(batch)
    assert list(out["judge_verdict"]) == ["Good work. Score: 8", "hmm", "Score: 12", "<think>9?<"]
    assert out["judge_score"].tolist() == [8.0, -1.0, -1.0, 9.0]  # "<think>9?<": no closing tag, so 9 is read
    scores = place_scores(out.tensors.pop("judge_score"), batch["response_mask"])
    assert scores.tolist() == [[0, 8.0, 0, 0, 0], [0, 0, -1.0, 0, 0], [0, 0, 0, -1.0, 0], [0, 9.0, 0, 0, 0]]
    m = judge_metrics(out)
    assert m["reward/judge_parse_failures"] == 2.0 and m["reward/judge_parse_failure_ratio"] == 0.5
    assert m["reward/judge_verdicts_clipped"] == 1.0 and m["reward/judge_prompts_cut"] == 0.0
    assert m["reward/judge_verdict_length/mean"] == (20 + 3 + 9 + 10) / 4  # one token per byte, the EOS too


def test_a_custom_reward_function_combines_the_judge_with_a_rule(hf_judge, monkeypatch, tmp_path):
    """judge.enable with custom_reward_function.path (verl's hybrid: its function calls the judge itself): the
    function finds the judge's score and verdict in extra_info and its return value is the reward."""
    from rlx.reward.judge import with_judge_results
    from rlx.reward.functions import load_reward_fn
    from rlx.reward.manager import build_reward_manager
    from rlx.reward.rm_inputs import place_scores

    judge, tok = hf_judge
    ids = [tok(v, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for v in ("Score: 8", "Score: 2", "?")]
    monkeypatch.setattr(judge, "generate", lambda prompts: ids)
    f = tmp_path / "hybrid.py"
    f.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                 "    rule = float(solution_str.strip() == ground_truth)\n"
                 "    return {'score': rule + extra_info['judge_score'] / 10, 'said': extra_info['judge_verdict'],\n"
                 "            'kept': extra_info['kept']}\n")
    batch = _batch(tok, ["1+1", "2+2", "3+3"], ["2", "5", "6"], ["2", "4", "6"], width=4)
    batch.non_tensors["data_source"] = _obj(["x"] * 3)
    batch.non_tensors["extra_info"] = _obj([{"kept": i} for i in range(3)])
    judged = judge.score(batch)
    judged.tensors["rm_scores"] = place_scores(judged["judge_score"], batch["response_mask"])
    cfg = load_config(JUDGE + [f"custom_reward_function.path={f}", "reward_model.num_workers=1"])  # in this process
    manager = build_reward_manager(cfg, tok, load_reward_fn(cfg.custom_reward_function))
    scores, extra = manager(with_judge_results(batch, judged))
    torch.testing.assert_close(scores.sum(-1), torch.tensor([1.8, 0.2, 1.0]))  # rule + judge / 10 (a failure: 0)
    assert extra["said"] == ["Score: 8", "Score: 2", "?"] and extra["kept"] == [0, 1, 2]
    assert batch["extra_info"][0] == {"kept": 0}  # the batch's own rows unchanged


def test_judge_prompt_longer_than_prompt_length_keeps_its_end(hf_judge, monkeypatch):
    judge, tok = hf_judge
    monkeypatch.setattr(judge, "prompt_length", 8)
    prompts, cut = judge.prompts(_batch(tok, ["a long question"], ["x"], [None]))
    assert cut == [1.0]
    assert prompts[0] == tok("a long question x  Score:", add_special_tokens=False)["input_ids"][-8:]


# ---------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("extra,message", [
    (["reward_model.enable=False"], "reward_model.judge.enable=True needs reward_model.enable=True"),
    (["reward_model.judge.prompt_template='{question} only'"], r"has no \['response'\] field"),
    (["reward_model.judge.prompt_template='{question} {response} {answer}'"], r"names \['answer'\]"),
    (["reward_model.judge.prompt_template='{question} {response} {'"], "cannot be read as a str.format template"),
    (["reward_model.judge.min_score=5", "reward_model.judge.max_score=5"], "min_score=5.0 must be below"),
    (["reward_model.judge.do_sample=True", "reward_model.judge.temperature=0"], "temperature=0.0 must be positive"),
    (["reward_model.rollout.load_format=dummy"], "load_format='dummy' gives the judge random weights"),
    (["reward_model.rollout.tensor_model_parallel_size=2"], "tensor_model_parallel_size=2 needs GPUs"),
    (["reward_model.rollout.tensor_model_parallel_size=3"], "tensor_model_parallel_size=3 must divide"),
    (["reward_model.rollout.response_length=0"], "reward_model.rollout.response_length=0 must be positive"),
    (["reward_model.rollout.max_model_len=100", "reward_model.rollout.prompt_length=64",
      "reward_model.rollout.response_length=64"], "max_model_len=100 is smaller"),
    (["reward_model.rollout.name=sglang"], "reward_model.rollout.name='sglang'"),
    (["+reward_model.model.override_config.num_hidden_layers=1"], "override_config=.* is applied to a classifier"),
])
def test_validation_names_the_key_and_the_fix(extra, message):
    with pytest.raises(ValueError, match=message) as e:
        load_config(JUDGE + extra)
    assert "Fix" in str(e.value) or "must" in str(e.value)


def test_a_verl_reward_loop_judge_function_is_refused_by_name(tmp_path):
    """verl's GenRM custom functions call the judge's HTTP router (reward_router_address): refused at load, with
    rlx's judge as the fix."""
    from rlx.config.schema import CustomRewardFunctionConfig
    from rlx.reward.functions import load_reward_fn

    f = tmp_path / "genrm.py"
    f.write_text("async def compute_score(data_source, solution_str, ground_truth, extra_info, reward_router_address,"
                 " reward_model_tokenizer):\n    return 0.0\n"
                 "def optional(data_source, solution_str, ground_truth, extra_info, reward_router_address=None):\n"
                 "    return 1.0\n")
    with pytest.raises(ValueError, match="takes reward_router_address.*reward_model.judge.enable=True"):
        load_reward_fn(CustomRewardFunctionConfig(path=str(f)))
    assert load_reward_fn(CustomRewardFunctionConfig(path=str(f), name="optional"))("s", "x", "y", {}) == 1.0


def test_judge_without_reward_model_is_refused():
    with pytest.raises(ValueError, match="needs reward_model.enable=True"):
        load_config(["reward_model.judge.enable=True"])
