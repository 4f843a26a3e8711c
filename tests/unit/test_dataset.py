"""RLDataset / collate_prompts / PromptLoader on tiny parquet files and synthetic sources (CPU, fast)."""
from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlx.config.schema import DataConfig
from rlx.data import synthetic
from rlx.data.dataset import PromptLoader, RLDataset, collate_prompts
from rlx.reward.functions import default_compute_score
from rlx.models import build_byte_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


def make_cfg(**overrides):
    cfg = dict(train_files=None, val_files=None, prompt_key="prompt", reward_fn_key="data_source",
               max_prompt_length=16, max_response_length=8, train_batch_size=2, val_batch_size=None,
               shuffle=True, seed=0, filter_overlong_prompts=False, truncation="error",
               apply_chat_template=True, return_raw_chat=False)
    cfg.update(overrides)
    return DataConfig(**cfg)


def row(content: str, gt="1", source="openai/gsm8k", idx=0) -> dict:
    return {"data_source": source, "prompt": [{"role": "user", "content": content}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": gt}, "extra_info": {"split": "test", "index": idx}}


def write(tmp_path, rows, name="data.parquet") -> str:
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_rows_tokenized_with_chat_template(tmp_path, tok):
    path = write(tmp_path, [row("abc", gt="7", idx=3), row("hello", gt="8", idx=4)])
    ds = RLDataset(path, tok, make_cfg())
    assert len(ds) == 2
    item = ds[1]
    assert item["input_ids"] == tok("hello", add_special_tokens=False)["input_ids"]
    assert item["raw_prompt"] == "hello" and item["data_source"] == "openai/gsm8k"
    assert item["ground_truth"] == "8" and item["extra_info"] == {"split": "test", "index": 4}
    assert item["index"] == 1 and isinstance(item["extra_info"], dict)
    # without the chat template the contents are joined
    no_tmpl = RLDataset([path, path], tok, make_cfg(apply_chat_template=False, return_raw_chat=True))
    assert len(no_tmpl) == 4 and no_tmpl[3]["raw_prompt"] == "hello"
    assert no_tmpl[3]["raw_chat"] == [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("mode,expected", [("left", "klmnopqr"), ("right", "abcdefgh"), ("middle", "abcdopqr")])
def test_truncation_modes(tmp_path, tok, mode, expected):
    path = write(tmp_path, [row("abcdefghijklmnopqr"), row("xy")])
    ds = RLDataset(path, tok, make_cfg(max_prompt_length=8, truncation=mode))
    assert len(ds) == 2
    assert tok.decode(ds[0]["input_ids"]) == expected
    assert tok.decode(ds[1]["input_ids"]) == "xy"


def test_truncation_error_names_the_knobs_and_row(tmp_path, tok):
    path = write(tmp_path, [row("ok"), row("this prompt is far too long")])
    with pytest.raises(ValueError) as err:
        RLDataset(path, tok, make_cfg(max_prompt_length=8))
    msg = str(err.value)
    assert "data.max_prompt_length=8" in msg and "data.truncation" in msg
    assert "row 1" in msg and path in msg


def test_filter_overlong_prompts(tmp_path, tok, caplog):
    path = write(tmp_path, [row("short"), row("this prompt is far too long"), row("tiny")])
    with caplog.at_level(logging.WARNING, logger="rlx.data.dataset"):
        ds = RLDataset(path, tok, make_cfg(max_prompt_length=8, filter_overlong_prompts=True))
    assert [ds[i]["raw_prompt"] for i in range(len(ds))] == ["short", "tiny"]
    assert [ds[i]["index"] for i in range(len(ds))] == [0, 1]
    assert "filtered 1 of 3" in caplog.text
    with pytest.raises(ValueError, match="no prompts left"):
        RLDataset(path, tok, make_cfg(max_prompt_length=2, filter_overlong_prompts=True))


def test_missing_column(tmp_path, tok):
    bad = [{k: v for k, v in row("x").items() if k != "reward_model"}]
    path = write(tmp_path, bad)
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['reward_model'\]") as err:
        RLDataset(path, tok, make_cfg())
    assert path in str(err.value) and "data.prompt_key" in str(err.value)
    with pytest.raises(ValueError, match=r"\['question'\]"):
        RLDataset(write(tmp_path, [row("x")], "ok.parquet"), tok, make_cfg(prompt_key="question"))


def test_empty_and_unreadable_files(tmp_path, tok):
    empty_table = pa.Table.from_pylist([row("x")]).slice(0, 0)
    empty = tmp_path / "empty.parquet"
    pq.write_table(empty_table, empty)
    with pytest.raises(ValueError, match="has no rows"):
        RLDataset(str(empty), tok, make_cfg())
    zero = tmp_path / "zero.parquet"
    zero.write_bytes(b"")
    with pytest.raises(ValueError, match="not a readable parquet file") as err:
        RLDataset(str(zero), tok, make_cfg())
    assert str(zero) in str(err.value)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_text("not parquet at all")
    with pytest.raises(ValueError, match="not a readable parquet file"):
        RLDataset(str(garbage), tok, make_cfg())
    with pytest.raises(ValueError, match="does not exist"):
        RLDataset(str(tmp_path / "nope.parquet"), tok, make_cfg())
    with pytest.raises(ValueError, match="is a directory"):
        RLDataset(str(tmp_path), tok, make_cfg())
    with pytest.raises(ValueError, match="data.truncation"):
        RLDataset(str(empty), tok, make_cfg(truncation="sideways"))


def test_synthetic_source_deterministic(tok):
    url = "synthetic://digits?size=32&seed=3"
    a, b = synthetic.generate_rows(url), synthetic.generate_rows(url)
    assert a == b and len(a) == 32
    assert synthetic.generate_rows("synthetic://digits/size:32/seed:3") == a  # Hydra-friendly form
    assert synthetic.generate_rows("synthetic://digits?size=32&seed=4") != a
    r = a[0]
    assert r["data_source"] == "synthetic/digits" and r["prompt"][0]["role"] == "user"
    assert r["prompt"][0]["content"].endswith(" ->") and r["reward_model"]["ground_truth"].isdigit()
    ds = RLDataset([url, "synthetic://copy?size=8&seed=1&split=val"], tok, make_cfg(max_prompt_length=16))
    assert len(ds) == 40 and ds[39]["data_source"] == "synthetic/copy"
    assert ds[39]["extra_info"]["split"] == "val"
    ds2 = RLDataset(url, tok, make_cfg(max_prompt_length=16))
    assert [ds[i]["input_ids"] for i in range(32)] == [ds2[i]["input_ids"] for i in range(32)]
    with pytest.raises(ValueError, match="unknown synthetic task"):
        synthetic.generate_rows("synthetic://nope?size=3")
    with pytest.raises(ValueError, match="unknown parameter"):
        synthetic.generate_rows("synthetic://digits?sise=3")


def test_synthetic_rewards():
    gt, info = "9", {"k": 8}
    perfect = default_compute_score("synthetic/digits", "99999999", gt, info)
    assert perfect == 1.0
    assert default_compute_score("synthetic/digits", "1111111111", gt, info) == 0.5
    assert default_compute_score("synthetic/digits", "9999", gt, info) == 0.5  # early stop is no shortcut
    assert default_compute_score("synthetic/digits", "abc", gt, info) == 0.0
    assert default_compute_score("synthetic/copy", "729", "729") == 1.0
    assert default_compute_score("synthetic/copy", "7x1", "729") == pytest.approx((1 + 0 + 0.25) / 3)
    # a uniformly random byte policy scores low but not zero
    rng = np.random.default_rng(0)
    tok = build_byte_tokenizer()
    rows = synthetic.generate_rows("synthetic://digits?size=200&seed=0")
    scores = [default_compute_score(r["data_source"], tok.decode(rng.integers(3, 259, 16).tolist()),
                                    r["reward_model"]["ground_truth"], r["extra_info"]) for r in rows]
    assert 0.005 < np.mean(scores) < 0.06


def test_collate_left_pads(tok):
    items = [{"input_ids": [5, 6, 7], "data_source": "a", "ground_truth": "1", "extra_info": {"i": 0},
              "raw_prompt": "p0", "index": 0},
             {"input_ids": [8], "data_source": "b", "ground_truth": ["x", "y"], "extra_info": {},
              "raw_prompt": "p1", "index": 1}]
    batch = collate_prompts(items, pad_token_id=0, max_prompt_length=5)
    assert batch["input_ids"].dtype == torch.long and batch["input_ids"].shape == (2, 5)
    assert batch["input_ids"].tolist() == [[0, 0, 5, 6, 7], [0, 0, 0, 0, 8]]
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 0, 1]]
    assert batch["position_ids"].tolist() == [[0, 0, 0, 1, 2], [0, 0, 0, 0, 0]]
    assert batch["ground_truth"][1] == ["x", "y"] and batch["extra_info"][0] == {"i": 0}
    assert list(batch["data_source"]) == ["a", "b"] and list(batch["index"]) == [0, 1]
    assert len(batch) == 2
    with pytest.raises(ValueError, match="max_prompt_length"):
        collate_prompts(items, pad_token_id=0, max_prompt_length=2)


def _ids(batch):
    return batch["index"].tolist()


def test_loader_deterministic_and_resumable(tok):
    ds = RLDataset("synthetic://digits?size=10&seed=0", tok, make_cfg())
    loader = PromptLoader(ds, batch_size=3, shuffle=True, seed=7)
    assert len(loader) == 3
    first = [_ids(b) for b in loader]
    assert len(first) == 3 and all(len(x) == 3 for x in first)
    assert len({i for x in first for i in x}) == 9  # no repeats within an epoch
    assert loader.state_dict() == {"epoch": 1, "position": 0, "seed": 7}
    second = [_ids(b) for b in loader]
    assert second != first  # reshuffled per epoch
    # the same seed gives the same order
    again = PromptLoader(ds, batch_size=3, shuffle=True, seed=7)
    assert [_ids(b) for b in again] == first

    # stop in the middle of epoch 1, checkpoint, resume in a fresh loader
    ref = PromptLoader(ds, batch_size=3, shuffle=True, seed=7)
    stream = [_ids(ref.next_batch()) for _ in range(8)]
    run = PromptLoader(ds, batch_size=3, shuffle=True, seed=7)
    seen = []
    for batch in run:
        seen.append(_ids(batch))
    it = iter(run)
    seen.append(_ids(next(it)))
    state = run.state_dict()
    assert state == {"epoch": 1, "position": 1, "seed": 7}
    resumed = PromptLoader(ds, batch_size=3, shuffle=True, seed=0)
    resumed.load_state_dict(state)
    rest = [_ids(b) for b in resumed]
    seen += rest
    seen += [_ids(resumed.next_batch()) for _ in range(2)]
    assert seen == stream

    # checkpoint right after the last batch of an epoch resumes at the next epoch
    end = PromptLoader(ds, batch_size=3, shuffle=True, seed=7)
    for _ in range(3):
        end.next_batch()
    assert end.state_dict() == {"epoch": 1, "position": 0, "seed": 7}

    plain = PromptLoader(ds, batch_size=4, shuffle=False, seed=0, drop_last=False)
    assert len(plain) == 3 and [_ids(b) for b in plain] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    whole = PromptLoader(ds, batch_size=None, shuffle=False)
    batch = next(iter(whole))
    assert batch["input_ids"].shape == (10, 16)
    with pytest.raises(ValueError, match="data.train_batch_size"):
        PromptLoader(ds, batch_size=11)


def test_reward_fn_key_names_the_column_stored_as_data_source(tmp_path, tok):
    """data.reward_fn_key=<column>: the value of that column is what picks the reward function; the batch carries
    it as data_source (what the reward manager passes on), whatever the column is called."""
    rows = [{k: v for k, v in row("abc").items() if k != "data_source"} | {"task": "synthetic/digits"}]
    path = write(tmp_path, rows)
    ds = RLDataset(path, tok, make_cfg(reward_fn_key="task"))
    assert ds[0]["data_source"] == "synthetic/digits" and ds.data_sources() == {"synthetic/digits"}
    assert ds.collate([ds[0]])["data_source"].tolist() == ["synthetic/digits"]
    with pytest.raises(ValueError, match="lacks column"):  # the default key needs verl's data_source column
        RLDataset(path, tok, make_cfg())
    with pytest.raises(ValueError, match=r"no column 'task' \(data.reward_fn_key\)"):
        RLDataset("synthetic://digits?size=4&seed=0", tok, make_cfg(reward_fn_key="task"))


def test_multimodal_rows_are_refused(tmp_path, tok):
    path = write(tmp_path, [row("abc") | {"images": [b"\x89PNG"]}, row("def") | {"images": []}])
    with pytest.raises(ValueError, match=r"row 0: column 'images' \(data.image_key\).*multi-modal"):
        RLDataset(path, tok, make_cfg())
    RLDataset(write(tmp_path, [row("abc") | {"images": []}], "empty.parquet"), tok, make_cfg())


TOOL_TMPL = ("{% if tools %}{% for t in tools %}<tool>{{ t['function']['name'] }}</tool>{% endfor %}{% endif %}"
             "{% for m in messages %}{{ m['content'] }}{% endfor %}")
SCHEMA = {"type": "function", "function": {"name": "calc", "description": "d", "parameters": {"type": "object"}}}


def test_tool_schemas_are_in_the_prompt_and_its_length(tmp_path):
    """multi_turn's tools are rendered into every prompt by the chat template (as the tool agent renders them at
    rollout), so a prompt of 5 bytes plus 17 bytes of tool markup is 22 tokens: filtered at max_prompt_length=21,
    kept at 22; without tools the same row is 5 tokens."""
    tok = build_byte_tokenizer()
    tok.chat_template = TOOL_TMPL
    path = write(tmp_path, [row("hello"), row("hi" * 40, idx=1)])
    ds = RLDataset(path, tok, make_cfg(max_prompt_length=22, filter_overlong_prompts=True), tool_schemas=[SCHEMA])
    assert len(ds) == 1 and ds[0]["raw_prompt"] == "<tool>calc</tool>hello" and len(ds[0]["input_ids"]) == 22
    with pytest.raises(ValueError, match="no prompts left"):
        RLDataset(path, tok, make_cfg(max_prompt_length=21, filter_overlong_prompts=True), tool_schemas=[SCHEMA])
    plain = RLDataset(path, tok, make_cfg(max_prompt_length=22, filter_overlong_prompts=True))
    assert len(plain) == 1 and plain[0]["raw_prompt"] == "hello"


def test_preflight_reads_the_tool_schemas_of_multi_turn():
    from conftest import REPO, load_config
    from rlx.trainer.preflight import _tool_schemas

    assert _tool_schemas(load_config([])) is None
    cfg = load_config(["actor_rollout_ref.rollout.multi_turn.enable=True", "data.return_raw_chat=True",
                       "actor_rollout_ref.rollout.multi_turn.tool_config_path="
                       f"{REPO}/examples/multiturn/config/tool_config/gsm8k_tool_config.yaml"])
    assert [s["function"]["name"] for s in _tool_schemas(cfg)] == ["calc_gsm8k_reward"]
