"""verl's import names served by rlx (rlx/verl_names.py): the files of tests/verl_user, written as verl users write
them (reward functions, dataset classes, a tool), load through rlx's own loaders with verl not installed and give
the values of rlx's native rules; any other verl import fails with one line; a real verl is never shadowed."""
import asyncio
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlx import verl_names
from rlx.config.schema import CustomRewardFunctionConfig, DataConfig
from rlx.data.custom import build_dataset
from rlx.data.dataset import RLDataset
from rlx.models import build_byte_tokenizer
from rlx.reward.functions import load_reward_fn
from rlx.reward.rules import gsm8k, math_boxed, math_minerva
from rlx.workers.rollout.agent.gsm8k_tool import Gsm8kTool
from rlx.workers.rollout.agent.interactions import BaseInteraction, Gsm8kInteraction, load_interactions
from rlx.workers.rollout.agent.tools import call_tool, load_tools, schema_of

from conftest import REPO

USER = os.path.join(REPO, "tests", "verl_user")

GSM8K_RESPONSES = ["so the total is 72.\n#### 72", "#### 1,000", "The answer is 72", "#### 71", "no number", "...",
                   "x" * 400 + "#### 72", "#### -3.5"]
GSM8K_TRUTHS = ["72", "1000", "72", "72", "72", "72", "72", "-3.5"]
MATH_RESPONSES = ["thus \\boxed{\\frac{1}{2}}", "\\boxed{0.5}", "\\boxed 5$", "Answer: 12 dollars", "\\fbox{3}",
                  "\\boxed{x^2+1}", "no box", "\\boxed{\\text{(A)}}", "Answer: \\boxed{7}"]
MATH_TRUTHS = ["\\frac{1}{2}", "\\frac{1}{2}", "5", "12", "3", "x^2+1", "1", "(A)", "7"]


@pytest.fixture(autouse=True)
def fresh_verl_names():
    """Each test meets the served modules afresh (they live in sys.modules once built)."""
    yield
    for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
        if getattr(sys.modules[name], "__rlx_serves_verl__", False):
            del sys.modules[name]


def reward(file, name="compute_score"):
    return load_reward_fn(CustomRewardFunctionConfig(path=os.path.join(USER, file), name=name))


def score(value):
    return value["score"] if isinstance(value, dict) else value


# ---- reward files ------------------------------------------------------------------------------------------
def test_reward_files_score_as_rlx_rules():
    pairs = list(zip(GSM8K_RESPONSES, GSM8K_TRUTHS))
    fn = reward("gsm8k_reward.py")
    assert [fn("openai/gsm8k", r, t) for r, t in pairs] == \
        [gsm8k.compute_score(r, t, method="flexible", format_score=0.1) for r, t in pairs]
    fn = reward("async_reward.py")
    assert [fn("openai/gsm8k", r, t) for r, t in pairs] == [gsm8k.compute_score(r, t) for r, t in pairs]

    pairs = list(zip(MATH_RESPONSES, MATH_TRUTHS))
    fn = reward("dapo_reward.py")
    for r, t in pairs:
        native = math_minerva.compute_score(r, t, strict_box_verify=True)
        assert fn("math_dapo", r, t) == {**native, "pred": native["pred"] or ""}
    fn = reward("dapo_reward.py", "boxed_match")
    for r, t in pairs:
        boxed = math_minerva.last_boxed(r)
        pred = math_minerva.normalise(math_minerva.unbox(boxed)) if boxed else ""
        assert fn("math_dapo", r, t)["pred"] == pred
    fn = reward("math_reward.py")
    assert [fn("lighteval/MATH", r, t) for r, t in pairs] == [math_boxed.compute_score(r, t) for r, t in pairs]
    fn = reward("math_reward.py", "boxed_text")
    assert fn("lighteval/MATH", "\\fbox{3}", "3") == -1.0  # verl's remove_boxed asserts; the file catches that
    assert fn("lighteval/MATH", "\\boxed 5$", "5") == 1.0

    fn = reward("default_reward.py")
    sources = ["openai/gsm8k"] * len(GSM8K_RESPONSES) + ["lighteval/MATH", "math_dapo"] * 4
    responses = GSM8K_RESPONSES + MATH_RESPONSES[:8]
    truths = GSM8K_TRUTHS + MATH_TRUTHS[:8]
    for s, r, t in zip(sources, responses, truths):
        native = {"openai/gsm8k": lambda: gsm8k.compute_score(r, t),
                  "lighteval/MATH": lambda: math_boxed.compute_score(r, t),
                  "math_dapo": lambda: math_minerva.compute_score(r, t)["score"]}[s]()
        got = fn(s, r, t)
        assert got["score"] == native and got["length"] == len(r)


# ---- dataset classes ---------------------------------------------------------------------------------------
def data_cfg(path, name, **kw):
    return DataConfig(custom_cls={"path": os.path.join(USER, path), "name": name}, max_prompt_length=96,
                      truncation="error", filter_overlong_prompts=True, **kw)


def test_a_dataset_class_that_maps_records_with_hf_datasets(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    records = [{"question": "2+3?", "answer": "so 5\n#### 5"}, {"question": "10*100?", "answer": "#### 1,000"},
               {"question": "a question far too long " * 20, "answer": "#### 1"}]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    tok = build_byte_tokenizer()
    ds = build_dataset([str(jsonl)], tok, data_cfg("gsm8k_dataset.py", "Gsm8kJsonDataset"))
    assert type(ds).__name__ == "Gsm8kJsonDataset" and len(ds) == 2  # the long one filtered by rlx
    # the same rows written as verl's parquet and read by rlx's own dataset
    sys.path.insert(0, USER)
    try:
        from gsm8k_dataset import to_row
    finally:
        sys.path.remove(USER)
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([to_row(r, i, "openai/gsm8k") for i, r in enumerate(records)]), parquet)
    native = RLDataset([str(parquet)], tok, data_cfg("gsm8k_dataset.py", "unused"))
    for i in range(2):
        mine, theirs = ds[i], native[i]
        assert mine["input_ids"] == theirs["input_ids"] and mine["ground_truth"] == theirs["ground_truth"]
        assert mine["extra_info"]["tools_kwargs"] == theirs["extra_info"]["tools_kwargs"]
    assert [ds[i]["ground_truth"] for i in range(2)] == ["5", "1000"]
    batch = ds.collate([ds[0], ds[1]])
    assert tuple(batch.tensors["input_ids"].shape) == (2, 96)


def test_a_dataset_class_that_builds_its_prompts_from_the_row(tmp_path):
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "ignored"}],
             "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"question": "2+2?"}}]
    parquet = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    tok = build_byte_tokenizer()
    ds = build_dataset([str(parquet)], tok, data_cfg("gsm8k_dataset.py", "QuestionColumnDataset"))
    assert "2+2?" in ds[0]["raw_prompt"] and "ignored" not in ds[0]["raw_prompt"]
    assert ds[0]["raw_prompt"].startswith("[system]Solve the problem.") or "Solve the problem." in ds[0]["raw_prompt"]


# ---- tools -------------------------------------------------------------------------------------------------
def test_a_verl_tool_class_loads_and_answers_as_rlx_s_gsm8k_tool(monkeypatch):
    monkeypatch.syspath_prepend(USER)
    tool = load_tools(os.path.join(USER, "tool_config.yaml"), None)["check_answer"]
    assert tool.tool_schema.function.name == "check_answer"  # verl's pydantic schema
    assert schema_of(tool)["function"]["parameters"]["required"] == ["answer"]
    native = Gsm8kTool({}, schema_of(tool))
    kwargs = {"check_answer": {"create_kwargs": {"ground_truth": "72"}}}

    async def run(t, answer):
        return await call_tool(t, {"answer": answer}, kwargs, 5.0)

    for answer in ("72", "#### 72", "71", "1,000"):
        mine = asyncio.run(run(tool, answer))
        assert not mine.error, mine.text
        native_reward = asyncio.run(run(native, answer)).text.rsplit("reward=", 1)[1]
        assert mine.text == f"check_answer: {answer} scores {native_reward}"
        assert mine.reward == (0.0 if float(native_reward) > 0 else -0.1)  # the YAML's penalty
    assert tool._instances == {}  # released


# ---- interactions ------------------------------------------------------------------------------------------
def test_verl_interaction_classes_load_on_rlx_s_classes_and_answer(monkeypatch):
    """An interaction YAML naming classes written on verl's BaseInteraction and Gsm8kInteraction loads as verl
    loads it; the classes they extend are rlx's, and they answer turn by turn."""
    monkeypatch.syspath_prepend(USER)
    found = load_interactions(os.path.join(USER, "interaction_config.yaml"))
    hint, polite = found["hint"], found["politegsm8k"]  # a name given, and verl's default name
    assert isinstance(hint, BaseInteraction) and isinstance(polite, Gsm8kInteraction)
    assert hint.name == "hint" and hint.max_hints == 1

    async def conversation(agent, answers, truth="72"):
        iid = await agent.start_interaction(None, ground_truth=truth)
        turns = []
        for answer in answers:
            messages = [{"role": "user", "content": "2 x 36?"}, {"role": "assistant", "content": answer}]
            turns.append(await agent.generate_response(iid, messages))
        await agent.finalize_interaction(iid)
        return turns

    assert asyncio.run(conversation(hint, ["71", "#### 71"])) == [
        (False, "Not yet: end with '#### <number>'.", 0.0, {"hints": 1}),
        (True, "Not yet: end with '#### <number>'.", 0.0, {"hints": 2})]  # max_hints=1: the second ends it
    assert asyncio.run(conversation(hint, ["#### 72"])) == [(True, "Correct.", 1.0, {})]
    native = Gsm8kInteraction({"name": "gsm8k"})
    for answer in ("#### 72", "#### 71", "72"):
        done, reply, score, extra = asyncio.run(conversation(native, [answer]))[0]
        assert asyncio.run(conversation(polite, [answer]))[0] == (done, "Thank you. " + reply, score, extra)
    assert hint._instance_dict == {} and polite._state == {}  # finalized


def test_an_interaction_importing_another_verl_module_fails_with_one_line(tmp_path, monkeypatch):
    (tmp_path / "weather.py").write_text("from verl.interactions.weather_interaction import WeatherInteraction\n")
    (tmp_path / "interaction.yaml").write_text("interaction:\n  - class_name: weather.WeatherInteraction\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as e:
        load_interactions(str(tmp_path / "interaction.yaml"))
    msg = str(e.value)
    assert "\n" not in msg and "verl.interactions.weather_interaction is not one of the verl names rlx serves" in msg
    assert "verl.interactions.base: BaseInteraction" in msg and "Gsm8kInteraction" in msg and "Fix:" in msg


# ---- refusals, the console line, a real verl -----------------------------------------------------------------
def test_other_verl_imports_fail_with_one_line_naming_the_module_and_what_rlx_serves(tmp_path, monkeypatch):
    bad_reward = tmp_path / "prime.py"
    bad_reward.write_text("from verl.utils.reward_score import prime_math\n\n\ndef compute_score(*a):\n    return 0\n")
    with pytest.raises(ValueError) as e:
        load_reward_fn(CustomRewardFunctionConfig(path=str(bad_reward)))
    msg = str(e.value)
    assert "\n" not in msg and "verl.utils.reward_score.prime_math is not one of the verl names rlx serves" in msg
    assert "verl.utils.reward_score.gsm8k: compute_score, extract_solution" in msg and "Fix:" in msg

    missing_name = tmp_path / "name.py"
    missing_name.write_text("from verl.utils.reward_score.gsm8k import compute_score, no_such_helper\n")
    with pytest.raises(ValueError) as e:
        load_reward_fn(CustomRewardFunctionConfig(path=str(missing_name)))
    assert "\n" not in str(e.value) and "'no_such_helper' of verl.utils.reward_score.gsm8k is not one" in str(e.value)

    bad_dataset = tmp_path / "sft.py"
    bad_dataset.write_text("from verl.utils.dataset.sft_dataset import SFTDataset\n")
    with pytest.raises(ValueError) as e:
        build_dataset(["x"], None, DataConfig(custom_cls={"path": str(bad_dataset), "name": "SFTDataset"}))
    assert "\n" not in str(e.value) and "verl.utils.dataset.sft_dataset is not one" in str(e.value)
    assert "verl.utils.dataset: RLHFDataset" in str(e.value)

    (tmp_path / "sandbox_tool.py").write_text("from verl.tools.sandbox_fusion_tools import SandboxFusionTool\n")
    (tmp_path / "tools.yaml").write_text("tools:\n  - class_name: sandbox_tool.SandboxFusionTool\n    tool_schema: "
                                         "{type: function, function: {name: code, description: run}}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as e:
        load_tools(str(tmp_path / "tools.yaml"), None)
    assert "\n" not in str(e.value) and "verl.tools.sandbox_fusion_tools is not one" in str(e.value)
    assert "verl.tools.base_tool: BaseTool" in str(e.value)


def test_a_folder_named_verl_without_init_is_no_verl(tmp_path, monkeypatch):
    """A verl clone's root folder on the path (the job started next to it) would import as an empty namespace
    package `verl`: the user's files are served all the same, whether or not that package was imported first."""
    (tmp_path / "verl" / "examples").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "verl", raising=False)
    pairs = list(zip(GSM8K_RESPONSES, GSM8K_TRUTHS))
    expected = [gsm8k.compute_score(r, t, method="flexible", format_score=0.1) for r, t in pairs]
    for imported_first in (False, True):
        for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
            del sys.modules[name]
        if imported_first:
            import verl  # noqa: F401 -- the namespace package
            assert getattr(sys.modules["verl"], "__file__", None) is None
        fn = reward("gsm8k_reward.py")
        assert [fn("openai/gsm8k", r, t) for r, t in pairs] == expected
        assert getattr(sys.modules["verl"], "__rlx_serves_verl__", False)
    for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
        del sys.modules[name]


def test_the_served_names_are_said_once_by_the_preflight(caplog, monkeypatch):
    from rlx.trainer.preflight import preflight

    from conftest import load_config

    monkeypatch.setattr(verl_names, "_reported", set())  # as in a fresh driver process
    cfg = load_config([f"custom_reward_function.path={os.path.join(USER, 'gsm8k_reward.py')}"])
    with caplog.at_level("INFO", logger="rlx"):
        preflight(cfg)
        preflight(cfg)
    lines = [r.getMessage() for r in caplog.records if "verl is not installed here" in r.getMessage()]
    assert len(lines) == 1 and "verl.utils.reward_score.gsm8k.{compute_score, extract_solution}" in lines[0]
