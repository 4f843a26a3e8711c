"""Preflight: everything the driver can check before Ray starts, reported like a config error.

`preflight(cfg)` runs after config validation and before `ray.init`. Each check adds problems (the key or file,
what is wrong, the fix) to one list and one `PreflightError` reports them all, so a job that cannot run stops in
seconds with exit 2 instead of failing in a worker 10-20 s in. Checked:

- the config's rules that read the machine (rlx.trainer.probes; validation does no IO): the model's layer and head
  counts and LoRA's module names, the packages a choice needs (vLLM, liger-kernel, triton, the loggers'), the GPUs
  of trainer.device=cuda, the agent loop's and tools' files;
- models: `actor_rollout_ref.model.path` (and the critic's, `data.tokenizer`) is a built-in name or a local HF
  directory (or a model in the HF cache) with a config, a tokenizer and weights; `data.max_prompt_length +
  data.max_response_length` fits the model's context;
- data: every file of `data.train_files` / `data.val_files` loads through the dataset code itself (exists, is
  parquet, has the needed columns and rows, prompts fit `data.max_prompt_length`), and the train set holds at
  least one batch; a `data.custom_cls` class is loaded from its file and must fit rlx's dataset interface;
- LoRA: `actor_rollout_ref.model.lora_adapter_path` is a peft adapter directory rlx can start from;
- reward: the custom reward file imports and defines the function; without one, every `data_source` has a
  built-in reward;
- code from files (the custom reward, the tools, a custom dataset class): one kept in a world-writable place (see
  `world_writable`) is loaded with a warning line naming the key, the file and why;
- rollout: the vLLM a vLLM rollout will use is not older than the oldest supported release and was built for the
  installed torch (`rlx.workers.rollout.vllm_compat`);
- checkpoints: `trainer.default_local_dir` is writable when something will be written there; when the job saves
  (`trainer.save_freq`), its disk has room for two checkpoints (a new one is complete before an older one is rotated
  out; the size estimated from the model on the meta device, `rlx.checkpoint.space`); the checkpoint
  to resume from exists, is complete, matches its checksums, and every file resume reads loads as resume loads it
  without running code (`rlx.checkpoint.store.check_resume_files`: JSON, `torch.load(weights_only=True)`, DCP
  metadata of DCP's types only); its models are the ones this run builds (`meta.json`'s record against the model
  built on the meta device: class, layers, sizes, LoRA, parameter names and shapes).

What the checks build on the way (tokenizer, datasets, reward function, the verified resume dir) is returned as
`DriverInputs`, so the trainer loads nothing twice.
"""
from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Callable

from rlx import verl_names
from rlx.config.schema import RLXConfig
from rlx.plan import JobPlan, make_plan

log = logging.getLogger("rlx")

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_WEIGHTS = re.compile(r".*\.(safetensors|bin|pt|pth)$|.*\.safetensors\.index\.json$")


class PreflightError(ValueError):
    """Every problem found before Ray, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("the job cannot start (checked before Ray):\n  - " + "\n  - ".join(problems))


@dataclass
class DriverInputs:
    """What the driver loads before workers start; built by `preflight` and handed to the trainer."""
    tokenizer: Any
    train_dataset: Any
    val_dataset: Any
    score_fn: Callable
    resume_dir: str | None


def preflight(cfg: RLXConfig, plan: JobPlan | None = None) -> DriverInputs:
    """Check everything the driver can see; raise one `PreflightError` listing every problem. `plan`: the job's
    (rlx.plan; made here from `cfg` when not given)."""
    from rlx.trainer.probes import machine_problems

    plan = plan or make_plan(cfg)
    problems: list[str] = machine_problems(cfg)  # the config's rules that read the model's files, packages, GPUs
    _warn_world_writable_code(cfg)
    model_dir = _check_model("actor_rollout_ref.model.path", cfg.actor_rollout_ref.model.path, problems)
    if plan.roles.critic and cfg.critic.model.path != cfg.actor_rollout_ref.model.path:
        _check_model("critic.model.path", cfg.critic.model.path, problems)
    if plan.roles.reward_model and cfg.reward_model.model.path is not None:  # None: a config error already
        _check_model("reward_model.model.path", cfg.reward_model.model.path, problems)
    tokenizer = None
    tok_key, tok_path = (("data.tokenizer", cfg.data.tokenizer) if cfg.data.tokenizer
                         else ("actor_rollout_ref.model.path", cfg.actor_rollout_ref.model.path))
    tok_dir = model_dir if tok_path == cfg.actor_rollout_ref.model.path else _check_model(tok_key, tok_path, problems,
                                                                                          weights=False)
    if tok_dir is not None:
        tokenizer = _load_tokenizer(tok_key, tok_dir, cfg.data.trust_remote_code
                                    or cfg.actor_rollout_ref.model.trust_remote_code, problems)
    if tokenizer is not None and cfg.actor_rollout_ref.model.custom_chat_template:
        tokenizer.chat_template = cfg.actor_rollout_ref.model.custom_chat_template  # the dataset formats with it
    if tokenizer is not None and tok_dir is not None and plan.roles.critic:
        _check_critic_tokenizer(cfg, tok_dir, tokenizer, problems)
    if model_dir is not None:
        _check_context(cfg, model_dir, problems)
    train = val = None
    if tokenizer is not None:
        train = _load_dataset("data.train_files", cfg.data.train_files, tokenizer, cfg, problems)
        val = _load_dataset("data.val_files", cfg.data.val_files, tokenizer, cfg, problems)
        if train is not None:
            _check_batches(cfg, train, problems)
    else:
        from rlx.data.dataset import missing_data_files

        missing = missing_data_files(cfg.data)
        problems += missing or ["data.train_files / data.val_files: their rows are not checked (no tokenizer to read "
                                "them with). Fix: the tokenizer's problem above, then check again."]
    score_fn = _check_reward(cfg, plan, [ds for ds in (train, val) if ds is not None], problems)
    _check_lora_adapter(cfg, problems)
    _check_vllm(plan, problems)
    _check_writable(cfg, problems)
    if model_dir is not None:
        _check_disk_space(cfg, plan, problems)
    resume_dir = _check_resume(cfg, plan, problems)
    served = verl_names.served_line()  # the verl names the users' files got from rlx, said once
    if served:
        log.info(served)
    if problems:
        raise PreflightError(problems)
    return DriverInputs(tokenizer, train, val, score_fn, resume_dir)


# ---------------------------------------------------------------------------------------------- code from files
def world_writable(path: str) -> str | None:
    """Why another user of this machine could change the code in `path` (symlinks resolved), or None: the file is
    writable by every user; its folder is (even with the sticky bit, as /tmp: anyone may have written the file
    first); or a folder above it is, without the sticky bit (anyone may rename it and put another in its place)."""
    real = os.path.realpath(os.path.expanduser(path))
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return None  # a missing file is reported by its loader
    if mode & stat.S_IWOTH:
        return f"the file is writable by every user (mode {stat.S_IMODE(mode):o})"
    folder = os.path.dirname(real)
    while True:
        mode = os.stat(folder).st_mode
        if mode & stat.S_IWOTH and (folder == os.path.dirname(real) or not mode & stat.S_ISVTX):
            return f"its folder {folder} is writable by every user (mode {stat.S_IMODE(mode):o})"
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _warn_world_writable_code(cfg: RLXConfig) -> None:
    """One warning line per file of code the job runs that another user could have changed (it still loads: the
    files are the user's to place)."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    files = {"custom_reward_function.path": cfg.custom_reward_function.path,
             "actor_rollout_ref.rollout.multi_turn.function_tool_path": mt.function_tool_path,
             "actor_rollout_ref.rollout.multi_turn.tool_config_path": mt.tool_config_path,
             "data.custom_cls.path": (cfg.data.custom_cls or {}).get("path")}
    for key, path in files.items():
        why = world_writable(str(path)) if path else None
        if why:
            log.warning("rlx: warning: %s=%r is loaded from a world-writable place: %s, so another user of this "
                        "machine could change the code this job runs. Fix: keep it in a folder only you can write "
                        "(chmod o-w).", key, str(path), why)


# ---------------------------------------------------------------------------------------------- models
def _check_model(key: str, path: str, problems: list[str], weights: bool = True) -> str | None:
    """The local directory of `path`, or None after adding a problem."""
    from rlx.models import BUILTIN_PREFIX, resolve_model_path

    if path.startswith(BUILTIN_PREFIX):
        try:
            return resolve_model_path(path)
        except ValueError as e:
            problems.append(str(e))
            return None
    local = os.path.expanduser(path)
    if not os.path.isdir(local):
        cached = _hf_cache_snapshot(path) if _REPO_ID.match(path) and not os.path.exists(local) else None
        if cached:
            return cached
        what = "does not exist" if not os.path.exists(local) else "is not a directory"
        hub = (f" (nor a model in the local Hugging Face cache; download it first: hf download {path} "
               f"--local-dir <dir>, then {key}=<dir>)" if _REPO_ID.match(path) else "")
        problems.append(f"{key}={path!r} {what}{hub}. Fix: give a local HF model directory (config.json, tokenizer, "
                        f"weights) or a built-in model, e.g. {key}=builtin://tiny-qwen2.")
        return None
    names = os.listdir(local)
    missing = []
    if "config.json" not in names:
        missing.append("config.json")
    if not any(n.startswith("tokenizer") or n in ("vocab.json", "spiece.model") for n in names):
        missing.append("a tokenizer (tokenizer.json / tokenizer_config.json)")
    if weights and not any(_WEIGHTS.match(n) for n in names):
        missing.append("weights (*.safetensors or *.bin)")
    if missing:
        problems.append(f"{key}={path!r} is not a complete HF model directory: no {', no '.join(missing)}. Fix: point "
                        f"{key} at the directory that save_pretrained / hf download wrote.")
        return None
    return local


def _hf_cache_snapshot(repo_id: str) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(repo_id, "config.json")
    return os.path.dirname(found) if isinstance(found, str) else None


def _load_tokenizer(key: str, directory: str, trust_remote_code: bool, problems: list[str]):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - any loader failure is a bad model directory
        problems.append(f"{key}: the tokenizer in {directory!r} does not load ({type(e).__name__}: "
                        f"{_first_line(e)}). Fix: point {key} at a directory with a working tokenizer.")
        return None


def _check_critic_tokenizer(cfg: RLXConfig, tok_dir: str, tokenizer, problems: list[str]) -> None:
    """The critic reads the token ids of the driver's tokenizer: `critic.model.tokenizer_path` must name a tokenizer
    with the same vocabulary (its only use in rlx; verl loads it for the critic)."""
    key, path = "critic.model.tokenizer_path", cfg.critic.model.tokenizer_path
    directory = tok_dir if path in (cfg.data.tokenizer, cfg.actor_rollout_ref.model.path) else \
        _check_model(key, path, problems, weights=False)
    if directory is None or os.path.abspath(directory) == os.path.abspath(tok_dir):
        return
    critic_tok = _load_tokenizer(key, directory, cfg.critic.model.trust_remote_code, problems)
    if critic_tok is not None and critic_tok.get_vocab() != tokenizer.get_vocab():
        theirs, ours = critic_tok.get_vocab(), tokenizer.get_vocab()
        differ = sorted(set(theirs.items()) ^ set(ours.items()), key=lambda kv: kv[1])[:3]
        problems.append(f"{key}={path!r} has a different vocabulary from the tokenizer that encodes the data "
                        f"({len(theirs)} vs {len(ours)} tokens; e.g. {differ}): the critic reads the actor's token "
                        f"ids. Fix: leave {key} at its default (the actor's model) or point it at the same tokenizer.")


def _check_context(cfg: RLXConfig, model_dir: str, problems: list[str]) -> None:
    """Prompt + response must fit the model's context (else vLLM refuses it deep inside a worker)."""
    import json

    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        problems.append(f"actor_rollout_ref.model.path: {os.path.join(model_dir, 'config.json')} is unreadable "
                        f"({type(e).__name__}: {e}).")
        return
    override = cfg.actor_rollout_ref.model.override_config
    context = override.get("max_position_embeddings") or config.get("max_position_embeddings") \
        or config.get("text_config", {}).get("max_position_embeddings")
    d = cfg.data
    need = d.max_prompt_length + d.max_response_length
    if context and need > context:
        problems.append(f"data.max_prompt_length + data.max_response_length = {d.max_prompt_length} + "
                        f"{d.max_response_length} = {need} tokens exceed the model's context of {context} "
                        f"(max_position_embeddings of actor_rollout_ref.model.path={cfg.actor_rollout_ref.model.path!r})."
                        f" Fix: shorten them so the sum is at most {context}.")


# ---------------------------------------------------------------------------------------------- data and reward
def _tool_schemas(cfg: RLXConfig) -> list[dict] | None:
    """multi_turn's tool schemas (verl's data.tool_config_path / function_tool_path follow the rollout's): the
    prompts are rendered with them, as the tool agent renders them, so their length counts the schemas."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not (mt.tool_config_path or mt.function_tool_path):
        return None
    from rlx.workers.rollout.agent.tools import load_tools, schema_of

    try:
        tools = load_tools(mt.tool_config_path, mt.function_tool_path)
    except Exception:  # noqa: BLE001 - the rollout worker loads them again and reports the error by key
        return None
    return [schema_of(tool) for tool in tools.values()] or None


def _load_dataset(key: str, files, tokenizer, cfg: RLXConfig, problems: list[str]):
    from rlx.data.custom import build_dataset

    try:
        return build_dataset(files, tokenizer, cfg.data, tool_schemas=_tool_schemas(cfg))
    except ValueError as e:
        problems.append(f"{key}: {e}")
    except Exception as e:  # noqa: BLE001 - e.g. a tokenizer failing on a row: still a data problem, not a crash
        problems.append(f"{key}: loading {files!r} failed ({type(e).__name__}: {_first_line(e)}).")
    return None


def _check_batches(cfg: RLXConfig, train, problems: list[str]) -> None:
    key = "data.gen_batch_size" if cfg.data.gen_batch_size else "data.train_batch_size"
    size = cfg.data.gen_batch_size or cfg.data.train_batch_size
    if len(train) < size:
        problems.append(f"{key}={size} exceeds the {len(train)} prompts of data.train_files. Fix: use more data or "
                        f"a smaller {key}.")


def _check_reward(cfg: RLXConfig, plan: JobPlan, datasets: list, problems: list[str]):
    from rlx.reward.functions import is_builtin_source, known_data_sources, load_reward_fn

    try:
        fn = load_reward_fn(cfg.custom_reward_function, cfg.reward_model.score_kwargs)
    except ValueError as e:
        problems.append(f"{e}.")
        return None
    if not cfg.custom_reward_function.path and not plan.roles.reward_model:  # the reward model scores every source
        unknown = sorted({s for ds in datasets for s in ds.data_sources() if not is_builtin_source(s)})
        if unknown:
            problems.append(f"data_source {unknown} (column data.reward_fn_key={cfg.data.reward_fn_key!r}) has no "
                            f"built-in reward (known: {known_data_sources()} and aime*). Fix: set custom_reward_function.path=<file.py> "
                            f"defining compute_score(data_source, solution_str, ground_truth, extra_info=None).")
    return fn


def _check_lora_adapter(cfg: RLXConfig, problems: list[str]) -> None:
    """The adapter to start LoRA from is a peft LoRA directory rlx can use (its weights' fit to the model is checked
    when the workers build it)."""
    if not cfg.actor_rollout_ref.model.lora_adapter_path:
        return
    from rlx.engine.lora_adapter import read_adapter

    try:
        read_adapter(cfg.actor_rollout_ref.model)
    except ValueError as e:
        problems.append(f"{e}.")


# ---------------------------------------------------------------------------------------------- rollout
def _check_vllm(plan: JobPlan, problems: list[str]) -> None:
    """The vLLM the job will use (the rollout's or the judge's engine) is one rlx supports, built for the installed
    torch (read from its files)."""
    import torch

    from rlx.workers.rollout import vllm_compat

    version = vllm_compat.installed_version() if plan.uses_vllm else None
    if version is None:  # not installed: rollout.name=vllm is a config error, auto falls back to hf
        return
    try:
        vllm_compat.parse_version(version)
    except ValueError:
        log.warning("vLLM reports the version %r, which rlx cannot read; %s", version, vllm_compat.supported_line())
        return
    problem = vllm_compat.unsupported_reason(version) or vllm_compat.torch_mismatch(
        version, vllm_compat.installed_torch_pin(), torch.__version__)
    if problem:
        problems.append(problem)
    elif vllm_compat.newer_than_tested(version):
        log.warning("vLLM %s is newer than the releases rlx is tested with (%s)", version,
                    vllm_compat.supported_line())


# ---------------------------------------------------------------------------------------------- checkpoints
def _check_writable(cfg: RLXConfig, problems: list[str]) -> None:
    """`trainer.default_local_dir` must take files if anything goes there (checkpoints, file / tensorboard logs)."""
    import tempfile

    from rlx.config.trainer import local_dir_writers

    t = cfg.trainer
    if not local_dir_writers(cfg):
        return
    target = os.path.abspath(t.default_local_dir)
    probe = target
    while not os.path.exists(probe):  # the nearest existing ancestor: what `makedirs` will need to write into
        probe = os.path.dirname(probe)
    why = None
    if not os.path.isdir(probe):
        why = f"{probe} is a file, not a directory"
    else:
        try:
            with tempfile.TemporaryFile(dir=probe):
                pass
        except OSError as e:
            why = f"cannot create files in {probe} ({e.strerror or e})"
    if why:
        problems.append(f"trainer.default_local_dir={t.default_local_dir!r} is not writable: {why}. Checkpoints "
                        f"(trainer.save_freq) and logs go there. Fix: set trainer.default_local_dir to a writable "
                        f"directory.")


def _check_disk_space(cfg: RLXConfig, plan: JobPlan, problems: list[str]) -> None:
    """A job that saves checkpoints needs room for two on the disk of `trainer.default_local_dir`."""
    from rlx.checkpoint import space

    t = cfg.trainer
    if t.save_freq is None or t.save_freq <= 0:
        return
    try:
        size = space.estimate(cfg, plan)
    except Exception as e:  # noqa: BLE001 - the model's own problem is reported by _check_model
        log.warning("the size of a checkpoint could not be estimated (%s: %s)", type(e).__name__, _first_line(e))
        return
    free = space.free_bytes(t.default_local_dir)
    if free < 2 * size.total:
        problems.append(f"trainer.default_local_dir={t.default_local_dir!r}: a checkpoint of this job takes about "
                        f"{space.human(size.total)} ({size.describe()}), and its disk "
                        f"({space.nearest_existing(t.default_local_dir)}) has {space.human(free)} free: less than "
                        f"the two checkpoints a save needs room for (the new one is complete before an older one "
                        f"goes). Fix: free space there, set trainer.default_local_dir to a larger disk, or save less "
                        f"(actor_rollout_ref.actor.checkpoint.save_contents without hf_model, or "
                        f"trainer.save_freq=-1).")


def _check_resume(cfg: RLXConfig, plan: JobPlan, problems: list[str]) -> str | None:
    import dataclasses

    from rlx.checkpoint.store import check_resume_files, find_resume_dir

    t = cfg.trainer
    try:
        resume_dir = find_resume_dir(dataclasses.replace(
            t, default_local_dir=os.path.abspath(t.default_local_dir),
            resume_from_path=os.path.abspath(t.resume_from_path) if t.resume_from_path else None))
    except ValueError as e:
        problems.append(str(e))
        return None
    if not resume_dir:
        return None
    unsafe = check_resume_files(resume_dir)  # every file read as resume will read it: no code runs
    problems.extend(unsafe)
    if unsafe:
        return None
    found = len(problems)
    _check_resumed_models(cfg, plan, resume_dir, problems)
    return None if len(problems) > found else resume_dir


def _check_resumed_models(cfg: RLXConfig, plan: JobPlan, resume_dir: str, problems: list[str]) -> None:
    """Each role's model in the checkpoint (its meta.json record) is the model this run builds: class, layers,
    hidden and vocabulary sizes, LoRA, parameter names and shapes (built on the meta device: no weights read)."""
    import json

    from rlx.engine.architecture import differences, expected

    roles: dict[str, tuple[Any, str]] = {"actor": (cfg.actor_rollout_ref.model, "actor_rollout_ref.model")}
    if plan.roles.critic:
        roles["critic"] = (cfg.critic.model, "critic.model")
    for role, (model_cfg, key) in roles.items():
        meta_path = os.path.join(resume_dir, role, "meta.json")
        if not os.path.exists(meta_path):
            problems.append(f"{resume_dir} holds no complete {role} ({meta_path} is missing), which this run "
                            f"trains. Fix: resume from a checkpoint of this job (trainer.resume_from_path), or start "
                            f"fresh (trainer.resume_mode=disable).")
            continue
        with open(meta_path) as f:
            saved = json.load(f).get("model")
        if saved is None:  # written by an rlx before the record: the saved keys and shapes are compared instead
            from rlx.checkpoint.safety import unrecorded_model_problems

            problems += unrecorded_model_problems(model_cfg, key, role, meta_path)
            continue
        try:
            built = expected(model_cfg, role)
        except Exception as e:  # noqa: BLE001 - the model path's own problem is reported by _check_model
            log.warning("%s: the model could not be built on the meta device to compare with %s (%s: %s)", key,
                        meta_path, type(e).__name__, _first_line(e))
            continue
        diffs = differences(saved, built)
        if diffs:
            problems.append(f"{meta_path}: the checkpoint's {role} is another model than the one {key} builds "
                            f"({key}.path={model_cfg.path!r}): {'; '.join(diffs)}. Fix: resume with the model it "
                            f"was saved from ({key}.path, override_config and LoRA keys as then), or start fresh "
                            f"(trainer.resume_mode=disable, or another trainer.default_local_dir).")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
