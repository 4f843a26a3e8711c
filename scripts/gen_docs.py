"""Render the docs' tables of config keys from the schema (rlx/config/schema.py), so that no doc can disagree with it.

    python scripts/gen_docs.py           # rewrite every generated block in README.md and docs/*.md
    python scripts/gen_docs.py --check   # exit 1, naming the files, when a block differs from the schema

A generated block sits between two markers in a Markdown file; the first names the table and its arguments:

    <!-- gen:keys actor_rollout_ref.model.use_fused_kernels actor_rollout_ref.model.activation_offload.* -->
    (the table: written by this script, never by hand)
    <!-- /gen -->

Tables:
- `keys K ...`: | key | default | what it does |, the default from `RLXConfig()` and the text from the field's
  docstring (the comment of the key in rlx/trainer/config/ppo_trainer.yaml); `K.*` is every key of section K.
- `verl_default_exceptions`: the keys whose default is not verl's (`VERL_DEFAULT_EXCEPTIONS`), with the reason.
- `no_op_by_design`, `deprecated`, `follows`, `not_supported`: the key lists of the same names in
  rlx/config/verl_compat.py.

tests/unit/test_docs.py fails when a block is stale or names a key the schema does not have.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import sys
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rlx.config import schema, verl_compat  # noqa: E402
from rlx.config.export import field_docs  # noqa: E402

BLOCK = re.compile(r"(<!-- gen:(\w+)(.*?)-->\n)(.*?)(<!-- /gen -->)", re.DOTALL)


def files(root: Path = ROOT) -> list[Path]:
    """The Markdown files that may hold generated blocks."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def value(v) -> str:
    """A default as it is written on the command line, in backticks."""
    if v is None:
        text = "null"
    elif isinstance(v, bool):
        text = str(v)
    elif isinstance(v, str):
        text = v if v else "''"
    elif isinstance(v, (list, dict)):
        text = json.dumps(v)
    else:
        text = repr(v)
    return f"`{text}`"


def cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


@functools.lru_cache(maxsize=None)
def _docs(cls) -> dict[str, str]:
    return field_docs(cls)


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


@functools.lru_cache(maxsize=1)
def _defaults() -> schema.RLXConfig:
    return schema.RLXConfig()


@functools.lru_cache(maxsize=None)
def lookup(key: str):
    """(the default, the docstring, the field's type) of a dotted key; ValueError for a key the schema lacks."""
    obj, cls = _defaults(), schema.RLXConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        names = {f.name for f in dataclasses.fields(cls)}
        if part not in names:
            raise ValueError(f"{key}: the schema has no key {'.'.join(parts[:i + 1])!r}. Fix: correct the key in "
                             f"the doc's gen:keys marker (rlx/trainer/config/ppo_trainer.yaml lists every key).")
        hint = _hints(cls)[part]
        doc = _docs(cls).get(part, "")
        obj = getattr(obj, part)
        if i < len(parts) - 1:
            if not dataclasses.is_dataclass(hint):
                raise ValueError(f"{key}: {'.'.join(parts[:i + 1])} is a leaf key, not a section. Fix: correct the "
                                 f"key in the doc's gen:keys marker.")
            cls = hint
    return obj, doc, hint


def expand(keys: list[str]) -> list[str]:
    """`section.*` -> every leaf key of the section, in the schema's order; other keys as given."""
    out = []
    for key in keys:
        if not key.endswith(".*"):
            out.append(key)
            continue
        section = key[:-2]
        _, _, hint = lookup(section)
        if not dataclasses.is_dataclass(hint):
            raise ValueError(f"{key}: {section} is a leaf key, not a section. Fix: drop the '.*'.")
        hints = _hints(hint)
        for f in dataclasses.fields(hint):
            out += expand([f"{section}.{f.name}.*"]) if dataclasses.is_dataclass(hints[f.name]) else \
                [f"{section}.{f.name}"]
    return out


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def render(name: str, args: list[str]) -> str:
    if name == "keys":
        if not args:
            raise ValueError("gen:keys names no key. Fix: list the keys in the marker.")
        rows = []
        for key in expand(args):
            default, doc, hint = lookup(key)
            if dataclasses.is_dataclass(hint):
                raise ValueError(f"{key} is a section. Fix: write {key}.* for its keys.")
            rows.append([f"`{key}`", value(default), cell(doc)])
        return table(["key", "default", "what it does"], rows)
    if args:
        raise ValueError(f"gen:{name} takes no arguments (got {args}). Fix: drop them.")
    if name == "verl_default_exceptions":
        rows = [[f"`{k}`", value(r), value(v), cell(why)] for k, (r, v, why) in verl_compat.VERL_DEFAULT_EXCEPTIONS.items()]
        return table(["key", "rlx", "verl 0.9.1", "why"], rows)
    if name == "no_op_by_design":
        return table(["key", "accepted with any value, no effect, because"],
                     [[f"`{k}`", cell(why)] for k, why in sorted(verl_compat.NO_OP_BY_DESIGN.items())])
    if name == "deprecated":
        return table(["verl's deprecated key", "taken as (divided per GPU, with a note)"],
                     [[f"`{k}`", f"`{v}`"] for k, v in verl_compat.DEPRECATED.items()])
    if name == "follows":
        return table(["key", "mirrors (rlx reads this one; another value is refused)"],
                     [[f"`{k}`", f"`{v}`"] for k, v in verl_compat.FOLLOWS.items()])
    if name == "not_supported":
        return table(["key", "the only value accepted (verl's default)", "why"],
                     [[f"`{k}`", value(v), cell(verl_compat.NOT_SUPPORTED_REASONS.get(k, "not implemented yet"))]
                      for k, v in sorted(verl_compat.NOT_SUPPORTED.items())])
    raise ValueError(f"gen:{name} is not a table of scripts/gen_docs.py. Fix: one of keys, verl_default_exceptions, "
                     f"no_op_by_design, deprecated, follows, not_supported.")


def regenerate(text: str, where: str = "") -> str:
    """`text` with every generated block rendered anew (ValueError naming `where` for a bad marker)."""
    def one(m: re.Match) -> str:
        try:
            body = render(m.group(2), m.group(3).split())
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        return m.group(1) + body + m.group(5)

    return BLOCK.sub(one, text)


def stale(root: Path = ROOT) -> list[str]:
    """The files whose generated blocks differ from what the schema renders."""
    out = []
    for path in files(root):
        text = path.read_text()
        if regenerate(text, str(path.relative_to(root))) != text:
            out.append(str(path.relative_to(root)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated block is stale")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        if bad:
            print(f"stale generated blocks in {bad}. Fix: python scripts/gen_docs.py", file=sys.stderr)
            return 1
        return 0
    for path in files():
        text = path.read_text()
        new = regenerate(text, str(path.relative_to(ROOT)))
        if new != text:
            path.write_text(new)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
