"""`tool_agent` (verl's): generate -> parse the turn's tool calls (hermes or gpt-oss) -> run them concurrently (timeout, errors
as text) -> append their replies as the chat template's tool turn -> generate again, until the model calls no tool,
a turn limit (`max_assistant_turns`, `max_user_turns`) is reached or the response budget
(`data.max_response_length`, the model's and the tools' tokens together) is spent.

The trajectory is one token sequence: the model's tokens exactly as generated (mask 1) and, between its turns, the
template's tokens for the tool turn (mask 0: no loss, no advantage, but in the context of every later token).
The tool turn's tokens are the difference the turn makes to the rendered conversation: the chat template applied to
[user, assistant] and to [user, assistant, *tool messages] with the generation prompt, plus whatever the template
puts after the assistant's end-of-turn token (Qwen: a newline) and that end token itself when the model was cut off
before writing it. With `multi_turn.format=gpt-oss` the tool turn is the harmony layout of the replies instead
(rlx.workers.rollout.agent.gpt_oss), as verl lays it out.
"""
from __future__ import annotations

import asyncio
import logging
import time
from functools import cached_property
from typing import Optional

from rlx.workers.rollout.agent import gpt_oss, hermes
from rlx.workers.rollout.agent.loop import AgentLoop, AgentOutput, Request, Server, register
from rlx.workers.rollout.agent.tools import ToolResult, call_tool, truncate

logger = logging.getLogger("rlx")
PARSERS = {"hermes": hermes.parse, "gpt-oss": gpt_oss.parse}


@register("tool_agent")
class ToolAgentLoop(AgentLoop):
    def parse_calls(self, text: str) -> tuple[str, list[hermes.ToolCall]]:
        """(the turn's text without its calls, the calls); multi_turn.format picks the parser."""
        return PARSERS[self.ctx.multi_turn.format](text)

    def turn_budget(self, remaining: int) -> int:
        """Tokens the next generation may take: all that is left of the response budget (verl); a subclass may
        cap a turn."""
        return remaining

    @property
    def schemas(self) -> list[dict]:
        return [tool.tool_schema for tool in self.ctx.tools.values()]

    async def run(self, server: Server, *, prompt_ids: list[int], raw_chat: Optional[list[dict]],
                  extra_info: dict, sample_index: int) -> AgentOutput:
        ctx, mt, tok = self.ctx, self.ctx.multi_turn, self.ctx.tokenizer
        if raw_chat is None or len(raw_chat) == 0:
            raise ValueError("the tool_agent loop renders the conversation itself and needs each row's chat "
                             "messages: set data.return_raw_chat=True (rows in verl's format)")
        messages = [dict(m) for m in raw_chat]
        prompt = self._ids(messages, tools=self.schemas or None, add_generation_prompt=True)
        if len(prompt) > ctx.max_prompt_length:
            raise ValueError(f"a tool_agent prompt (the chat template with the tool schemas) has {len(prompt)} tokens "
                             f"> data.max_prompt_length={ctx.max_prompt_length}; raise data.max_prompt_length")
        tools_kwargs = (extra_info or {}).get("tools_kwargs") or {}
        R = ctx.max_response_length
        response: list[int] = []
        mask: list[int] = []
        lps: list[float] = []
        m = {"assistant_tokens": 0, "tool_tokens": 0, "tool_calls": 0, "tool_errors": 0, "tool_wait_s": 0.0}
        assistant_turns = user_turns = 0
        while len(response) < R:
            budget = self.turn_budget(R - len(response))
            out = await server.generate(Request(prompt + response, budget, sample_index))
            ids = list(out.token_ids[:budget])
            response += ids
            mask += [1] * len(ids)
            lps += list(out.log_probs[:len(ids)]) if out.log_probs is not None else [0.0] * len(ids)
            m["assistant_tokens"] += len(ids)
            assistant_turns += 1
            text = tok.decode(ids, skip_special_tokens=False)
            messages.append({"role": "assistant", "content": self._strip_end(text)})
            if len(response) >= R or (mt.max_assistant_turns and assistant_turns >= mt.max_assistant_turns) \
                    or (mt.max_user_turns and user_turns >= mt.max_user_turns):
                break
            _, calls = self.parse_calls(text)
            if not calls:
                break
            results = await self._run_calls(calls[:mt.max_parallel_calls], tools_kwargs, m)
            replies = [{"role": "tool", "content": truncate(r.text, mt.max_tool_response_length,
                                                            mt.tool_response_truncate_side)} for r in results]
            segment = self._tool_turn_ids(ids, replies, [c.name for c in calls[:mt.max_parallel_calls]])
            if len(response) + len(segment) >= R:  # no room left for the model to answer: stop here (verl)
                break
            response += segment
            mask += [0] * len(segment)
            lps += [0.0] * len(segment)
            m["tool_tokens"] += len(segment)
            messages.extend(replies)
            user_turns += 1
        m["tokenization_mismatch"] = float(self._mismatch(messages, prompt + response, mask))
        return AgentOutput(prompt, response, mask, lps if out.log_probs is not None else None,
                           num_turns=assistant_turns + user_turns + 1, metrics=m)

    async def _run_calls(self, calls: list[hermes.ToolCall], tools_kwargs: dict, m: dict) -> list[ToolResult]:
        mt = self.ctx.multi_turn

        async def one(call: hermes.ToolCall) -> ToolResult:
            if call.error:
                return ToolResult(f"Error: {call.error}", error=True)
            tool = self.ctx.tools.get(call.name)
            if tool is None:
                return ToolResult(f"Error: unknown tool {call.name!r}; available: {sorted(self.ctx.tools)}",
                                  error=True)
            return await call_tool(tool, call.arguments, tools_kwargs, mt.tool_timeout_s)

        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(c) for c in calls))
        m["tool_wait_s"] += time.perf_counter() - t0
        m["tool_calls"] += len(calls)
        m["tool_errors"] += sum(r.error for r in results)
        return list(results)

    def _ids(self, messages: list[dict], **kwargs) -> list[int]:
        """The chat template's text for `messages`, tokenized as the dataset tokenizes a prompt."""
        tok = self.ctx.tokenizer
        text = tok.apply_chat_template(messages, tokenize=False, **kwargs)
        return list(tok(text, add_special_tokens=False)["input_ids"])

    # ---- tokens of a tool turn -------------------------------------------------------------------------
    @cached_property
    def _end_ids(self) -> set[int]:
        eos = self.ctx.tokenizer.eos_token_id
        return set(eos) if isinstance(eos, (list, tuple)) else ({eos} if eos is not None else set())

    def _strip_end(self, text: str) -> str:
        eos = self.ctx.tokenizer.eos_token
        return text[:-len(eos)] if eos and text.endswith(eos) else text

    @cached_property
    def _turn_frame(self) -> tuple[list[int], list[int], Optional[int]]:
        """(ids of a rendered [user, assistant] exchange, what follows the assistant's end token there, that end
        token)."""
        tok = self.ctx.tokenizer
        base = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
        ids = self._ids(base)
        ends = [i for i, t in enumerate(ids) if t in self._end_ids]
        if not ends:
            return ids, [], None
        return ids, ids[ends[-1] + 1:], ids[ends[-1]]

    def _tool_turn_ids(self, generated: list[int], replies: list[dict], names: list[str]) -> list[int]:
        if self.ctx.multi_turn.format == "gpt-oss":
            return self._harmony_ids(generated, gpt_oss.tool_turn([(n, r["content"]) for n, r in zip(names, replies)]))
        return self._template_turn_ids(generated, replies)

    def _harmony_ids(self, generated: list[int], text: str) -> list[int]:
        """The tokens of a harmony turn `text`, after closing the model's message if it was cut off."""
        tok = self.ctx.tokenizer
        turn = tok.decode(generated, skip_special_tokens=False)
        return list(tok(gpt_oss.closing(turn) + text, add_special_tokens=False)["input_ids"])

    def _template_turn_ids(self, generated: list[int], replies: list[dict]) -> list[int]:
        """The tokens the chat template adds for `replies` (tool or user messages) after the model's turn."""
        prefix, after_end, end = self._turn_frame
        base = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
        full = self._ids(base + replies, add_generation_prompt=True)
        if full[:len(prefix)] != prefix:
            raise ValueError("the chat template renders an exchange differently once tool messages follow it; "
                             "the tool turn's tokens cannot be isolated (set actor_rollout_ref.model."
                             "custom_chat_template to a template with a tool role)")
        lead = [] if end is None or (generated and generated[-1] in self._end_ids) else [end]
        return lead + list(after_end) + full[len(prefix):]

    def _mismatch(self, messages: list[dict], ids: list[int], mask: list[int]) -> bool:
        """tokenization_sanity_check_mode: does the whole conversation, rendered at once, give the same tokens?"""
        mode = self.ctx.multi_turn.tokenization_sanity_check_mode
        if mode == "disable" or self.ctx.multi_turn.format == "gpt-oss":  # its turns are not the template's
            return False
        tok = self.ctx.tokenizer
        if messages[-1]["role"] == "tool":  # stopped after tools: the trajectory ends before their turn
            return False
        whole = self._ids(messages, tools=self.schemas or None)
        got = ids
        if mode == "ignore_strippable":
            same = "".join(tok.decode(whole).split()).startswith("".join(tok.decode(got).split()))
        else:  # what the rendering adds after the last turn: its end token (when cut off) and the separator
            same = whole[:len(got)] == got and set(whole[len(got):]) <= self._end_ids | set(self._turn_frame[1])
        if not same:
            logger.debug("tool_agent: the turn-by-turn tokens differ from the whole conversation rendered at once")
        return not same
