#!/usr/bin/env python
"""How many of verl's own example commands rlx takes: every `python3 -m verl.trainer.main_ppo ...` of a verl
checkout's example scripts (and optionally verl-recipe's) through `python -m rlx.trainer.main_ppo ... --check`.

    git -C <verl clone> archive HEAD examples | tar -x -C /tmp/verl     # or any checkout's examples/ dir
    python scripts/verl_examples_check.py /tmp/verl/examples --recipe <verl-recipe checkout> --gsm8k <dir>

`--gsm8k` is a directory with GSM8K's train.jsonl / test.jsonl (converted by scripts/prepare_gsm8k.py; only prompts
short enough for any script's max_prompt_length under the tiny model's byte tokenizer are kept), or `--data` a
directory that already holds train.parquet / test.parquet. Nothing is copied from the scripts into this repository:
they are read from the paths given.

Each command is read without running the script (scripts/shell_commands.py: continuation lines, variables with their
defaults, arithmetic), then only the machine-bound values are swapped:
- model paths (actor, critic, tokenizers, reward model) -> builtin://tiny-qwen2, its context raised to the script's
  prompt + response length (override_config.max_position_embeddings);
- data.train_files / data.val_files -> the GSM8K parquet (data.prompt_key -> prompt); for a max_prompt_length below
  the longest prompt kept, a copy whose prompts are cut to fit;
- the tiny model's attention heads raised to the script's largest sequence-parallel size above its 4 heads
  (override_config.num_attention_heads: sp must divide the heads);
- trainer.nnodes -> 1, trainer.n_gpus_per_node -> the largest divisor of the script's world size up to
  max(8, its sequence-parallel size) (so every batch-size rule of the script still divides),
  actor_rollout_ref.rollout.tensor_model_parallel_size -> 1, trainer.device -> cpu;
- trainer.default_local_dir -> a temporary directory; custom_reward_function.path and --config-path naming a file of
  the script's machine under examples/ or recipe/ -> the checkout's (`--config-path=config` stays: as in Hydra it is
  the trainer's own config dir).
- with --recipe, the checkout is importable as the package `recipe` (verl mounts verl-recipe as recipe/ and runs
  from its own root, so a recipe's files import `recipe.<name>.<module>`).
Commands for other trainers (Megatron, SGLang / TensorRT-LLM rollouts, other strategies) and other entry points
(recipe.*.main_*) are counted apart and not checked; `--engines` checks the SGLang / TensorRT-LLM ones too, as they
are, counted apart: rlx refuses their engine in one line and `--check` goes on, so the count of those refused for the
engine alone says how many would pass with `actor_rollout_ref.rollout.name=vllm`.

Printed: the counts (composed = the config composes and types, passed = `--check` exits 0), the first refusal of
each refused command grouped by stage and key, with a count and an example, then every refusal named (validation
and the preflight list all their problems; composition stops at the first unknown key). `-v` prints every command's
result; `--json FILE` writes them.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import io
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, ROOT)

from shell_commands import Command, read_commands  # noqa: E402

MODULE = "verl.trainer.main_ppo"
TINY = "builtin://tiny-qwen2"
TINY_CONTEXT, TINY_HEADS, TINY_HIDDEN = 512, 4, 128
MAX_PROMPT_BYTES = 240  # GSM8K prompts kept: the byte tokenizer makes one token per byte
MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path", "critic.model.tokenizer_path", "data.tokenizer",
              "reward_model.model.path", "reward_model.model.input_tokenizer")
# files a script names beside itself or in verl's tree: mapped to the checkout's copies (see map_path)
PATH_KEYS = ("custom_reward_function.path", "actor_rollout_ref.rollout.multi_turn.tool_config_path",
             "actor_rollout_ref.rollout.multi_turn.function_tool_path",
             "actor_rollout_ref.rollout.agent.agent_loop_config_path", "data.custom_cls.path",
             "actor_rollout_ref.rollout.multi_turn.interaction_config_path")
SP_KEYS = ("actor_rollout_ref.actor.ulysses_sequence_parallel_size",
           "actor_rollout_ref.ref.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size")
KEY = re.compile(r"\+{0,2}([A-Za-z_][\w]*(?:\.[\w]+)+)")
REFUSED_ENGINES = ("sglang", "trtllm")  # rollout engines rlx refuses by name: checked as they are with --engines
ENGINE_KEY = "actor_rollout_ref.rollout.name"


@dataclass
class Result:
    script: str
    line: int
    kind: str  # fsdp | megatron | sglang | ... (what trainer the command is for)
    argv: list[str] = field(default_factory=list)
    code: int | None = None
    stage: str = ""  # passed | compose | validate | preflight | crash
    first: str = ""  # the first refusal, one line
    output: str = ""

    @property
    def composed(self) -> bool:
        return self.stage in ("passed", "validate", "preflight")

    @property
    def checked(self) -> bool:
        return self.code is not None


def engine_refusal(stage: str, problem: str) -> bool:
    """Whether a refusal is the engine's: rollout.name, or the refused engine's own engine_kwargs (which go with it)."""
    key = reason_key(stage, problem)
    return key == f"validate: {ENGINE_KEY}" or any(
        key == f"validate: actor_rollout_ref.rollout.engine_kwargs.{e}" for e in REFUSED_ENGINES)


def engine_only(r: Result) -> bool:
    """Whether every refusal of a command for an engine rlx refuses is the engine's: with
    `actor_rollout_ref.rollout.name=vllm` (and its engine_kwargs moved or dropped) it would pass --check."""
    problems = all_refusals(r)
    return r.stage == "validate" and bool(problems) and all(engine_refusal(r.stage, p) for p in problems)


# ---------------------------------------------------------------------------------------------- commands
def split_override(arg: str) -> tuple[str, str, str] | None:
    """(prefix +/++/~, key, value) of a Hydra override, or None for a flag."""
    if arg.startswith("-"):
        return None
    m = re.match(r"^(\+\+|\+|~)?([^=]+)=(.*)$", arg, re.S)
    if not m:
        return ("~", arg[1:], "") if arg.startswith("~") else None
    return m.group(1) or "", m.group(2), m.group(3)


def config_flags(args: list[str]) -> dict[str, str]:
    """--config-path / --config-name (either spelling: `--flag=value` or `--flag value`)."""
    out, it = {}, iter(args)
    for a in it:
        for flag, short in (("--config-path", "-cp"), ("--config-name", "-cn")):
            if a in (flag, short):
                out[flag] = next(it, "")
            elif a.startswith(flag + "=") or a.startswith(short + "="):
                out[flag] = a.split("=", 1)[1]
    return out


def trainer_kind(cmd: Command, roots: dict[str, str]) -> str:
    """fsdp (what rlx runs) or the other trainer the command is for."""
    values = {k: v for k, v in (split_override(a)[1:] for a in cmd.args if split_override(a))}
    flags = config_flags(cmd.args)
    name = flags.get("--config-name", "")
    config_text = ""
    candidate = os.path.join(map_path(flags.get("--config-path", ""), roots), name.removesuffix(".yaml") + ".yaml")
    if flags.get("--config-path") and os.path.isfile(candidate):
        with open(candidate, encoding="utf-8", errors="replace") as f:
            config_text = f.read()
    strategies = {values.get(k) for k in ("actor_rollout_ref.actor.strategy", "critic.strategy")} - {None}
    if "megatron" in name or "megatron" in strategies or re.search(r"ppo_megatron_trainer", config_text):
        return "megatron"
    other = sorted(s for s in strategies if s not in ("fsdp", "fsdp2"))
    if other:
        return f"strategy {other[0]}"
    engine = values.get("actor_rollout_ref.rollout.name", "vllm")
    if engine not in ("vllm", "hf", "auto"):
        return engine
    return "fsdp"


def world_for_check(values: dict[str, str]) -> int:
    """The largest divisor of the script's world size up to max(8, its largest sp): every divisibility rule the
    script's batch sizes meet still holds."""
    def as_int(key, default):
        try:
            return int(values.get(key, default))
        except ValueError:
            return default

    world = max(1, as_int("trainer.nnodes", 1) * as_int("trainer.n_gpus_per_node", 8))
    sp = max([as_int(k, 1) for k in SP_KEYS] + [1])
    cap = max(8, sp)
    return max(d for d in range(1, min(world, cap) + 1) if world % d == 0)


def swap(cmd: Command, data_dir: str, work: str, roots: dict[str, str], index: int) -> list[str]:
    """`data_dir`: the GSM8K parquet (prepare_data); copies with shorter prompts go under `work`."""
    """The command's arguments with the machine-bound values swapped (see the module docstring)."""
    args, it = [], iter(cmd.args)
    for a in it:  # `--config-path X` -> `--config-path=X`
        if a in ("--config-path", "-cp", "--config-name", "-cn"):
            a = f"{a}={next(it, '')}"
        args.append(a)
    parsed = [(a, split_override(a)) for a in args]
    values = {p[1]: p[2] for _, p in parsed if p}
    out = []
    for arg, p in parsed:
        if p is None:
            if arg.startswith(("--config-path=", "-cp=")):  # `config`: the trainer's own config dir (Hydra's rule)
                arg = "--config-path=" + map_path(arg.split("=", 1)[1], roots)
            out.append(arg)
            continue
        prefix, key, value = p
        if prefix == "~" and "=" not in arg:
            out.append(arg)
            continue
        if key in MODEL_KEYS and value not in ("", "null", "None"):
            value = TINY
        elif key in ("data.train_files", "data.val_files"):
            split = "train" if key == "data.train_files" else "test"
            value = os.path.join(data_fitting(data_dir, work, _int(values.get("data.max_prompt_length"), 512)),
                                 f"{split}.parquet")
        elif key == "data.prompt_key":
            value = "prompt"
        elif key in ("trainer.nnodes", "trainer.n_gpus_per_node", "trainer.device", "trainer.default_local_dir",
                     "actor_rollout_ref.rollout.tensor_model_parallel_size"):
            continue  # set below
        elif key in PATH_KEYS:
            value = map_path(value, roots, os.path.dirname(cmd.path))
        elif key.endswith(("override_config.max_position_embeddings", "override_config.num_attention_heads")):
            continue  # set below, at least the script's value
        out.append(f"{prefix}{key}={value}")
    need = _int(values.get("data.max_prompt_length"), 512) + _int(values.get("data.max_response_length"), 512)
    given = max([_int(v, 0) for k, v in values.items() if k.endswith("model.override_config.max_position_embeddings")]
                + [0])
    context = max(need, given)
    if context > TINY_CONTEXT:
        out.append(f"actor_rollout_ref.model.override_config.max_position_embeddings={context}")
    for model_key, sp_keys in (("actor_rollout_ref.model", SP_KEYS[:2]), ("critic.model", SP_KEYS[2:])):
        sp = max([_int(values.get(k), 1) for k in sp_keys] + [1])
        if sp > TINY_HEADS and TINY_HIDDEN % sp == 0:
            out.append(f"{model_key}.override_config.num_attention_heads={sp}")
    out += ["trainer.nnodes=1", f"trainer.n_gpus_per_node={world_for_check(values)}", "trainer.device=cpu",
            f"trainer.default_local_dir={os.path.join(work, 'ckpt', str(index))}"]
    out.append("actor_rollout_ref.rollout.tensor_model_parallel_size=1")  # verl's default is 2: a GPU count too
    return out


def map_path(value: str, roots: dict[str, str], script_dir: str | None = None) -> str:
    """A path of the script's machine as the checkout's file: `.../examples/x` -> <examples>/x, `.../recipe/x` ->
    <verl-recipe>/x (verl mounts verl-recipe as recipe/), a relative path that is the script's neighbour -> that
    file; unchanged when it exists or has no such part."""
    if not value or os.path.exists(value):
        return value
    if script_dir and not os.path.isabs(value) and os.path.exists(os.path.join(script_dir, value)):
        return os.path.abspath(os.path.join(script_dir, value))
    for marker, base in (("recipe/", roots.get("recipe")), ("examples/", roots.get("examples"))):
        m = re.search(r"(?:^|/)" + re.escape(marker), value)
        if base and m:
            candidate = os.path.join(base, value[m.end():])
            if os.path.exists(candidate):
                return candidate
    return value


def import_root(recipe: str, work: str) -> str:
    """A folder in which the verl-recipe checkout is the package `recipe`, as in verl's tree (a `recipe` link):
    put on the path of each --check (`run_check`)."""
    root = os.path.join(work, "import_root")
    os.makedirs(root, exist_ok=True)
    link = os.path.join(root, "recipe")
    if not os.path.lexists(link):
        os.symlink(recipe, link)
    return root


def _int(text, default: int) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


# ---------------------------------------------------------------------------------------------- running --check
def run_check(argv: list[str], in_process: bool, path: tuple[str, ...] = ()) -> tuple[int, str]:
    """--check's exit code and output; `path`: folders the users' files import from (first on the path)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, *filter(None, [os.environ.get("PYTHONPATH")])]))
    if not in_process:
        proc = subprocess.run([sys.executable, "-m", "rlx.trainer.main_ppo", *argv, "--check"], cwd=ROOT,
                              capture_output=True, text=True, timeout=600, env=env)
        return proc.returncode, proc.stdout + proc.stderr
    from rlx.trainer.main_ppo import main

    buf = io.StringIO()
    saved, saved_env = list(sys.path), dict(os.environ)
    sys.path[:0] = path
    os.environ.update(env)  # the processes the check starts (the reward file's scoring pool) import from there too
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            code = main([*argv, "--check"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except Exception as e:  # noqa: BLE001 - an uncaught error is what the harness reports
            print(f"uncaught {type(e).__name__}: {e}")
            code = 1
        finally:
            sys.path[:] = saved
            os.environ.clear()
            os.environ.update(saved_env)
    return code, buf.getvalue()


def classify(code: int, output: str) -> tuple[str, str]:
    """(stage, the first refusal in one line) from --check's exit code and output."""
    if code == 0:
        return "passed", ""
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    first_error = next((ln for ln in lines if ln.lstrip().startswith("- ")), "")
    if "uncaught " in output or code not in (0, 2):
        line = next((ln for ln in lines if ln.startswith("uncaught ")), lines[-1] if lines else "")
        return "crash", line
    if "Invalid rlx config:" in output:
        return "validate", first_error.lstrip()[2:]
    if "the job cannot start" in output:
        return "preflight", first_error.lstrip()[2:]
    line = next((ln for ln in lines if ln.startswith("rlx:") and "note:" not in ln), "")
    if line == "rlx: config error":
        line = lines[lines.index(line) + 1] if lines.index(line) + 1 < len(lines) else line
    return "compose", line


def all_refusals(r: Result) -> list[str]:
    """Every problem --check listed for a refused command (one for a composition error)."""
    if r.stage in ("validate", "preflight"):
        return [ln.strip()[2:] for ln in r.output.splitlines() if ln.startswith("  - ")]
    return [r.first] if r.stage not in ("passed", "") else []


def reason_key(stage: str, first: str) -> str:
    """The group of a refusal: its stage and the first config key it names."""
    m = re.search(r"Unknown config key '([^']+)'", first)
    if m:
        return f"unknown key {m.group(1).split('=')[0].lstrip('+')}"
    m = KEY.search(first)
    return f"{stage}: {m.group(1)}" if m else f"{stage}: {first[:70]}"


# ---------------------------------------------------------------------------------------------- data
def prepare_data(gsm8k: str, out: str) -> str:
    """GSM8K parquet with the prompts that fit any script's max_prompt_length under the byte tokenizer."""
    import pyarrow.parquet as pq

    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "prepare_gsm8k.py"), "--input_dir", gsm8k,
                    "--output_dir", out], check=True, stdout=subprocess.DEVNULL)
    for split in ("train", "test"):
        path = os.path.join(out, f"{split}.parquet")
        table = pq.read_table(path)
        keep = [len(row[0]["content"].encode()) <= MAX_PROMPT_BYTES for row in table.column("prompt").to_pylist()]
        import pyarrow as pa

        pq.write_table(table.filter(pa.array(keep)), path)
    return out


def data_fitting(data_dir: str, work: str, max_prompt_length: int) -> str:
    """`data_dir`, or (for a max_prompt_length below MAX_PROMPT_BYTES + a margin) a copy with each prompt cut to fit
    (made once per length)."""
    budget = max_prompt_length - 16  # room for the chat template's tokens
    if budget >= MAX_PROMPT_BYTES:
        return data_dir
    out = os.path.join(work, f"gsm8k_prompt{max_prompt_length}")
    if os.path.isdir(out):
        return out
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(out)
    for split in ("train", "test"):
        rows = pq.read_table(os.path.join(data_dir, f"{split}.parquet")).to_pylist()
        for row in rows:
            for message in row["prompt"]:
                message["content"] = message["content"].encode()[:max(budget, 1)].decode("utf-8", "ignore")
        pq.write_table(pa.Table.from_pylist(rows), os.path.join(out, f"{split}.parquet"))
    return out


# ---------------------------------------------------------------------------------------------- report
def report(results: list[Result], others: collections.Counter, scripts: int) -> str:
    checked = [r for r in results if r.kind == "fsdp"]
    kinds = collections.Counter(r.kind for r in results if r.kind != "fsdp" and not r.checked)
    lines = [f"{scripts} scripts; {len(results)} `{MODULE}` commands",
             "  other trainers, not checked: " + (", ".join(f"{k} {n}" for k, n in kinds.most_common()) or "none"),
             "  other entry points, not checked: " + (", ".join(f"{k} {n}" for k, n in others.most_common())
                                                       or "none"),
             "",
             f"FSDP commands checked: {len(checked)}",
             f"  composed: {sum(r.composed for r in checked)}",
             f"  passed --check: {sum(r.stage == 'passed' for r in checked)}",
             "",
             "First refusal of each refused command (grouped by stage and key):",
             f"  {'count':>5}  {'reason':<66} example"]
    groups: dict[str, list[Result]] = collections.defaultdict(list)
    for r in checked:
        if r.stage != "passed":
            groups[reason_key(r.stage, r.first)].append(r)
    for key, rs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"  {len(rs):>5}  {key:<66} {os.path.basename(rs[0].script)}")
        lines.append(f"  {'':>5}    {rs[0].first[:220]}")
    every: dict[str, set[str]] = collections.defaultdict(set)
    for r in checked:
        for problem in all_refusals(r):
            every[reason_key(r.stage, problem)].add(r.script + f":{r.line}")
    lines += ["", "Every refusal named (commands it blocks, first or not):"]
    for key, where in sorted(every.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"  {len(where):>5}  {key}")
    engines = [r for r in results if r.kind in REFUSED_ENGINES and r.checked]
    if engines:
        lines += ["", f"Commands for a rollout engine rlx refuses, checked as they are (--engines): {len(engines)}",
                  f"  refused for the engine alone ({ENGINE_KEY} and its engine_kwargs; would pass with =vllm): "
                  f"{sum(engine_only(r) for r in engines)}",
                  "  refused for more (every refusal but the engine's):"]
        for r in engines:
            if not engine_only(r):
                rest = [reason_key(r.stage, p) for p in all_refusals(r) if not engine_refusal(r.stage, p)]
                lines.append(f"    {r.script}:{r.line}  {'; '.join(rest) or r.stage + ': ' + r.first[:120]}")
    unnamed = [r for r in checked if r.stage != "passed" and not KEY.search(r.first)]
    if unnamed:
        lines += ["", f"Refusals that name no config key: {len(unnamed)}"]
        lines += [f"  {os.path.basename(r.script)}: {r.first[:200]}" for r in unnamed]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("examples", help="a verl checkout's examples/ directory (or any directory of .sh scripts)")
    parser.add_argument("--recipe", help="a verl-recipe checkout (its .sh scripts are read too)")
    parser.add_argument("--gsm8k", help="directory with GSM8K train.jsonl / test.jsonl")
    parser.add_argument("--data", help="directory with train.parquet / test.parquet already prepared")
    parser.add_argument("--work", help="scratch directory (default: a new temporary one)")
    parser.add_argument("--subprocess", action="store_true",
                        help="run each --check as its own process (slower; default: in this process)")
    parser.add_argument("--engines", action="store_true",
                        help="check the commands for SGLang / TensorRT-LLM rollouts too, as they are (counted apart)")
    parser.add_argument("--only", help="check only the scripts whose path contains this text")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every command's result")
    parser.add_argument("--json", help="write every command's result to this file")
    args = parser.parse_args(argv)
    if not (args.gsm8k or args.data):
        parser.error("give --gsm8k <dir with train.jsonl/test.jsonl> or --data <dir with train/test.parquet>")
    work = args.work or tempfile.mkdtemp(prefix="verl_examples_check_")
    data_dir = args.data or prepare_data(args.gsm8k, os.path.join(work, "gsm8k"))
    logging.basicConfig(level=logging.ERROR, stream=io.StringIO())  # rlx's info lines stay out of the table
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    roots = {"examples": os.path.abspath(args.examples)}
    imports: tuple[str, ...] = ()  # where the users' files import from
    if args.recipe:
        roots["recipe"] = os.path.abspath(args.recipe)
        imports = (import_root(roots["recipe"], work),)
    results, others, scripts = [], collections.Counter(), 0
    for root in roots.values():
        for path in sorted(glob.glob(os.path.join(root, "**", "*.sh"), recursive=True)):
            if args.only and args.only not in path:
                continue
            commands = read_commands(path)
            scripts += bool(commands)
            for cmd in commands:
                if cmd.module != MODULE:
                    others[cmd.module] += 1
                    continue
                r = Result(os.path.relpath(path, os.path.dirname(root)), cmd.line, trainer_kind(cmd, roots))
                results.append(r)
                if r.kind != "fsdp" and not (args.engines and r.kind in REFUSED_ENGINES):
                    continue
                r.argv = swap(cmd, data_dir, work, roots, len(results))
                r.code, r.output = run_check(r.argv, not args.subprocess, imports)
                r.stage, r.first = classify(r.code, r.output)
                if args.verbose:
                    print(f"[{r.stage:>9}] {r.script}:{r.line}  {r.first[:160]}", flush=True)
    print(report(results, others, scripts))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.__dict__ for r in results], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
