"""Write the YAML view of the typed config: `python -m rlx.config.export [out.yaml]`.

The field docstrings of the dataclasses become comments, so the YAML documents every key.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import sys
import textwrap
import typing

from rlx.config.schema import RLXConfig

HEADER = """\
# rlx PPO/GRPO trainer config -- generated from rlx/config/schema.py by `python -m rlx.config.export`.
# Do not edit by hand: change the dataclasses and regenerate (a test keeps the two identical).
# Key names follow verl's ppo_trainer.yaml; override any key on the command line: key=value.
"""


def field_docs(cls) -> dict[str, str]:
    """Attribute docstrings: the string literal right under each annotated field."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    cls_def = tree.body[0]
    assert isinstance(cls_def, ast.ClassDef)  # the source of a class
    body = cls_def.body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                and isinstance(nxt.value.value, str) and isinstance(node.target, ast.Name):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _scalar(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)  # strings, lists and dicts as JSON flow style (valid YAML)


def _emit(obj, indent: int, lines: list[str]) -> None:
    cls = type(obj)
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    pad = "  " * indent
    for f in dataclasses.fields(cls):
        value = getattr(obj, f.name)
        doc = docs.get(f.name, "")
        if dataclasses.is_dataclass(hints[f.name]):
            if indent == 0:
                lines.append("")
            lines.append(f"{pad}{f.name}:" + (f"  # {doc}" if doc else ""))
            _emit(value, indent + 1, lines)
        else:
            lines.append(f"{pad}{f.name}: {_scalar(value)}" + (f"  # {doc}" if doc else ""))


def render() -> str:
    lines: list[str] = []
    _emit(RLXConfig(), 0, lines)
    return HEADER + "\n".join(lines).lstrip("\n") + "\n"


def missing_docs(cls=RLXConfig, prefix: str = "") -> list[str]:
    """Dotted keys whose field has no docstring (a test requires none)."""
    out = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not docs.get(f.name):
            out.append(prefix + f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            out += missing_docs(hints[f.name], prefix + f.name + ".")
    return out


if __name__ == "__main__":
    from rlx.config.loader import CONFIG_DIR

    out = sys.argv[1] if len(sys.argv) > 1 else str(CONFIG_DIR / "ppo_trainer.yaml")
    with open(out, "w") as fh:
        fh.write(render())
    print(f"wrote {out}")
