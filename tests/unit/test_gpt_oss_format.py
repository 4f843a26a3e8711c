"""`multi_turn.format=gpt-oss`: the harmony response format (OpenAI's published spec) read from the model's turns and
written for the tools' replies, checked on the spec's own shapes, cross-checked with the harmony renderer where it is
installed, and run through the real tool_agent loop with a tokenizer that has harmony's special tokens."""
import asyncio

import pytest

from rlx.config.schema import RolloutConfig
from rlx.workers.rollout.agent import gpt_oss
from rlx.workers.rollout.agent.loop import LoopContext, Request, TokenOutput
from rlx.workers.rollout.agent.tool_agent import ToolAgentLoop
from rlx.workers.rollout.agent.tools import FunctionTool, function_schema

import agent_helpers

SPECIALS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]


# ---- reading the model's turn -------------------------------------------------------------------------------------
def test_a_call_after_chain_of_thought_recipient_in_the_channel_part():
    turn = ('<|channel|>analysis<|message|>Need to use function get_weather.<|end|><|start|>assistant<|channel|>'
            'commentary to=functions.get_weather <|constrain|>json<|message|>{"location":"San Francisco"}<|call|>')
    content, calls = gpt_oss.parse(turn)
    assert [(c.name, c.arguments, c.error) for c in calls] == [("get_weather", {"location": "San Francisco"}, None)]
    assert content == ""  # chain of thought is not shown
    first, second = gpt_oss.messages(turn)
    assert (first.role, first.channel, first.recipient, first.stop) == ("assistant", "analysis", None, "<|end|>")
    assert (second.channel, second.recipient, second.content_type, second.stop) == (
        "commentary", "functions.get_weather", "json", "<|call|>")


def test_a_call_with_the_recipient_in_the_role_part_and_a_bare_content_type():
    turn = '<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{"q": [1, 2]}<|call|>'
    _, calls = gpt_oss.parse(turn)
    assert [(c.name, c.arguments) for c in calls] == [("lookup", {"q": [1, 2]})]
    assert gpt_oss.messages(turn)[0].content_type == "json"


def test_a_preamble_is_shown_and_the_call_after_it_runs():
    turn = ('<|channel|>analysis<|message|>long thought<|end|><|start|>assistant<|channel|>commentary<|message|>'
            'Will write the file<|end|><|start|>assistant<|channel|>commentary to=functions.generate_file'
            '<|constrain|>json<|message|>{"path": "index.html"}<|call|>')
    content, calls = gpt_oss.parse(turn)
    assert content == "Will write the file"
    assert [(c.name, c.arguments) for c in calls] == [("generate_file", {"path": "index.html"})]


def test_a_final_answer_is_no_call_and_a_thought_that_mentions_a_recipient_is_no_call():
    turn = ('<|channel|>analysis<|message|>I could write to=functions.calc <|constrain|>json but no.<|end|>'
            '<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>')
    content, calls = gpt_oss.parse(turn)
    assert calls == [] and content == "2 + 2 = 4."


def test_built_in_tool_recipients_are_not_function_calls():
    turn = '<|channel|>analysis to=browser.search <|constrain|>json<|message|>{"query": "x"}<|call|>'
    assert gpt_oss.parse(turn)[1] == []


@pytest.mark.parametrize("body,why", [
    ('{"location": ', "not valid JSON"),
    ('["Tokyo"]', "must be a JSON object"),
])
def test_malformed_arguments_become_errors(body, why):
    turn = f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{body}<|call|>"
    (call,) = gpt_oss.parse(turn)[1]
    assert call.name == "get_weather" and why in call.error


def test_an_unfinished_call_and_a_nameless_recipient_become_errors():
    (call,) = gpt_oss.parse('<|channel|>commentary to=functions.calc <|constrain|>json<|message|>{"a": 1')[1]
    assert call.name == "calc" and "not finished with <|call|>" in call.error
    (call,) = gpt_oss.parse('<|channel|>commentary to=functions. <|constrain|>json<|message|>{}<|call|>')[1]
    assert "without a function name" in call.error
    assert gpt_oss.parse("<|channel|>commentary to=functions.calc <|const")[1][0].error  # cut in the header


# ---- writing the replies --------------------------------------------------------------------------------------
def test_tool_replies_and_user_turns_are_harmony_messages_then_the_generation_prompt():
    assert gpt_oss.tool_turn([("get_weather", '{"sunny": true}'), ("calc", "4")]) == (
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"sunny": true}<|end|>'
        '<|start|>functions.calc to=assistant<|channel|>commentary<|message|>4<|end|><|start|>assistant')
    assert gpt_oss.user_turn("try again") == "<|start|>user<|message|>try again<|end|><|start|>assistant"
    assert gpt_oss.closing("...<|call|>") == "" and gpt_oss.closing("...{\"a\"") == "<|end|>"
    # what we write is read back as what it is
    (reply, prompt) = gpt_oss.messages(gpt_oss.tool_turn([("calc", "4")]))
    assert (reply.role, reply.recipient, reply.channel, reply.content, reply.stop) == (
        "functions.calc", "assistant", "commentary", "4", "<|end|>")
    assert prompt.role == "assistant" and prompt.stop is None


def test_agrees_with_the_harmony_renderer():
    """openai_harmony (vLLM installs it) renders a conversation with a call and a reply; our parser reads the call it
    renders, and its parser reads the reply we write."""
    harmony = pytest.importorskip("openai_harmony")
    enc = harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    R = harmony.Role
    call = (harmony.Message.from_role_and_content(R.ASSISTANT, '{"location": "Tokyo"}').with_channel("commentary")
            .with_recipient("functions.get_weather").with_content_type("<|constrain|>json"))
    convo = harmony.Conversation.from_messages([
        harmony.Message.from_role_and_content(R.USER, "Weather in Tokyo?"),
        harmony.Message.from_role_and_content(R.ASSISTANT, "Need the tool.").with_channel("analysis"), call])
    text = enc.decode_utf8(enc.render_conversation(convo))
    turn = text[text.index("<|start|>assistant") + len("<|start|>assistant"):]
    assert [(c.name, c.arguments) for c in gpt_oss.parse(turn)[1]] == [("get_weather", {"location": "Tokyo"})]
    ours = gpt_oss.tool_turn([("get_weather", '{"t": 20}')])[:-len(gpt_oss.GENERATION_PROMPT)]
    (msg,) = enc.parse_messages_from_completion_tokens(enc.encode(ours, allowed_special="all"), None)
    d = msg.to_dict()
    assert (d["name"], d["channel"], d["recipient"], d["content"][0]["text"]) == (
        "functions.get_weather", "commentary", "assistant", '{"t": 20}')


# ---- through the tool agent -----------------------------------------------------------------------------------
class ScriptedModel:
    """The engine server's side of the loop: answers each request with the next scripted turn (the tiny random model
    writes no harmony), and keeps the contexts it was sent."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.seen = tok, list(turns), []

    async def generate(self, request: Request) -> TokenOutput:
        self.seen.append(list(request.prompt_ids))
        ids = self.tok.encode(self.turns.pop(0), add_special_tokens=False)[:request.max_tokens]
        return TokenOutput(ids, [-0.5] * len(ids))


@pytest.fixture(scope="module")
def harmony_tok():
    from transformers import AutoTokenizer

    from rlx.models import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin://tiny-qwen2"))
    tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    tok.chat_template = agent_helpers.TEMPLATE
    return tok


def gpt_oss_loop(tok, **multi_turn):
    cfg = RolloutConfig(mode="async")
    cfg.multi_turn.enable, cfg.multi_turn.format = True, "gpt-oss"
    for k, v in multi_turn.items():
        setattr(cfg.multi_turn, k, v)
    tools = {"probe": FunctionTool(agent_helpers.async_probe, function_schema(agent_helpers.probe))}
    return ToolAgentLoop(LoopContext(tok, 256, 1024, cfg.multi_turn, tools))


def test_a_harmony_trajectory_through_the_tool_agent(harmony_tok):
    tok = harmony_tok
    call = ('<|channel|>analysis<|message|>ask probe<|end|><|start|>assistant<|channel|>commentary to=functions.probe'
            ' <|constrain|>json<|message|>{"n": 7}<|call|>')
    bad = '<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}<|call|>'
    final = "<|channel|>final<|message|>#### 7<|return|>"
    model = ScriptedModel(tok, [call, bad, final])
    loop = gpt_oss_loop(tok)
    out = asyncio.run(loop.run(model, prompt_ids=[], raw_chat=[{"role": "user", "content": "7?"}], extra_info={},
                               sample_index=0))
    assert out.num_turns == 6 and out.metrics["tool_calls"] == 2 and out.metrics["tool_errors"] == 1
    text = tok.decode(out.response_ids, skip_special_tokens=False)
    reply = "<|start|>functions.probe to=assistant<|channel|>commentary<|message|>probe saw 7<|end|><|start|>assistant"
    error = ("<|start|>functions.nope to=assistant<|channel|>commentary<|message|>Error: unknown tool 'nope'; "
             "available: ['probe']<|end|><|start|>assistant")
    assert text == call + reply + bad + error + final
    # the model's tokens are trained, the replies are context only; every request holds all that came before
    segments = [(call, 1), (reply, 0), (bad, 1), (error, 0), (final, 1)]
    expected = [m for seg, m in segments for _ in tok.encode(seg, add_special_tokens=False)]
    assert out.response_mask == expected
    assert len(model.seen) == 3 and len(model.seen[0]) == len(out.prompt_ids)
    assert all(s == (out.prompt_ids + out.response_ids)[:len(s)] for s in model.seen)
    assert "<|call|>" in tok.all_special_tokens and tok.encode("<|call|>", add_special_tokens=False) == [
        tok.convert_tokens_to_ids("<|call|>")]


def test_a_call_cut_off_by_the_turn_budget_is_closed_before_the_error_reply(harmony_tok):
    tok = harmony_tok
    call = '<|channel|>commentary to=functions.probe <|constrain|>json<|message|>{"n": 12345}<|call|>'

    class Capped(ToolAgentLoop):
        def turn_budget(self, remaining):
            return min(remaining, len(tok.encode(call, add_special_tokens=False)) - 3)

    model = ScriptedModel(tok, [call, "<|channel|>final<|message|>ok<|return|>"])
    loop = Capped(gpt_oss_loop(tok).ctx)
    out = asyncio.run(loop.run(model, prompt_ids=[], raw_chat=[{"role": "user", "content": "x"}], extra_info={},
                               sample_index=0))
    text = tok.decode(out.response_ids, skip_special_tokens=False)
    assert "<|end|><|start|>functions.probe to=assistant<|channel|>commentary<|message|>Error: the call to " \
           "functions.probe was not finished with <|call|><|end|><|start|>assistant<|channel|>final" in text


def test_the_config_accepts_gpt_oss_and_still_refuses_other_formats():
    from conftest import load_config

    assert load_config(["actor_rollout_ref.rollout.multi_turn.format=gpt-oss"]) \
        .actor_rollout_ref.rollout.multi_turn.format == "gpt-oss"
    with pytest.raises(ValueError, match="multi_turn.format='harmony'"):
        load_config(["actor_rollout_ref.rollout.multi_turn.format=harmony"])
