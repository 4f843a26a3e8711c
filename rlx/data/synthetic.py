"""Synthetic prompt sources for smoke / default jobs: generated in memory, no files, no downloads.

A data "file" may be ``synthetic://<task>?size=N&seed=S[&split=train][&k=K]``; :func:`generate_rows` turns it
into rows in verl's row format (``data_source``, ``prompt`` as chat messages, ``ability``, ``reward_model``
with ``ground_truth``, ``extra_info``), deterministic in ``seed``. Use different seeds for train and val.

Why these tasks
---------------
The default job trains a *randomly initialised* tiny Qwen2 (byte-level vocab of 259) with GRPO for a few
minutes on CPU, and must show the validation reward at least doubling. So the reward has to be

* dense: every response character contributes, so most groups of n=4 samples have *different* rewards and
  GRPO's group-normalised advantage is non-zero from step one (a 0/1 exact-match reward would be ~always 0
  for a random policy and GRPO would learn nothing);
* low but not zero for a random policy: a near-uniform policy over 259 byte tokens emits a digit with
  probability ~10/259 ~ 4%, so it scores ~0.02 (not 0, so "doubling" is meaningful);
* learnable in a few dozen steps: the first, biggest gain ("emit digits") is a single direction in the
  output layer, independent of the prompt; the second ("emit *this* digit") needs one attention head to copy
  the digit at a fixed offset from the end of the prompt. A policy that has learned both scores 1.0.

``synthetic/digits`` (the default). Prompt: 3-5 random digits then ``" ->"``, e.g. ``"7 2 9 ->"``; target =
the last digit of the prompt (``"9"``). Reward = mean over the first ``k`` (default 8) response characters
of ``0.5 * is_digit + 0.5 * is_target``; missing characters (a response ended early by EOS) count 0, so
stopping early is not a shortcut. Random policy ~0.02; "all digits" 0.5 + 0.05; solved 1.0.

``synthetic/arith`` (for a pretrained instruct model, e.g. builtin://smollm2-135m-instruct). Prompt: a chat message
asking for one sum of two numbers of 2-3 digits or one product of a 2-digit and a 1-digit number, e.g. ``"What is
347 + 58?"``, with the instruction to end with ``#### <answer>`` (ARITH_INSTRUCTION). Reward: the GSM8K rule
(rlx.reward.rules.gsm8k, strict): 1 for the right number after ``#### ``, else 0. One problem in ten (by a hash of
its question) is held out: ``split:test`` asks only those and ``split:train`` never does, whatever the seeds, so a
held-out product (of only ~720) is never a training one.

``synthetic/copy`` (harder, for longer runs). Prompt: 3-5 random digits then ``" ->"``; target = the digits
without spaces (``"729"``). Reward = mean over the target's positions of ``1.0`` for the right digit,
``0.25`` for a wrong digit, 0 otherwise. Random policy ~0.01.

The three rewards are scored by rlx.reward.rules.synthetic.
"""
from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import numpy as np

SYNTHETIC_PREFIX = "synthetic://"
DIGITS_SOURCE = "synthetic/digits"
COPY_SOURCE = "synthetic/copy"
ARITH_SOURCE = "synthetic/arith"
ARITH_INSTRUCTION = "Think step by step, then give the final answer as a number after \"####\"."
"""The instruction after each arithmetic question (GSM8K's verl instruction, shortened for a small model)."""
_DIGITS = "0123456789"


def _prompt_digits(rng: np.random.Generator) -> list[str]:
    n = int(rng.integers(3, 6))
    return [_DIGITS[int(d)] for d in rng.integers(0, 10, size=n)]


def _row(source: str, content: str, ground_truth: str, split: str, index: int, k: int) -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": content}],
        "ability": "synthetic",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "k": k},
    }


def _gen_digits(rng, i, split, k):
    digits = _prompt_digits(rng)
    return _row(DIGITS_SOURCE, " ".join(digits) + " ->", digits[-1], split, i, k)


def _gen_copy(rng, i, split, k):
    digits = _prompt_digits(rng)
    return _row(COPY_SOURCE, " ".join(digits) + " ->", "".join(digits), split, i, k)


def _arith_is_test(question: str) -> bool:
    """One problem in ten is held out: the test split asks only those, the train split never (whatever the seeds)."""
    import hashlib

    return hashlib.sha256(question.encode()).digest()[0] % 10 == 0


def _gen_arith(rng, i, split, k):
    while True:
        if rng.random() < 0.5:
            a, b = int(rng.integers(10, 1000)), int(rng.integers(10, 1000))
            question, answer = f"What is {a} + {b}?", a + b
        else:
            a, b = int(rng.integers(10, 100)), int(rng.integers(2, 10))
            question, answer = f"What is {a} * {b}?", a * b
        if _arith_is_test(question) == (split == "test"):
            return _row(ARITH_SOURCE, f"{question} {ARITH_INSTRUCTION}", str(answer), split, i, k)


TASKS = {"digits": _gen_digits, "copy": _gen_copy, "arith": _gen_arith}
_STREAM = {"copy": 0, "digits": 1, "arith": 2}  # each task's random stream (fixed: new tasks never move old rows)
DEFAULT_K = 8
"""How many response characters the digits task scores when its file does not say (k:<n>)."""
_PARAMS = {"size": 1024, "seed": 0, "split": "train", "k": DEFAULT_K}


def is_synthetic(path) -> bool:
    return isinstance(path, str) and path.startswith(SYNTHETIC_PREFIX)


def parse_synthetic(path: str) -> tuple[str, dict]:
    """``synthetic://digits/size:64/seed:1`` (or ``?size=64&seed=1``) -> ("digits", {"size": 64, "seed": 1, "split": "train", "k": 8})."""
    parsed = urlparse(path)
    # Hydra-friendly form (no '=' on the command line): synthetic://digits/size:64/seed:1
    task, *segments = (parsed.netloc + parsed.path).strip("/").split("/")
    query = "&".join(seg.replace(":", "=", 1) for seg in segments if seg)
    query = "&".join(q for q in (query, parsed.query) if q)
    if task not in TASKS:
        raise ValueError(f"data file {path!r}: unknown synthetic task {task!r}; known: "
                         f"{[SYNTHETIC_PREFIX + t for t in TASKS]}. Fix: name one of them, e.g. "
                         f"'synthetic://digits/size:1024/seed:0'.")
    params: dict = dict(_PARAMS)
    for key, values in parse_qs(query, keep_blank_values=True).items():
        if key not in _PARAMS:
            raise ValueError(f"data file {path!r}: unknown parameter {key!r}. Fix: use only {sorted(_PARAMS)}.")
        value = values[-1]
        if key == "split":
            params[key] = value
            continue
        try:
            params[key] = int(value)
        except ValueError:
            raise ValueError(f"data file {path!r}: parameter {key}={value!r} must be an integer. Fix: {key}:<an "
                             f"integer>.") from None
    if params["size"] <= 0 or params["k"] <= 0:
        raise ValueError(f"data file {path!r}: size and k must be positive. Fix: e.g. size:1024 (k: 8, the default).")
    return task, params


def generate_rows(path: str) -> list[dict]:
    """Rows (verl format) of a ``synthetic://`` source; the same path always yields the same rows."""
    task, p = parse_synthetic(path)
    rng = np.random.default_rng([p["seed"], _STREAM[task]])
    return [TASKS[task](rng, i, p["split"], p["k"]) for i in range(p["size"])]
