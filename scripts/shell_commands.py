"""Read the `python -m <module> ...` commands out of a bash script without running it.

A small reader for the shape of training launch scripts: continuation lines are joined, simple variable assignments
(`NAME=value`, `export NAME=value`, `NAME=${NAME:-default}`) are recorded in order, `$VAR`, `${VAR}`,
`${VAR:-default}` (and `-`, `:=`, `:+`, `#`, `%` forms), `$((arithmetic))` and a few command substitutions (`date`,
`pwd`, GPU counts) are expanded, and `if [ "$a" = "b" ]` branches are followed when the test can be evaluated (else
the first branch). Nothing in the script is executed. What cannot be resolved is expanded to an empty string and
reported in `Command.unresolved`.
"""
from __future__ import annotations

import ast
import fnmatch
import operator
import os
import re
import shlex
from dataclasses import dataclass, field

DEFAULT_ENV = {"HOME": "/home/user", "PWD": "/workspace/verl", "USER": "user"}
_ASSIGN = re.compile(r"^(?:export\s+|local\s+|readonly\s+|declare\s+(?:-\w+\s+)*)?([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$",
                     re.S)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL = {"|", "||", "&&", ";", "&", ";;"}


@dataclass
class Command:
    """One `python -m <module> args...` found in a script."""
    path: str
    line: int
    module: str
    args: list[str]
    unresolved: list[str] = field(default_factory=list)


class Expander:
    def __init__(self, env: dict[str, str], script: str | None = None):
        self.env = env
        self.script = script  # the script's own path: what ${BASH_SOURCE[0]} and $0 name
        self.arrays: dict[str, list[str]] = {}
        self.unresolved: list[str] = []

    def assign(self, name: str, value: str, append: bool = False) -> None:
        """`NAME=value`, `NAME=(w1 w2 ...)` (an array), `NAME+=...`."""
        value = value.strip()
        if value.startswith("(") and value.endswith(")"):
            words = shlex.split(self.expand(value[1:-1]))
            self.arrays[name] = (self.arrays.get(name, []) if append else []) + words
            self.env[name] = self.arrays[name][0] if self.arrays[name] else ""
            return
        word = self.word(value)
        self.env[name] = (self.env.get(name, "") if append else "") + word
        if name in self.arrays:
            self.arrays[name][:1] = [self.env[name]]

    # ---------------------------------------------------------------------------------------------- $-constructs
    def dollar(self, s: str, i: int) -> tuple[str | list[str], int]:
        """Expand the construct starting at s[i] == '$'; returns (value, index after it)."""
        if s.startswith("$((", i):
            end = _balanced(s, i + 1, "(", ")")
            return self.arithmetic(s[i + 3:end - 2]), end
        if s.startswith("$(", i):
            end = _balanced(s, i + 1, "(", ")")
            return self.substitution(s[i + 2:end - 1]), end
        if s.startswith("${", i):
            end = _balanced(s, i + 1, "{", "}")
            return self.braced(s[i + 2:end - 1]), end
        m = _NAME.match(s, i + 1)
        if m:
            return self.var(m.group()), m.end()
        if i + 1 < len(s) and (s[i + 1].isdigit() or s[i + 1] in "@*#?$!-"):
            return "", i + 2  # positional parameters and specials: the script is run without arguments
        return "$", i + 1

    def var(self, name: str) -> str:
        if name in self.env:
            return self.env[name]
        self.unresolved.append(name)
        return ""

    def braced(self, body: str) -> str | list[str]:
        """`${...}`: a string, or the words of an array (`${A[@]}`)."""
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[([^]]*)\]", body)
        if m:
            name, index = m.groups()
            words = self.arrays.get(name, [self.env[name]] if name in self.env else [])
            if name not in self.arrays and name not in self.env:
                self.unresolved.append(body)
            if index in ("@", "*"):
                return words
            k = _int(self.arithmetic(index))
            return words[k] if k is not None and 0 <= k < len(words) else ""
        if body.startswith("#"):
            return str(len(self.env.get(body[1:], "")))
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*|\d+|[@*])(.*)$", body, re.S)
        if not m:
            return ""
        name, op = m.group(1), m.group(2)
        is_set = name in self.env
        value = self.env.get(name, "")
        for sym, null_counts in ((":-", True), ("-", False), (":=", True), ("=", False), (":+", True), ("+", False)):
            if op.startswith(sym):
                word = self.word(op[len(sym):])
                missing = (not is_set) or (null_counts and value == "")
                if sym.endswith("+"):
                    return "" if missing else word
                if missing:
                    if sym.endswith("=") and _NAME.fullmatch(name):
                        self.env[name] = word
                    return word
                return value
        if not is_set and not name.isdigit() and name not in "@*":
            self.unresolved.append(name)
        for sym in ("##", "#", "%%", "%"):
            if op.startswith(sym):
                return _trim(value, self.word(op[len(sym):]), sym)
        return value

    def arithmetic(self, expr: str) -> str:
        expr = self.expand(expr, quoted=True)
        expr = _NAME.sub(lambda m: self.env.get(m.group(), "0") or "0", expr)
        try:
            return str(_eval_int(ast.parse(expr.strip(), mode="eval").body))
        except (SyntaxError, ValueError, ZeroDivisionError, TypeError):
            self.unresolved.append(f"$(({expr}))")
            return ""

    def substitution(self, cmd: str) -> str:
        words = cmd.split()
        head = words[0] if words else ""
        if head == "date":
            return "20260101"
        if head in ("pwd", "realpath", "dirname", "readlink", "cd"):
            if self.script and ("BASH_SOURCE" in cmd or "$0" in cmd):  # the script's folder, the usual anchor
                return os.path.dirname(os.path.abspath(self.script))
            return self.env["PWD"]
        if "nvidia-smi" in cmd or "nproc" in cmd or "device_count" in cmd:
            return "8"
        if head == "echo":
            return self.word(cmd[len("echo"):].strip())
        self.unresolved.append(f"$({cmd})")
        return ""

    # ---------------------------------------------------------------------------------------------- words and lines
    def word(self, s: str) -> str:
        """Expand one word and remove its quotes (the value of an assignment or a default)."""
        text = self.expand(s.strip())
        try:
            parts = shlex.split(text, comments=False)
        except ValueError:
            return text
        return " ".join(parts)

    def expand(self, s: str, quoted: bool = False) -> str:
        """Expand every $-construct outside single quotes; the result keeps the quoting for `shlex.split`
        (expanded text is escaped so that its quotes are literal, as in bash)."""
        out, i, in_dq = [], 0, quoted
        while i < len(s):
            c = s[i]
            if c == "'" and not in_dq:
                end = s.find("'", i + 1)
                end = len(s) - 1 if end < 0 else end
                out.append(s[i:end + 1])
                i = end + 1
            elif c == '"':
                in_dq = not in_dq
                out.append(c)
                i += 1
            elif c == "\\" and i + 1 < len(s):
                out.append(s[i:i + 2])
                i += 2
            elif c == "$":
                value, i = self.dollar(s, i)
                if isinstance(value, list):  # an array's words stay separate words, quoted or not
                    sep = '" "' if in_dq else " "
                    out.append(sep.join(_escape(w, in_dq) for w in value))
                else:
                    out.append(_escape(value, in_dq) if not quoted else value)
            elif c == "`":
                end = s.find("`", i + 1)
                end = len(s) if end < 0 else end
                out.append(_escape(self.substitution(s[i + 1:end]), in_dq))
                i = end + 1
            else:
                out.append(c)
                i += 1
        return "".join(out)


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _escape(value: str, in_dq: bool) -> str:
    if in_dq:
        return re.sub(r'(["\\$`])', r"\\\1", value)
    return re.sub(r"""(["'\\])""", r"\\\1", value)  # unquoted: word splitting stays, quotes become literal


def _balanced(s: str, i: int, open_: str, close: str) -> int:
    """Index after the bracket matching s[i] == open_."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == open_:
            depth += 1
        elif s[j] == close:
            depth -= 1
            if depth == 0:
                return j + 1
    return len(s)


def _trim(value: str, pattern: str, sym: str) -> str:
    spans = range(len(value) + 1)
    if sym.startswith("#"):
        cuts = [k for k in spans if fnmatch.fnmatchcase(value[:k], pattern)]
        return value[(max(cuts) if sym == "##" else min(cuts)):] if cuts else value
    cuts = [k for k in spans if fnmatch.fnmatchcase(value[k:], pattern)]
    return value[:(min(cuts) if sym == "%%" else max(cuts))] if cuts else value


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.LShift: operator.lshift,
        ast.RShift: operator.rshift}


def _eval_int(node) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval_int(node.left), _eval_int(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval_int(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    raise ValueError(ast.dump(node))


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, line) with backslash-newline continuations joined, as bash reads them."""
    out, buf, start = [], "", 1
    for n, line in enumerate(text.splitlines(), 1):
        if not buf:
            start = n
        if line.endswith("\\") and not line.endswith("\\\\"):
            buf += line[:-1] + " "
            continue
        out.append((start, buf + line))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def _strip_comment(line: str) -> str:
    """Drop a `#` comment that starts a word outside quotes (bash: it runs to the end of the joined line)."""
    quote, prev = None, " "
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and prev in " \t;":
            return line[:i]
        prev = c
    return line


def _test(cond: str, ex: Expander) -> bool | None:
    """Evaluate `[ "$a" = "b" ]`-style tests (=, ==, !=, -z, -n); None when not understood."""
    m = re.match(r"^\s*(?:if|elif)\s+\[\[?\s*(.*?)\s*\]\]?\s*;?\s*(?:then)?\s*$", cond)
    if not m:
        return None
    try:
        words = shlex.split(ex.expand(m.group(1)))
    except ValueError:
        return None
    if len(words) == 3 and words[1] in ("=", "==", "!="):
        return (words[0] == words[2]) != (words[1] == "!=")
    if len(words) == 2 and words[0] in ("-z", "-n"):
        return (words[1] == "") == (words[0] == "-z")
    if len(words) == 1 and words[0] in ("-z", "-n"):  # `[ -z "$unset" ]`: the empty word disappeared
        return words[0] == "-z"
    return None


def read_commands(path: str, modules: tuple[str, ...] = (), env: dict[str, str] | None = None) -> list[Command]:
    """Every `python[3] -m <module> ...` in the script (all modules when `modules` is empty)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    ex = Expander({**DEFAULT_ENV, **(env or {})}, script=path)
    commands: list[Command] = []
    active = [True]  # the if-branch stack: is the current branch followed
    taken = [True]   # has a branch of the current if been followed
    queue = list(reversed(_logical_lines(text)))  # popped from the end
    while queue:
        lineno, raw = queue.pop()
        line = _strip_comment(raw).strip()
        if not line:
            continue
        # an array assignment `NAME=(` or a quoted string left open: bash reads on (a newline inside quotes stays);
        # if it never closes (a stray quote in a here-document), the line is taken alone
        if re.match(r"^(?:export\s+|declare\s+(?:-\w+\s+)*)?[A-Za-z_]\w*\+?=\(", line) or _open_quote(line):
            joined, taken = line, []
            while (_open_parens(joined) > 0 or _open_quote(joined)) and queue and len(taken) < 200:
                taken.append(queue.pop())
                joined += "\n" + _strip_comment(taken[-1][1]).strip()
            if _open_parens(joined) > 0 or _open_quote(joined):
                queue.extend(reversed(taken))
            else:
                line = joined
        for part in _split_statements(line):
            part = part.strip()
            head = part.split()[0] if part.split() else ""
            if head == "if":
                result = _test(part, ex)
                follow = True if result is None else result
                active.append(active[-1] and follow)
                taken.append(follow)
                continue
            if head == "elif":
                result = _test(part, ex)
                follow = (not taken[-1]) and (True if result is None else result)
                active[-1] = active[-2] and follow
                taken[-1] = taken[-1] or follow
                continue
            if head == "else":
                active[-1] = active[-2] and not taken[-1]
                taken[-1] = True
                part = part[4:].strip()
                if not part:
                    continue
                head = part.split()[0]
            if head == "fi":
                if len(active) > 1:
                    active.pop()
                    taken.pop()
                continue
            if head in ("then", "do", "done", "esac") or not active[-1]:
                continue
            if head == "for":
                m = re.match(r"for\s+([A-Za-z_]\w*)\s+in\s+(.*?)\s*(?:;\s*do)?\s*$", part)
                if m:
                    first = shlex.split(ex.expand(m.group(2)))[:1]
                    ex.env[m.group(1)] = first[0] if first else ""
                continue
            m = _ASSIGN.match(part)
            if m and " -m " not in part:
                if active[-1]:
                    ex.assign(m.group(1), m.group(3), append=m.group(2) == "+")
                continue
            if re.search(r"\bpython3?\s+(?:-u\s+)?-m\s", part):
                before = len(ex.unresolved)
                cmd = _command(path, lineno, ex.expand(part), modules)
                if cmd is not None:
                    cmd.unresolved = list(dict.fromkeys(ex.unresolved[before:]))
                    commands.append(cmd)
    return commands


def _open_quote(text: str) -> bool:
    """A quote opened and not closed (single quotes take everything literally until the next one)."""
    quote, escaped = None, False
    for c in text:
        if escaped:
            escaped = False
        elif c == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
    return quote is not None


def _open_parens(text: str) -> int:
    """Parentheses opened and not closed, outside quotes."""
    depth, quote = 0, None
    for c in text:
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
    return depth


def _split_statements(line: str) -> list[str]:
    """Split at `;` outside quotes and brackets (`if [ ... ]; then`, `A=1; B=2`)."""
    parts, buf, quote, depth = [], [], None, 0
    for c in line:
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "({":
            depth += 1
        elif c in ")}":
            depth -= 1
        elif c == ";" and depth == 0:
            parts.append("".join(buf))
            buf = []
            continue
        buf.append(c)
    parts.append("".join(buf))
    return [p for p in parts if p.strip()]


def _command(path: str, lineno: int, expanded: str, modules: tuple[str, ...]) -> Command | None:
    try:
        words = shlex.split(expanded)
    except ValueError:
        return None
    for k, w in enumerate(words[:-1]):
        if re.fullmatch(r"(?:.*/)?python3?(?:\.\d+)?", w):
            rest = words[k + 1:]
            while rest and rest[0].startswith("-") and rest[0] != "-m":
                rest = rest[1:]
            if len(rest) >= 2 and rest[0] == "-m" and (not modules or rest[1] in modules):
                args = []
                for a in rest[2:]:
                    if a in _CONTROL or re.match(r"^\d*>", a) or a.startswith(("|", ">")):
                        break
                    if a:
                        args.append(a)
                return Command(path, lineno, rest[1], args)
    return None
