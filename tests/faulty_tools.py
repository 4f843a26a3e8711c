"""Function tools that misbehave, for tests/e2e/test_faults_tools_fatal.py (its `function_tool_path`)."""
from __future__ import annotations

import os
import sys
import time

from rlx.workers.rollout.agent.tools import function_tool


@function_tool
def pid_tool() -> str:
    """The process that runs the call (a fast tool)."""
    return str(os.getpid())


@function_tool
def chatty(lines: int) -> str:
    """Print some lines, then answer.

    Args:
        lines: how many
    """
    for i in range(lines):
        print(f"line {i}")
    return "said it"


@function_tool
def hang(seconds: float) -> str:
    """Sleep, writing its pid to the file `PID_FILE` first (a synchronous tool that hangs).

    Args:
        seconds: how long
    """
    with open(os.environ["RLX_TEST_PID_FILE"], "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(seconds)
    return "woke"


@function_tool
def print_forever() -> str:
    """Print until killed."""
    while True:
        sys.stdout.write("x" * 1000 + "\n")


@function_tool
def exit_process() -> str:
    """End the process that runs the call."""
    os._exit(1)
