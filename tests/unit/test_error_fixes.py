"""Every user error says how to fix it: each line of the error a bad config or a bad data file raises ends with
`Fix: ...` (the rules in rlx/config/validate.py on batch sizes and rollout.n, the data files' errors in rlx/data/).
A new rule of these kinds gets a case here."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import load_config
from rlx.config.schema import DataConfig
from rlx.models import build_byte_tokenizer


def problems(message: str) -> list[str]:
    """The problems of one error: the items of a `  - ` list (validation, preflight), else the message."""
    head, *items = message.split("\n  - ")
    return items or [head]


def assert_each_says_the_fix(message: str) -> None:
    for problem in problems(message):
        assert "Fix:" in problem, f"no 'Fix:' in: {problem}"


MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
BAD_CONFIGS = {
    "sequences do not divide": ["data.train_batch_size=15", "actor_rollout_ref.rollout.n=1",
                                "actor_rollout_ref.actor.ppo_mini_batch_size=5"],
    "mini-batch does not divide the batch": ["actor_rollout_ref.actor.ppo_mini_batch_size=5"],
    "mini-batch not positive": ["actor_rollout_ref.actor.ppo_mini_batch_size=0"],
    "mini-batch sequences over the ranks": ["data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
                                            "actor_rollout_ref.rollout.n=1", "trainer.n_gpus_per_node=2"],
    "micro-batch": [f"{MICRO}=0"],
    "micro-batch unset": [f"{MICRO}=null"],
    "token budget": ["actor_rollout_ref.actor.use_dynamic_bsz=True",
                     "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=0"],
    "log-prob micro-batch": ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null"],
    "log-prob token budget": ["actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
                              "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=-1"],
    "critic micro-batch": ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=2",
                           "critic.forward_micro_batch_size_per_gpu=0"],
    "no workers": ["trainer.n_gpus_per_node=0"],
    "rollout.n below 1": ["actor_rollout_ref.rollout.n=0"],
    "rollout.n greedy": ["actor_rollout_ref.rollout.temperature=0"],
    "rollout.n passk": ["algorithm.adv_estimator=grpo_passk", "actor_rollout_ref.rollout.n=1"],
    "tensor parallel size": ["actor_rollout_ref.rollout.tensor_model_parallel_size=3"],
    "a closed choice": ["algorithm.adv_estimator=nope", "actor_rollout_ref.actor.loss_agg_mode=nope"],
}


@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_each_config_error_says_the_fix(name):
    with pytest.raises(ValueError) as err:
        load_config(BAD_CONFIGS[name])
    assert_each_says_the_fix(str(err.value))


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


def data_cfg(**overrides) -> DataConfig:
    cfg = dict(prompt_key="prompt", reward_fn_key="data_source", max_prompt_length=16, max_response_length=8,
               train_batch_size=2, truncation="error", filter_overlong_prompts=False)
    return DataConfig(**{**cfg, **overrides})


def row(content="abc", **extra) -> dict:
    return {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": content}],
            "reward_model": {"ground_truth": "1"}, "extra_info": {"index": 0}, **extra}


def parquet(tmp_path, rows, name="d.parquet", schema_from=None) -> str:
    table = pa.Table.from_pylist(rows) if rows else pa.Table.from_pylist([schema_from]).slice(0, 0)
    pq.write_table(table, tmp_path / name)
    return str(tmp_path / name)


def bad_data(tmp_path):
    """(name, a call that raises the error of one bad data file or data setting)."""
    from rlx.data.dataset import PromptLoader, RLDataset, collate_prompts

    (tmp_path / "garbage.parquet").write_text("not parquet")
    (tmp_path / "dir").mkdir()
    long_row = row("x" * 40)
    cases = {
        "missing file": lambda tok: RLDataset(str(tmp_path / "nope.parquet"), tok, data_cfg()),
        "a directory": lambda tok: RLDataset(str(tmp_path / "dir"), tok, data_cfg()),
        "not parquet": lambda tok: RLDataset(str(tmp_path / "garbage.parquet"), tok, data_cfg()),
        "missing columns": lambda tok: RLDataset(parquet(tmp_path, [{"question": "q"}], "cols.parquet"), tok,
                                                 data_cfg()),
        "no rows": lambda tok: RLDataset(parquet(tmp_path, [], "empty.parquet", row()), tok, data_cfg()),
        "no files": lambda tok: RLDataset([], tok, data_cfg()),
        "bad truncation": lambda tok: RLDataset("synthetic://digits/size:4", tok, data_cfg(truncation="sideways")),
        "bad max_prompt_length": lambda tok: RLDataset("synthetic://digits/size:4", tok,
                                                       data_cfg(max_prompt_length=0)),
        "overlong prompts": lambda tok: RLDataset(parquet(tmp_path, [long_row], "long.parquet"), tok, data_cfg()),
        "all filtered": lambda tok: RLDataset(parquet(tmp_path, [long_row], "long2.parquet"), tok,
                                              data_cfg(filter_overlong_prompts=True)),
        "bad prompt": lambda tok: RLDataset(parquet(tmp_path, [{**row(), "prompt": [{"role": "user"}]}],
                                                    "prompt.parquet"), tok, data_cfg()),
        "no reward column": lambda tok: RLDataset("synthetic://digits/size:4", tok, data_cfg(reward_fn_key="source")),
        "images": lambda tok: RLDataset(parquet(tmp_path, [row(images=[b"png"])], "img.parquet"), tok, data_cfg()),
        "unknown synthetic task": lambda tok: RLDataset("synthetic://nope/size:4", tok, data_cfg()),
        "unknown synthetic parameter": lambda tok: RLDataset("synthetic://digits/sise:4", tok, data_cfg()),
        "non-integer synthetic parameter": lambda tok: RLDataset("synthetic://digits/size:many", tok, data_cfg()),
        "synthetic size 0": lambda tok: RLDataset("synthetic://digits/size:0", tok, data_cfg()),
        "batch larger than the data": lambda tok: PromptLoader(
            RLDataset("synthetic://digits/size:4", tok, data_cfg()), batch_size=8),
        "batch size 0": lambda tok: PromptLoader(RLDataset("synthetic://digits/size:4", tok, data_cfg()), 0),
        "collate overlong": lambda tok: collate_prompts([{"input_ids": [1] * 5}], 0, 4),
    }
    return cases


def test_each_data_error_says_the_fix(tmp_path, tok):
    cases = bad_data(tmp_path)
    for name, call in cases.items():
        with pytest.raises(ValueError) as err:
            call(tok)
        assert "Fix:" in str(err.value), f"{name}: {err.value}"


def test_custom_dataset_and_reward_file_errors_say_the_fix(tmp_path):
    from rlx.config.schema import CustomRewardFunctionConfig
    from rlx.data.custom import dataset_class
    from rlx.reward.functions import builtin_score, load_reward_fn

    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_here\n")
    empty = tmp_path / "empty.py"
    empty.write_text("class NotADataset:\n    pass\n\nX = 1\n")
    verl = tmp_path / "verl_file.py"
    verl.write_text("from verl.utils.reward_score import prime_math\n")  # one rlx does not serve
    calls = {
        "dataset file missing": lambda: dataset_class(data_cfg(custom_cls={"path": str(tmp_path / "no.py"),
                                                                           "name": "D"})),
        "dataset file fails to import": lambda: dataset_class(data_cfg(custom_cls={"path": str(broken),
                                                                                   "name": "D"})),
        "dataset class missing": lambda: dataset_class(data_cfg(custom_cls={"path": str(empty), "name": "D"})),
        "dataset class lacks methods": lambda: dataset_class(data_cfg(custom_cls={"path": str(empty),
                                                                                  "name": "NotADataset"})),
        "reward file missing": lambda: load_reward_fn(CustomRewardFunctionConfig(path=str(tmp_path / "no.py"))),
        "reward file fails to import": lambda: load_reward_fn(CustomRewardFunctionConfig(path=str(broken))),
        "reward file imports a verl name rlx does not serve":
            lambda: load_reward_fn(CustomRewardFunctionConfig(path=str(verl))),
        "reward function missing": lambda: load_reward_fn(CustomRewardFunctionConfig(path=str(empty), name="score")),
        "no built-in reward": lambda: builtin_score("my/source", "1", "1"),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError) as err:
            call()
        assert "Fix:" in str(err.value), f"{name}: {err.value}"


ONE_ROUND_BAD = [  # each breaks one rule of the quickstart job
    "actor_rollout_ref.actor.ppo_mini_batch_size=5", "actor_rollout_ref.rollout.n=0", "trainer.n_gpus_per_node=3",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0", "trainer.logger=[nope]", "algorithm.kl_penalty=nope",
    "actor_rollout_ref.actor.clip_ratio_c=0.5", "actor_rollout_ref.model.lora_rank=-1", "data.max_response_length=0",
    "trainer.total_training_steps=0", "actor_rollout_ref.rollout.max_model_len=8",
    "data.gen_batch_size=0", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=0", "global_profiler.steps=[0]",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.log_val_generations=-1",
    "actor_rollout_ref.model.tile_mlp_tokens=-1", "data.custom_cls.name=Foo",
]


def test_every_problem_of_a_command_line_in_one_round_each_with_its_fix(capsys, tmp_path):
    """--check reports unknown keys, the cross-key rules and the preflight's problems together, each with its fix."""
    from rlx.trainer.cli import main

    code = main(["--config-name", "quickstart", *ONE_ROUND_BAD, "trainer.nope=1", "actor_rollout_ref.rollout.nn=2",
                 f"data.train_files={tmp_path}/absent.parquet", "--check"])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line[4:] for line in err.splitlines() if line.startswith("  - ")]
    assert len(lines) >= 18, err
    for key in ("trainer.nope", "actor_rollout_ref.rollout.nn", "ppo_mini_batch_size=5", "rollout.n=0",
                "clip_ratio_c=0.5", "tensor_model_parallel_size=2", "global_profiler.steps", "absent.parquet"):
        assert any(key in line for line in lines), (key, err)
    for line in lines:
        assert "Fix: " in line, line
    assert "rlx: check failed (nothing started); device cpu:" in err
