"""Preflight: data, model, reward and checkpoint problems are found on the driver before Ray starts, each reported
with its key or file and the fix; the entry point exits 2 in seconds."""
import os
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlx import checkpoint as ckpt
from rlx.trainer import launch, main_ppo
from rlx.trainer.preflight import PreflightError, preflight

from conftest import load_config  # load_config: the quickstart job's config


def row(content="1+1", source="openai/gsm8k"):
    return {"data_source": source, "prompt": [{"role": "user", "content": content}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {"index": 0}}


def parquet(tmp_path, rows, name="train.parquet"):
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def problems(*overrides) -> str:
    with pytest.raises(PreflightError) as e:
        preflight(load_config(list(overrides)))
    return str(e.value)


def test_the_default_job_passes():
    inputs = preflight(load_config([]))
    assert len(inputs.train_dataset) == 2048 and inputs.resume_dir is None and callable(inputs.score_fn)


def test_missing_data_file(tmp_path):
    msg = problems(f"data.train_files={tmp_path}/train.parquet")
    assert f"data.train_files: data file '{tmp_path}/train.parquet' does not exist" in msg


def test_parquet_without_the_needed_columns(tmp_path):
    path = parquet(tmp_path, [{"question": "1+1", "data_source": "openai/gsm8k"}])
    msg = problems(f"data.val_files={path}")
    assert "data.val_files:" in msg and path in msg and "lacks column(s) ['prompt', 'reward_model']" in msg
    assert "data.prompt_key" in msg  # the fix


def test_empty_parquet(tmp_path):
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist([row()]).slice(0, 0), path)
    assert f"data file '{path}' has no rows" in problems(f"data.train_files={path}")


def test_prompts_longer_than_max_prompt_length(tmp_path):
    path = parquet(tmp_path, [row("x" * 40)] * 3 + [row("y")] * 20)
    msg = problems(f"data.train_files={path}", "data.max_prompt_length=16")
    assert "3 of 23 prompts" in msg and "data.max_prompt_length=16" in msg
    assert "data.filter_overlong_prompts=True" in msg and "data.truncation=left|right|middle" in msg
    # the fixes it names work
    preflight(load_config([f"data.train_files={path}", "data.max_prompt_length=16",
                           "data.filter_overlong_prompts=True"]))


def test_lengths_beyond_the_model_context():
    msg = problems("data.max_prompt_length=500", "data.max_response_length=100", "data.truncation=left")
    assert "500 + 100 = 600 tokens exceed the model's context of 512" in msg and "max_position_embeddings" in msg


def test_missing_model_folder(tmp_path):
    msg = problems(f"actor_rollout_ref.model.path={tmp_path}/Qwen2.5-0.5B")
    assert f"actor_rollout_ref.model.path='{tmp_path}/Qwen2.5-0.5B' does not exist" in msg
    assert "Repo id" not in msg


def test_hub_id_not_in_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    msg = problems("actor_rollout_ref.model.path=someorg/some-model-that-is-not-here")
    assert "download it first: hf download someorg/some-model-that-is-not-here --local-dir <dir>" in msg


def test_the_download_command_named_is_the_one_installed():
    """huggingface_hub ships `hf` (its `huggingface-cli` is gone): the fixes name `hf download`, which is installed
    beside this python, and nothing the repository shows a user names the old command."""
    bin_dir = os.path.dirname(sys.executable)
    assert shutil.which("hf", path=bin_dir), f"no hf command in {bin_dir}"
    repo = Path(__file__).resolve().parents[2]
    shown = [repo / "README.md"] + [p for top in ("rlx", "docs", "scripts", "examples", "benchmarks")
                                    for p in (repo / top).rglob("*")
                                    if p.suffix in (".py", ".md", ".sh", ".yaml", ".txt")]
    named = [str(p.relative_to(repo)) for p in shown if "huggingface-cli" in p.read_text(errors="replace")]
    assert not named, f"these name huggingface-cli (gone from huggingface_hub; use hf download): {named}"


def test_model_folder_without_tokenizer_or_weights(tmp_path, tiny_model_path):
    broken = tmp_path / "model"
    broken.mkdir()
    shutil.copy(os.path.join(tiny_model_path, "config.json"), broken)
    msg = problems(f"actor_rollout_ref.model.path={broken}")
    assert "not a complete HF model directory" in msg and "tokenizer" in msg and "weights" in msg


def test_reward_file_problems(tmp_path):
    assert "custom_reward_function.path=" in problems(f"custom_reward_function.path={tmp_path}/nope.py")
    bad = tmp_path / "bad.py"
    bad.write_text("import not_a_module_anywhere\n")
    assert "failed to import" in problems(f"custom_reward_function.path={bad}")
    ok = tmp_path / "ok.py"
    ok.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    msg = problems(f"custom_reward_function.path={ok}", "custom_reward_function.name=compute_score")
    assert "custom_reward_function.name='compute_score' is not a function" in msg and "['score']" in msg


def test_data_source_without_a_reward(tmp_path):
    path = parquet(tmp_path, [row(source="my/task")] * 20)
    msg = problems(f"data.train_files={path}")
    assert "data_source ['my/task']" in msg and "custom_reward_function.path" in msg


def test_unwritable_checkpoint_dir(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    msg = problems("trainer.save_freq=1", f"trainer.default_local_dir={blocker}/ckpts")
    assert "trainer.default_local_dir=" in msg and "is a file, not a directory" in msg
    preflight(load_config([f"trainer.default_local_dir={blocker}/ckpts"]))  # nothing is written there: no check
    # the file logger writes <default_local_dir>/logs/metrics.jsonl
    assert "is a file, not a directory" in problems("trainer.logger=[console,file]",
                                                    f"trainer.default_local_dir={blocker}/ckpts")


def _complete_step(root, step):
    d = ckpt.step_dir(root, step)
    os.makedirs(os.path.join(d, "actor"))
    with open(os.path.join(d, "actor", "meta.json"), "w") as f:
        f.write('{"role": "actor", "world_size": 1, "contents": []}')
    ckpt.save_driver_state(d, {"global_step": step})
    ckpt.mark_complete(d)
    return d


def test_resume_path_missing_incomplete_or_damaged(tmp_path):
    base = ["trainer.resume_mode=resume_path"]
    assert "does not exist" in problems(*base, f"trainer.resume_from_path={tmp_path}/global_step_9")
    d = _complete_step(str(tmp_path), 2)
    assert preflight(load_config(base + [f"trainer.resume_from_path={d}"])).resume_dir == d
    with open(os.path.join(d, ckpt.DRIVER_STATE), "a") as f:
        f.write(" ")
    msg = problems(*base, f"trainer.resume_from_path={d}")
    assert "driver_state.json" in msg and "damaged" in msg
    os.remove(os.path.join(d, ckpt.COMPLETE))
    assert "not a complete checkpoint" in problems(*base, f"trainer.resume_from_path={d}")


def test_auto_resume_takes_the_newest_verified_step(tmp_path, caplog):
    root = str(tmp_path)
    d1, d2 = _complete_step(root, 1), _complete_step(root, 2)
    with open(os.path.join(d2, ckpt.DRIVER_STATE), "r+") as f:
        f.write("X")
    with caplog.at_level("WARNING", logger="rlx"):
        assert preflight(load_config([f"trainer.default_local_dir={root}"])).resume_dir == d1
    assert "driver_state.json" in caplog.text
    assert "driver_state.json" in problems(f"trainer.default_local_dir={root}", "trainer.on_damaged_checkpoint=error")


def test_all_problems_in_one_block(tmp_path):
    msg = problems(f"data.train_files={tmp_path}/a.parquet", f"data.val_files={tmp_path}/b.parquet",
                   f"custom_reward_function.path={tmp_path}/r.py")
    assert msg.count("\n  - ") == 3


def test_main_exits_2_before_ray(tmp_path, capsys, monkeypatch):
    def no_ray(cfg):
        raise AssertionError("Ray must not start")

    monkeypatch.setattr(launch, "init_ray", no_ray)
    assert main_ppo.main(["--config-name", "quickstart", f"data.train_files={tmp_path}/train.parquet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlx: the job cannot start (checked before Ray):\n")
    assert f"{tmp_path}/train.parquet" in err and "data.train_files" in err
