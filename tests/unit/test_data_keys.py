"""verl's data keys data.apply_chat_template_kwargs and data.custom_cls, through the preflight (the driver's path:
config -> tokenizer with custom_chat_template -> the datasets the trainer uses), on the quickstart's synthetic data."""
from __future__ import annotations

import textwrap

import pytest
from conftest import load_config

from rlx.trainer.preflight import PreflightError, preflight

# Qwen3's switch, in small: the generation prompt ends in /no_think when the caller passes enable_thinking=False
THINKING_TEMPLATE = ("{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}"
                     "{% if enable_thinking is defined and not enable_thinking %} /no_think{% else %} /think{% endif %}"
                     "{% endif %}")
BASE = ["trainer.device=cpu", "data.max_prompt_length=24", "data.val_files=synthetic://digits/size:8/seed:1"]


def _inputs(overrides, template=None):
    cfg = load_config(BASE + list(overrides))
    if template is not None:
        cfg.actor_rollout_ref.model.custom_chat_template = template
    return preflight(cfg)


def test_apply_chat_template_kwargs_reach_the_template():
    default = _inputs([], THINKING_TEMPLATE)
    off = _inputs(["+data.apply_chat_template_kwargs.enable_thinking=false"], THINKING_TEMPLATE)
    tok = off.tokenizer
    for ds_default, ds_off in ((default.train_dataset, off.train_dataset), (default.val_dataset, off.val_dataset)):
        assert len(ds_default) == len(ds_off) > 0
        for i in (0, len(ds_off) - 1):
            a, b = ds_default[i], ds_off[i]
            content = a["raw_prompt"][:-len(" /think")]
            assert content.endswith(" ->")  # the synthetic prompt, e.g. "7 2 9 ->"
            assert a["raw_prompt"] == content + " /think" and b["raw_prompt"] == content + " /no_think"
            assert b["input_ids"] == tok(content + " /no_think", add_special_tokens=False)["input_ids"]
            assert len(b["input_ids"]) == len(a["input_ids"]) + 3  # byte tokens: "no_" more
    # a key the template does not read changes nothing
    other = _inputs(["+data.apply_chat_template_kwargs.reasoning_effort=low"], THINKING_TEMPLATE)
    assert other.train_dataset[0]["input_ids"] == default.train_dataset[0]["input_ids"]


def test_apply_chat_template_kwargs_errors():
    with pytest.raises(ValueError, match=r"apply_chat_template_kwargs sets \['tokenize'\]"):
        load_config(BASE + ["+data.apply_chat_template_kwargs.tokenize=true"])


CUSTOM = '''
from rlx.data.dataset import RLDataset


class JsonlDigits(RLDataset):
    """Reads jsonl lines {"q": ..., "a": ...} into verl's rows."""

    def read_rows(self, path):
        import json

        with open(path) as f:
            return [{"data_source": "synthetic/digits", "prompt": [{"role": "user", "content": r["q"]}],
                     "reward_model": {"ground_truth": r["a"]}, "extra_info": {"k": 8}}
                    for r in map(json.loads, f)]


class NoCollate:
    def __init__(self, data_files, tokenizer, config):
        self.n = 3

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {}

    def data_sources(self):
        return {"synthetic/digits"}


class BadItems(NoCollate):
    def collate(self, items):
        return None


class WrongArgs(NoCollate):
    def __init__(self, files):
        pass

    def collate(self, items):
        return None


not_a_class = 3
'''


@pytest.fixture
def custom_file(tmp_path):
    import json

    path = tmp_path / "my_dataset.py"
    path.write_text(textwrap.dedent(CUSTOM))
    for name, rows in (("train.jsonl", [("1 2 3 ->", "3"), ("4 5 ->", "5")] * 8), ("val.jsonl", [("7 8 9 ->", "9")])):
        (tmp_path / name).write_text("".join(json.dumps({"q": q, "a": a}) + "\n" for q, a in rows))
    return tmp_path


def _custom(tmp_path, name, *extra):
    return [f"data.custom_cls.path={tmp_path / 'my_dataset.py'}", f"data.custom_cls.name={name}",
            f"data.train_files={tmp_path / 'train.jsonl'}", f"data.val_files={tmp_path / 'val.jsonl'}", *extra]


def test_custom_dataset_class_from_a_file(custom_file):
    inputs = _inputs(_custom(custom_file, "JsonlDigits"))
    train, val = inputs.train_dataset, inputs.val_dataset
    assert type(train).__name__ == "JsonlDigits" and len(train) == 16 and len(val) == 1
    item = val[0]
    # the byte tokenizer's chat template around the content, as RLDataset renders every prompt
    assert item["raw_prompt"] == inputs.tokenizer.apply_chat_template(
        [{"role": "user", "content": "7 8 9 ->"}], add_generation_prompt=True, tokenize=False)
    assert "7 8 9 ->" in item["raw_prompt"] and item["ground_truth"] == "9"
    assert item["data_source"] == "synthetic/digits" and train.data_sources() == {"synthetic/digits"}
    batch = train.collate([train[0], train[1]])
    assert tuple(batch["input_ids"].shape) == (2, 24)
    # the loader the trainer builds walks it
    from rlx.data.dataset import PromptLoader

    assert len(PromptLoader(train, 16).next_batch()) == 16


@pytest.mark.parametrize("name,expected", [
    ("Missing", r"data.custom_cls.name='Missing' is not defined in data.custom_cls.path=.*classes defined there: "
                r"\['BadItems', 'JsonlDigits', 'NoCollate', 'WrongArgs'\]"),
    ("not_a_class", r"data.custom_cls.name='not_a_class' is a int, not a class"),
    ("NoCollate", r"data.custom_cls NoCollate .* lacks \['collate'\] of rlx's dataset interface"),
    ("BadItems", r"data.custom_cls BadItems .*: ds\[0\] must be a dict with keys \['input_ids', 'data_source'"),
    ("WrongArgs", r"data.custom_cls WrongArgs .*: cls\(data_files, tokenizer, config\) failed \(TypeError"),
])
def test_custom_dataset_class_that_does_not_fit(custom_file, name, expected):
    with pytest.raises(PreflightError, match=expected):
        _inputs(_custom(custom_file, name))


def test_custom_dataset_config_errors(tmp_path):
    with pytest.raises(PreflightError, match=r"data.custom_cls.path='.*nowhere.py' is not a file"):
        _inputs([f"data.custom_cls.path={tmp_path / 'nowhere.py'}", "data.custom_cls.name=X"])
    verl_file = tmp_path / "retool.py"
    verl_file.write_text("from verl.utils.dataset import RLHFDataset\n\n\n"
                         "class CustomRLHFDataset(RLHFDataset):\n    pass\n")
    inputs = _inputs([f"data.custom_cls.path={verl_file}", "data.custom_cls.name=CustomRLHFDataset"])
    assert type(inputs.train_dataset).__name__ == "CustomRLHFDataset"  # verl's RLHFDataset, served by rlx
    verl_file.write_text("from verl.tools.sandbox_fusion_tools import SandboxFusionTool\n"
                         "from verl.utils.dataset import RLHFDataset\n")
    with pytest.raises(PreflightError, match=r"failed to import: verl.tools.sandbox_fusion_tools is not one of the "
                                             r"verl names rlx serves"):
        _inputs([f"data.custom_cls.path={verl_file}", "data.custom_cls.name=CustomRLHFDataset"])
    with pytest.raises(ValueError, match=r"data.custom_cls.path=.* needs data.custom_cls.name"):
        load_config(BASE + [f"data.custom_cls.path={tmp_path / 'x.py'}"])
    with pytest.raises(ValueError, match=r"data.custom_cls.name='X' without data.custom_cls.path"):
        load_config(BASE + ["data.custom_cls.name=X"])
