"""GSM8K reward, reward dispatch / custom reward loading, RewardManager, and scripts/prepare_gsm8k.py."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rlx.config.schema import CustomRewardFunctionConfig
from rlx.reward.functions import default_compute_score, load_reward_fn
from rlx.reward.manager import RewardManager, mean_extras
from rlx.reward.rules import gsm8k
from rlx.models import build_byte_tokenizer
from rlx.protocol import Batch

REPO = Path(__file__).resolve().parents[2]
GSM8K_TEST = REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
PREPARE = REPO / "scripts" / "prepare_gsm8k.py"


def _prepare_module():
    spec = importlib.util.spec_from_file_location("prepare_gsm8k", PREPARE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# (response, ground truth, strict, flexible): the score with format_score=0.1 under each method, derived by hand
# from verl's rule (strict: the last "#### <digits.,>" of the last 300 characters, commas removed; flexible: the
# last run of digits/dots/commas there that is not a lone "."; then string equality)
GSM8K_CASES = [
    ("so 3 + 4 = 7\n#### 7", "7", 1.0, 1.0),
    ("#### 1,000", "1000", 1.0, 0.1),  # flexible keeps the comma: "1,000" != "1000"
    ("#### -5", "-5", 1.0, 1.0),
    ("#### 18.", "18", 0.1, 0.1),  # "18." is read, and is not "18"
    ("#### 18.00", "18", 0.1, 0.1),
    ("#### 018", "18", 0.1, 0.1),
    ("#### $18", "18", 0.0, 1.0),  # no digit right after "#### ": no strict answer; flexible reads 18
    ("####18", "18", 0.0, 1.0),
    ("####  18", "18", 0.0, 1.0),
    ("#### 3 then later #### 4", "4", 1.0, 1.0),  # the LAST answer counts
    ("#### 4 then later #### 3", "4", 0.1, 0.1),
    ("#### 4 then 3 apples", "4", 1.0, 0.1),  # flexible takes the last number of all
    ("#### 4. The end.", "4", 0.1, 0.1),  # strict "4.", flexible skips the lone "." and reads "4."
    ("#### 8", "7", 0.1, 0.1),
    ("the answer is 7", "7", 0.0, 1.0),  # no '####': no strict answer
    ("#### seven", "7", 0.0, 0.0),
    ("nothing here.", "7", 0.0, 0.1),  # flexible: only a lone "." (kept as verl keeps it), which is not "7"
    ("", "7", 0.0, 0.0),
    ("#### 7" + "x" * 294, "7", 1.0, 1.0),  # 300 characters: all read
    ("#### 7" + "x" * 295, "7", 0.0, 1.0),  # 301: the first '#' is cut, "### 7" is no strict answer
    ("#### 7" + "x" * 300, "7", 0.0, 0.0),  # the 7 itself is cut
]


@pytest.mark.parametrize("solution,truth,strict,flexible", GSM8K_CASES)
def test_gsm8k_hand_cases(solution, truth, strict, flexible):
    assert gsm8k.compute_score(solution, truth, format_score=0.1) == strict
    assert gsm8k.compute_score(solution, truth, method="flexible", format_score=0.1) == flexible
    assert gsm8k.compute_score(solution, truth) == (1.0 if strict == 1.0 else 0.0)  # verl's defaults
    assert default_compute_score("openai/gsm8k", solution, truth) == (1.0 if strict == 1.0 else 0.0)


def test_gsm8k_method_and_kwargs():
    assert gsm8k.compute_score("#### 4", "4", score=2.0) == 2.0
    with pytest.raises(ValueError, match="method='lenient'"):
        gsm8k.compute_score("#### 4", "4", method="lenient")
    # verl compares strings: a ground truth that is not a string never matches
    assert gsm8k.compute_score("#### 4", 4, format_score=0.1) == 0.1
    # verl's default_compute_score passes no keyword argument on: format_score is ignored there
    assert default_compute_score("openai/gsm8k", "#### 5", "4", format_score=0.1) == 0.0


def _gsm8k_variants(answer: str, truth: str) -> list[tuple[str, float, float]]:
    """Variants of a real GSM8K reference answer (which ends in "#### <truth as written>") with their scores
    (strict, flexible) under format_score=0.1, by the rule stated above GSM8K_CASES."""
    body, _, written = answer.rpartition("#### ")
    comma = "," in written  # flexible keeps commas, the ground truth has none
    lead = "-0" + truth[1:] if truth.startswith("-") else "0" + truth
    tail = " and so on" * 30  # 300 characters, no digit, dot or comma
    return [
        (answer, 1.0, 0.1 if comma else 1.0),
        (answer + ".", 0.1, 0.1),
        (body + "#### $" + truth, 0.0, 1.0),
        (body + "####" + truth, 0.0, 1.0),
        (body + "####  " + truth, 0.0, 1.0),
        (body + "#### " + lead, 0.1, 0.1),
        (body + "#### " + truth + ".00", 0.1, 0.1),
        (answer + "\n#### " + truth + "1", 0.1, 0.1),  # several '####': the last one counts
        (body + "#### " + truth + "1\n#### " + truth, 1.0, 1.0),
        (answer + tail[:300 - len("#### " + written)], 1.0, 0.1 if comma else 1.0),  # just within the 300
        (answer + tail[:301 - len("#### " + written)], 0.0, 0.1 if comma else 1.0),  # the first '#' is cut
        (answer + tail, 0.0, 0.0),  # the answer is beyond the last 300 characters
    ]


@pytest.mark.skipif(not GSM8K_TEST.exists(), reason=f"real GSM8K not found at {GSM8K_TEST}")
def test_gsm8k_real_test_set_with_variants():
    """The whole GSM8K test set, each reference answer and its variants, strict and flexible."""
    prep = _prepare_module()
    with GSM8K_TEST.open() as f:
        records = [json.loads(line) for line in f]
    rows = prep.convert_rows(records, "test")
    assert len(rows) == len(records) == 1319
    commas = 0
    for rec, r in zip(records, rows):
        truth = r["reward_model"]["ground_truth"]
        assert default_compute_score(r["data_source"], rec["answer"], truth) == 1.0, (rec["answer"], truth)
        for text, strict, flexible in _gsm8k_variants(rec["answer"], truth):
            got = (gsm8k.compute_score(text, truth, format_score=0.1),
                   gsm8k.compute_score(text, truth, method="flexible", format_score=0.1))
            assert got == (strict, flexible), (text[-80:], truth, got)
        commas += "," in rec["answer"].rpartition("#### ")[2]
    assert commas > 0  # the comma case is exercised


@pytest.mark.parametrize("overrides,message", [
    (["reward_model.reward_kwargs.format_score=0.1"], "reward_model.score_kwargs.format_score"),
    (["custom_reward_function.reward_kwargs.bonus=1"], "custom_reward_function.path is not set"),
    (["reward_model.score_kwargs.method=flexible", "custom_reward_function.path=r.py"],
     "custom_reward_function.reward_kwargs"),
])
def test_reward_kwargs_keys_are_verls(overrides, message):
    """verl passes reward_model.reward_kwargs to the dapo manager only: any other key there is refused, naming
    rlx's key for the built-in scorers (score_kwargs) and verl's for a custom function."""
    from conftest import load_config

    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        load_config(overrides)


def test_default_dispatch_unknown_source():
    with pytest.raises(ValueError, match="custom_reward_function.path") as err:
        default_compute_score("some/dataset", "x", "y")
    assert "openai/gsm8k" in str(err.value) and "synthetic/digits" in str(err.value)


def test_load_reward_fn_default_and_custom(tmp_path):
    # no path, no score_kwargs: verl's default_compute_score; score_kwargs (rlx's) reach the built-in scorer
    assert load_reward_fn(CustomRewardFunctionConfig(), {}) is default_compute_score
    fn = load_reward_fn(CustomRewardFunctionConfig(), {"format_score": 0.2, "method": "flexible"})
    assert fn(data_source="openai/gsm8k", solution_str="#### 3", ground_truth="4") == 0.2
    assert fn(data_source="openai/gsm8k", solution_str="####4", ground_truth="4") == 1.0

    src = tmp_path / "my_reward.py"
    src.write_text(
        "def my_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
        "    hit = float(solution_str.strip() == ground_truth)\n"
        "    return {'score': hit + bonus, 'acc': hit, 'length': len(solution_str)}\n")
    fn = load_reward_fn(CustomRewardFunctionConfig(path=str(src), name="my_score", reward_kwargs={"bonus": 0.5}))
    assert fn(data_source="x", solution_str="yes", ground_truth="yes") == {"score": 1.5, "acc": 1.0, "length": 3}

    with pytest.raises(ValueError, match="custom_reward_function.name='nope'"):
        load_reward_fn(CustomRewardFunctionConfig(path=str(src), name="nope"), {})
    with pytest.raises(ValueError, match="custom_reward_function.path"):
        load_reward_fn(CustomRewardFunctionConfig(path=str(tmp_path / "missing.py"), name="f"), {})
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    with pytest.raises(ValueError, match="failed to import"):
        load_reward_fn(CustomRewardFunctionConfig(path=str(broken), name="f"), {})


def _batch(tok, texts, resp_len=8, truths=None, sources=None):
    rows, masks = [], []
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids = ids[:resp_len]
        mask = [1] * len(ids) + [0] * (resp_len - len(ids))
        rows.append(ids + [tok.pad_token_id] * (resp_len - len(ids)))
        masks.append(mask)
    n = len(texts)
    return Batch({"responses": torch.tensor(rows), "response_mask": torch.tensor(masks)},
                 {"data_source": sources or ["openai/gsm8k"] * n, "ground_truth": truths or ["4"] * n,
                  "extra_info": [{}] * n})


def test_reward_manager_places_score_on_last_valid_token():
    tok = build_byte_tokenizer()
    batch = _batch(tok, ["#### 4", "#### 5", "#### 4 and more text"], truths=["4", "4", "4"])
    scores, extra = RewardManager(tok, load_reward_fn(CustomRewardFunctionConfig(), {"format_score": 0.1}))(batch)
    assert scores.shape == (3, 8) and scores.dtype == torch.float32
    # "#### 4" + eos = 7 valid tokens -> index 6 (the eos is decoded away but still the last valid token)
    assert scores[0, 6] == 1.0 and scores[0].sum() == 1.0
    assert scores[1, 6] == pytest.approx(0.1) and scores[1].sum() == pytest.approx(0.1)
    assert scores[2, 7] == 1.0 and scores[2].sum() == 1.0  # truncated at the response length
    assert extra == {}

    # a hole in the mask: the text is decoded from valid tokens only, the score lands on the last valid one
    holed = _batch(tok, ["#x### 4"])  # 7 bytes + eos
    holed.tensors["response_mask"][0, 1] = 0  # the "x"
    holed.tensors["response_mask"][0, 7] = 0  # the eos
    scores, _ = RewardManager(tok, default_compute_score)(holed)
    assert scores[0, 6] == 1.0 and scores[0].sum() == 1.0


def test_reward_manager_dict_scores(tmp_path):
    src = tmp_path / "r.py"
    src.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if data_source == 'plain':\n"
        "        return 0.25\n"
        "    return {'score': float(ground_truth in solution_str), 'acc': 1.0, 'source': data_source}\n")
    tok = build_byte_tokenizer()
    batch = _batch(tok, ["abc", "xyz", "q"], sources=["d", "plain", "d"], truths=["b", "y", "z"])
    scores, extra = RewardManager(tok, load_reward_fn(CustomRewardFunctionConfig(path=str(src)), {}))(batch)
    assert scores[0, 3] == 1.0 and scores[1, 3] == 0.25 and scores[2, 1] == 0.0
    assert set(extra) == {"acc", "source", "score"}  # as verl: every key of the dict, score included
    assert extra["acc"][0] == 1.0 and np.isnan(extra["acc"][1]) and extra["acc"][2] == 1.0
    assert extra["source"][0] == "d" and extra["score"] == [1.0, 0.25, 0.0]
    assert mean_extras(extra) == {"acc": 1.0, "score": pytest.approx(1.25 / 3)}


def _custom(tmp_path, body: str):
    src = tmp_path / "my_reward.py"
    src.write_text("def my_score(data_source, solution_str, ground_truth, extra_info=None):\n" + body)
    return src, load_reward_fn(CustomRewardFunctionConfig(path=str(src), name="my_score"), {})


@pytest.mark.parametrize("value", ["float('nan')", "float('inf')", "{'score': float('-inf')}"])
def test_non_finite_reward_is_an_error_naming_the_function_and_sample(tmp_path, value):
    from rlx.reward.manager import RewardError

    src, fn = _custom(tmp_path, f"    return 1.0 if data_source == 'ok' else {value}\n")
    tok = build_byte_tokenizer()
    batch = _batch(tok, ["a", "b", "c"], sources=["ok", "ok", "bad/src"])
    with pytest.raises(RewardError) as e:
        RewardManager(tok, fn)(batch)
    msg = str(e.value)
    assert "my_score" in msg and str(src) in msg and "sample 2" in msg and "'bad/src'" in msg, msg
    assert "reward_model.non_finite_score" in msg


def test_non_finite_reward_replaced_and_counted_behind_the_key(tmp_path):
    _, fn = _custom(tmp_path, "    return float('nan') if solution_str.startswith('b') else 1.0\n")
    tok = build_byte_tokenizer()
    manager = RewardManager(tok, fn, non_finite_score=-1.0)
    scores, _ = manager(_batch(tok, ["a", "b", "bb"], sources=["s"] * 3))
    assert scores.sum(-1).tolist() == [1.0, -1.0, -1.0] and manager.non_finite_count == 2
    manager(_batch(tok, ["a"], sources=["s"]))
    assert manager.non_finite_count == 0  # per call


@pytest.mark.parametrize("value", ["'0.5'", "None", "[1.0]", "{'acc': 1.0}"])
def test_reward_of_the_wrong_type_names_the_function_and_value(tmp_path, value):
    from rlx.reward.manager import RewardError

    _, fn = _custom(tmp_path, f"    return {value}\n")
    tok = build_byte_tokenizer()
    with pytest.raises(RewardError) as e:
        RewardManager(tok, fn)(_batch(tok, ["a"], sources=["s"]))
    msg = str(e.value)
    assert "my_score" in msg and "sample 0" in msg, msg
    assert ("'score'" in msg) if value.startswith("{") else (value.strip("'") in msg), msg


def test_dapo_overlong_penalty_follows_verl():
    """verl's DAPORewardManager: expected = max_resp_len - len; a response of L valid tokens gets
    min(-(L - expected) / len * penalty_factor, 0) added to its score, logged with log=True."""
    tok = build_byte_tokenizer()
    batch = _batch(tok, ["ab", "abcd", "abcdef", "abcdefgh"], truths=["x"] * 4)  # 3, 5, 7, 8 valid tokens
    buffer = {"enable": True, "len": 4, "penalty_factor": 2.0, "log": True}
    manager = RewardManager(tok, lambda **kw: 1.0, overlong_buffer=buffer, max_resp_len=8)
    scores, extra = manager(batch)
    # expected length 8 - 4 = 4: lengths 3, 5, 7, 8 exceed it by -1, 1, 3, 4
    assert scores.sum(-1).tolist() == pytest.approx([1.0, 1.0 - 0.5, 1.0 - 1.5, 1.0 - 2.0])
    assert extra["overlong_reward"] == pytest.approx([0.0, -0.5, -1.5, -2.0])
    assert extra["overlong"] == [0.0, 1.0, 1.0, 1.0]
    # enable=False (or no buffer): the naive manager's scores
    off = RewardManager(tok, lambda **kw: 1.0, overlong_buffer=dict(buffer, enable=False), max_resp_len=8)
    assert off(batch)[0].sum(-1).tolist() == [1.0] * 4


def test_reward_manager_built_from_config(tmp_path):
    """reward_model.reward_manager picks the manager; the dapo keys of reward_kwargs configure it and are not
    passed to the score function; max_resp_len defaults to data.max_response_length."""
    from conftest import load_config  # the quickstart config
    from rlx.reward.manager import build_reward_manager

    tok = build_byte_tokenizer()
    cfg = load_config(["reward_model.reward_manager=dapo", "data.max_response_length=8",
                       "reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
                       "reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
                       "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
                       "reward_model.score_kwargs.format_score=0.1"])
    fn = load_reward_fn(cfg.custom_reward_function, cfg.reward_model.score_kwargs)
    assert fn.keywords == {"format_score": 0.1}
    manager = build_reward_manager(cfg, tok, fn)
    assert manager.max_resp_len == 8 and manager.overlong_reward(6) == pytest.approx(-0.5)
    scores, _ = manager(_batch(tok, ["#### 4"], truths=["4"]))  # 7 valid tokens: 1.0 - 3/4
    assert scores.sum().item() == pytest.approx(0.25)
    naive = build_reward_manager(load_config([]), tok, fn)
    assert naive.overlong_buffer is None and not naive.batched


def test_batch_reward_manager_calls_once_with_lists():
    tok = build_byte_tokenizer()
    calls = []

    def scores(data_sources, solution_strs, ground_truths, extra_infos):
        calls.append(list(solution_strs))
        return [float(t == g) for t, g in zip(solution_strs, ground_truths)]

    batch = _batch(tok, ["a", "b", "c"], truths=["a", "x", "c"])
    out, _ = RewardManager(tok, scores, batched=True)(batch)
    assert calls == [["a", "b", "c"]] and out.sum(-1).tolist() == [1.0, 0.0, 1.0]


def test_score_batch_is_the_one_door():
    """rlx.reward.score.score_batch: the reward model's scores when there are some (a judge's verdicts as an
    extra); with a judge and a custom function, the manager scores, finding the judge's score in extra_info;
    without a reward model, the manager."""
    from rlx.reward.score import score_batch

    tok = build_byte_tokenizer()
    batch = _batch(tok, ["#### 4", "#### 5"], truths=["4", "4"])
    seen = []

    def custom(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(extra_info.get("judge_score"))
        return extra_info.get("judge_score", 0.0) + float(solution_str == "#### 4")

    manager = RewardManager(tok, custom)
    rm_scores = torch.tensor([[0.0] * 7 + [3.0], [0.0] * 7 + [5.0]])
    classifier = Batch({"rm_scores": rm_scores})
    scores, extra = score_batch(batch, manager, classifier, custom_function=True)
    assert torch.equal(scores, rm_scores) and extra == {} and not seen  # no judge: the model's score
    judged = Batch({"rm_scores": rm_scores, "judge_score": torch.tensor([3.0, 5.0])},
                   {"judge_verdict": ["Score: 3", "Score: 5"]})
    scores, extra = score_batch(batch, manager, judged, custom_function=False)
    assert torch.equal(scores, rm_scores) and extra == {"judge_verdict": ["Score: 3", "Score: 5"]}
    scores, _ = score_batch(batch, manager, judged, custom_function=True)
    assert seen == [3.0, 5.0] and scores.sum(-1).tolist() == [4.0, 5.0]
    assert score_batch(batch, manager)[0].sum(-1).tolist() == [1.0, 0.0]
