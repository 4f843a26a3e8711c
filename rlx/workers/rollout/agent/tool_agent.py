"""`tool_agent` (verl's): generate -> parse the turn's tool calls (hermes or gpt-oss) -> run them concurrently
(timeout, errors as text) -> append their replies as the chat template's tool turn -> generate again, until the model
calls no tool, a turn limit (`max_assistant_turns`, `max_user_turns`) is reached or the response budget
(`data.max_response_length`, the model's and the tools' tokens together) is spent. With an interaction
(`multi_turn.interaction_config_path`), a turn without a call goes to the row's interaction instead, whose reply is
the next user turn, until it ends the conversation (rlx.workers.rollout.agent.interactions; `num_repeat_rollouts`:
the first turn is trained and that many conversations from it are simulated for the reward).

The trajectory is one token sequence: the model's tokens exactly as generated (mask 1) and, between its turns, the
template's tokens for the tool (or user) turn (mask 0: no loss, no advantage, but in the context of every later
token). The turn's tokens are the difference it makes to the rendered conversation: the chat template applied to
[user, assistant] and to [user, assistant, *tool messages] with the generation prompt, plus whatever the template
puts after the assistant's end-of-turn token (Qwen: a newline) and that end token itself when the model was cut off
before writing it. With `multi_turn.format=gpt-oss` the turn is the harmony layout of the replies instead
(rlx.workers.rollout.agent.gpt_oss), as verl lays it out.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import time
import uuid
from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional

from rlx.workers.rollout.agent import gpt_oss, hermes
from rlx.workers.rollout.agent.loop import AgentLoop, AgentOutput, Request, Server, register
from rlx.workers.rollout.agent.tools import ToolResult, call_tool, schema_of, truncate

logger = logging.getLogger("rlx")
PARSERS = {"hermes": hermes.parse, "gpt-oss": gpt_oss.parse}
FUTURE_SEED_STRIDE = 1 << 20  # num_repeat_rollouts: future k of row r requests with row r + (k + 1) * this


@dataclass
class Trajectory:
    """A trajectory being built: the prompt, then every token after it (the model's: mask 1; the tools' and the
    interaction's: mask 0), the conversation as the chat template renders it (`messages`) and as an interaction reads
    it (`talk`: the model's turns as shown text), and its counters."""
    prompt: list[int]
    messages: list[dict]
    talk: list[dict]
    tools_kwargs: dict
    sample_index: int
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    has_log_probs: bool = False
    assistant_turns: int = 0
    user_turns: int = 0
    interaction_turns: int = 0
    turn_scores: list[float] = field(default_factory=list)
    metrics: dict = field(default_factory=lambda: {"assistant_tokens": 0, "tool_tokens": 0, "tool_calls": 0,
                                                   "tool_errors": 0, "tool_wait_s": 0.0})

    def append(self, ids: list[int], mask: int, log_probs: Optional[list[float]]) -> None:
        self.response += ids
        self.mask += [mask] * len(ids)
        self.log_probs += log_probs if log_probs is not None else [0.0] * len(ids)


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
        return [schema_of(tool) for tool in self.ctx.tools.values()]

    async def run(self, server: Server, *, prompt_ids: list[int], raw_chat: Optional[list[dict]],
                  extra_info: dict, sample_index: int) -> AgentOutput:
        ctx, mt = self.ctx, self.ctx.multi_turn
        if raw_chat is None or len(raw_chat) == 0:
            raise ValueError("the tool_agent loop renders the conversation itself and needs each row's chat "
                             "messages: set data.return_raw_chat=True (rows in verl's format)")
        prompt = self._ids([dict(m) for m in raw_chat], tools=self.schemas or None, add_generation_prompt=True)
        if len(prompt) > ctx.max_prompt_length:
            raise ValueError(f"a tool_agent prompt (the chat template with the tool schemas) has {len(prompt)} tokens "
                             f"> data.max_prompt_length={ctx.max_prompt_length}; raise data.max_prompt_length")
        t = Trajectory(prompt, [dict(m) for m in raw_chat], [dict(m) for m in raw_chat],
                       (extra_info or {}).get("tools_kwargs") or {}, sample_index)
        extra: dict = {}
        ids, text = await self._generate(server, t)
        if mt.num_repeat_rollouts and self.ctx.interactions:  # the trained turn is the first; futures score it
            futures = [copy.deepcopy(t) for _ in range(mt.num_repeat_rollouts)] if self._goes_on(t) else []
            for k, f in enumerate(futures):  # each with its own interaction instance and its own sampling seed
                f.sample_index += (k + 1) * FUTURE_SEED_STRIDE
            await asyncio.gather(*(self._converse(server, f, ids, text, extra_info) for f in futures))
            extra["messages"] = [f.talk for f in futures]
            extra["turn_scores"] = [f.turn_scores for f in futures]
            talked = futures
        else:
            talked = [t] if await self._converse(server, t, ids, text, extra_info) else []
            if talked:
                extra["turn_scores"] = t.turn_scores
        m = t.metrics
        m["tokenization_mismatch"] = float(self._mismatch(t.messages, t.prompt + t.response, t.mask))
        if talked:  # per conversation with the interaction (the mean over the futures)
            m["interaction_turns"] = sum(f.interaction_turns for f in talked) / len(talked)
            m["interaction_score"] = sum(f.turn_scores[-1] if f.turn_scores else 0.0 for f in talked) / len(talked)
        return AgentOutput(t.prompt, t.response, t.mask, t.log_probs if t.has_log_probs else None,
                           num_turns=t.assistant_turns + t.user_turns + 1, metrics=m, extra=extra)

    async def _converse(self, server: Server, t: "Trajectory", ids: list[int], text: str, extra_info: dict) -> bool:
        """Take turns after the model's turn `ids` / `text` until the trajectory ends; True when the row has an
        interaction (started here and finalized when the trajectory ends)."""
        session = await self._start_interaction(extra_info)
        try:
            while await self._respond(t, ids, text, session) and self._budget_left(t):
                ids, text = await self._generate(server, t)
        finally:
            if session is not None:
                await session[0].finalize_interaction(session[1])
        return session is not None

    async def _generate(self, server: Server, t: "Trajectory") -> tuple[list[int], str]:
        """One model turn appended to `t`: (its token ids, its text with special tokens)."""
        budget = self.turn_budget(self.ctx.max_response_length - len(t.response))
        out = await server.generate(Request(t.prompt + t.response, budget, t.sample_index))
        ids = list(out.token_ids[:budget])
        t.has_log_probs = out.log_probs is not None
        t.append(ids, 1, list(out.log_probs[:len(ids)]) if out.log_probs is not None else None)
        t.metrics["assistant_tokens"] += len(ids)
        t.assistant_turns += 1
        text = self.ctx.tokenizer.decode(ids, skip_special_tokens=False)
        t.messages.append({"role": "assistant", "content": self._strip_end(text)})
        t.talk.append({"role": "assistant", "content": self._shown(ids, text)})
        return ids, text

    def _goes_on(self, t: "Trajectory") -> bool:
        """Whether the trajectory may take another turn after the model's (response budget, turn limits)."""
        mt = self.ctx.multi_turn
        return not (len(t.response) >= self.ctx.max_response_length
                    or (mt.max_assistant_turns and t.assistant_turns >= mt.max_assistant_turns)
                    or (mt.max_user_turns and t.user_turns >= mt.max_user_turns))

    def _budget_left(self, t: "Trajectory") -> bool:
        return len(t.response) < self.ctx.max_response_length

    async def _respond(self, t: "Trajectory", ids: list[int], text: str, session) -> bool:
        """The turn after the model's: its tool calls' replies, else the interaction's reply; appended to `t` as
        context (mask 0). False when the trajectory ends here."""
        mt = self.ctx.multi_turn
        if not self._goes_on(t):
            return False
        _, calls = self.parse_calls(text)
        if calls:
            calls = calls[:mt.max_parallel_calls]
            results = await self._run_calls(calls, t.tools_kwargs, t.metrics)
            added = [{"role": "tool", "content": truncate(r.text, mt.max_tool_response_length,
                                                          mt.tool_response_truncate_side)} for r in results]
            segment, kind = self._tool_turn_ids(ids, added, [c.name for c in calls]), "tool_tokens"
        elif session is not None:
            interaction, instance, kwargs = session
            done, reply, score, _ = await interaction.generate_response(instance, t.talk, **kwargs)
            t.interaction_turns += 1
            if score is not None:
                t.turn_scores.append(float(score))
            added = [{"role": "user", "content": str(reply)}]
            t.talk.extend(added)
            if done:  # the closing reply is not added to the tokens: nothing follows it
                return False
            segment, kind = self._user_turn_ids(ids, str(reply)), "interaction_tokens"
        else:
            return False
        if len(t.response) + len(segment) >= self.ctx.max_response_length:  # no room for the model to answer (verl)
            return False
        t.append(segment, 0, None)
        t.metrics[kind] = t.metrics.get(kind, 0) + len(segment)
        t.messages.extend(added)
        if kind == "tool_tokens":
            t.talk.extend(added)
        t.user_turns += 1
        return True

    async def _start_interaction(self, extra_info: dict):
        """(interaction, instance id, the row's interaction_kwargs) of the row, started; None without interactions."""
        interactions = self.ctx.interactions
        if not interactions:
            return None
        kwargs = (extra_info or {}).get("interaction_kwargs")
        name = kwargs.get("name") if isinstance(kwargs, dict) else None
        if name not in interactions:
            raise ValueError(f"multi_turn.interaction_config_path is set, so every tool_agent row needs "
                             f"extra_info.interaction_kwargs.name naming one of {sorted(interactions)} (got "
                             f"{name!r}); verl's interaction rows carry it")
        assert isinstance(kwargs, dict)  # the name came from it
        instance = uuid.uuid4().hex
        await interactions[name].start_interaction(instance, **kwargs)
        return interactions[name], instance, kwargs

    def _shown(self, ids: list[int], text: str) -> str:
        """The model's turn as an interaction reads it: the text without special tokens (verl); gpt-oss: its final
        and preamble messages."""
        if self.ctx.multi_turn.format == "gpt-oss":
            return gpt_oss.parse(text)[0]
        return self.ctx.tokenizer.decode(ids, skip_special_tokens=True)

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

    def _user_turn_ids(self, generated: list[int], text: str) -> list[int]:
        if self.ctx.multi_turn.format == "gpt-oss":
            return self._harmony_ids(generated, gpt_oss.user_turn(text))
        return self._template_turn_ids(generated, [{"role": "user", "content": text}])

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
