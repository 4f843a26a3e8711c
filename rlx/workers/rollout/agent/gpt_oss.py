"""The gpt-oss tool-call format (`multi_turn.format=gpt-oss`): OpenAI's harmony response format.

A message is `<|start|>{header}<|message|>{content}<|end|>`; the header names the author (`assistant`,
`functions.NAME`, `user`, ...), a channel after `<|channel|>` (`analysis`: chain of thought, `commentary`: tool calls
and preambles, `final`: the answer), a recipient `to=...` (in the role part or in the channel part) and a content
type (`<|constrain|>json`, or a bare `json` after the channel). The model's turn continues the generation prompt
`<|start|>assistant`, so its first message has no `<|start|>` of its own; it may write several messages and stops on
`<|call|>` (a tool call) or `<|return|>` (done). A tool call is an assistant message addressed to `functions.NAME`
whose content is the JSON object of arguments:

    <|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant<|channel|>commentary to=functions.calc
    <|constrain|>json<|message|>{"answer": "72"}<|call|>

A tool's reply is a message written by the tool to the assistant on the commentary channel, and the model's next turn
starts with the generation prompt again:

    <|start|>functions.calc to=assistant<|channel|>commentary<|message|>correct<|end|><|start|>assistant

(the chat template is not used for these turns: rendering a tool message needs the call message it answers, which
the conversation keeps as generated text). `parse` never raises: a call whose arguments are not a JSON object, or
that was not finished with a stop token, comes back with an `error` the tool agent shows the model. Recipients outside
the `functions` namespace (the built-in `browser.*`, `python`) are not function tools and are not calls here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from rlx.workers.rollout.agent.hermes import ToolCall

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, RETURN, CALL = "<|constrain|>", "<|return|>", "<|call|>"
STOPS = (END, CALL, RETURN)
GENERATION_PROMPT = START + "assistant"
NAMESPACE = "functions."


@dataclass
class Message:
    role: str
    channel: Optional[str] = None
    recipient: Optional[str] = None
    content_type: Optional[str] = None
    content: str = ""
    stop: Optional[str] = None
    """The token that ended the message (None: the text ended first, or the header never reached <|message|>)."""


def messages(text: str) -> list[Message]:
    """The harmony messages of a model turn (which continues `<|start|>assistant`), in order. Text between a stop
    token and the next `<|start|>` belongs to no message and is dropped."""
    if not text.lstrip().startswith(START):
        text = GENERATION_PROMPT + text
    out = []
    for chunk in text.split(START)[1:]:
        header, sep, rest = chunk.partition(MESSAGE)
        if not sep:  # cut off inside the header
            out.append(_header(header))
            continue
        msg = _header(header)
        ends = [(rest.find(s), s) for s in STOPS if s in rest]
        if ends:
            at, stop = min(ends)
            msg.content, msg.stop = rest[:at], stop
        else:
            msg.content = rest
        out.append(msg)
    return out


def _header(header: str) -> Message:
    head, _, constrained = header.partition(CONSTRAIN)
    role_part, _, channel_part = head.partition(CHANNEL)
    role_words, channel_words = role_part.split(), channel_part.split()
    recipient = next((w[3:] for w in role_words + channel_words if w.startswith("to=")), None)
    plain = [w for w in channel_words if not w.startswith("to=")]
    ctype = constrained.strip() or (plain[1] if len(plain) > 1 else None)
    return Message(role=role_words[0] if role_words else "", channel=plain[0] if plain else None,
                   recipient=recipient, content_type=ctype)


def parse(text: str) -> tuple[str, list[ToolCall]]:
    """(what the turn shows its reader: the contents of its final and preamble messages, the function calls in
    order)."""
    shown, calls = [], []
    for m in messages(text):
        if m.role != "assistant":
            continue
        if m.recipient is None:
            if m.channel != "analysis" and m.content:
                shown.append(m.content)
        elif m.recipient.startswith(NAMESPACE):
            calls.append(_call(m))
    return "\n".join(shown), calls


def _call(m: Message) -> ToolCall:
    assert m.recipient is not None  # a message addressed to a tool
    name = m.recipient[len(NAMESPACE):]
    if not name:
        return ToolCall(name="", error="the tool call is addressed to 'functions.' without a function name")
    if m.stop is None:
        return ToolCall(name=name, error=f"the call to {NAMESPACE}{name} was not finished with {CALL}")
    body = m.content.strip()
    try:
        args = json.loads(body) if body else {}
    except json.JSONDecodeError as e:
        return ToolCall(name=name, error=f"the arguments of {name!r} are not valid JSON ({e.msg} at char {e.pos})")
    if not isinstance(args, dict):
        return ToolCall(name=name, error=f"the arguments of {name!r} must be a JSON object, got {type(args).__name__}")
    return ToolCall(name=name, arguments=args)


def closing(turn_text: str) -> str:
    """What ends the model's turn before the next message: nothing when it stopped on a stop token, else `<|end|>`
    (a turn cut off mid-message)."""
    return "" if turn_text.endswith(STOPS) else END


def tool_turn(replies: list[tuple[str, str]]) -> str:
    """The text of the tools' replies `[(function name, reply text)]` and the next generation prompt."""
    return "".join(f"{START}{NAMESPACE}{name} to=assistant{CHANNEL}commentary{MESSAGE}{text}{END}"
                   for name, text in replies) + GENERATION_PROMPT


def user_turn(text: str) -> str:
    """A user message (an interaction's reply) and the next generation prompt."""
    return f"{START}user{MESSAGE}{text}{END}{GENERATION_PROMPT}"
