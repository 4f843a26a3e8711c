"""The agent-loop rollout (rollout.mode=async) on CPU with the HF engine: async single turn = sync, the hermes
parser on malformed calls, tools that fail or hang, the tool turn's tokens and masks, no gradient through tool
tokens, the GSM8K tool, and a multi-turn GRPO run through the entry point."""
import asyncio
import textwrap

import pytest
import torch

from rlx.config.schema import RolloutConfig
from rlx.protocol import Batch
from rlx.workers.rollout.agent import hermes
from rlx.workers.rollout.agent.runner import AgentRollout
from rlx.workers.rollout.agent.tools import FunctionTool, call_tool, function_schema, load_tools, truncate

import agent_helpers

P, R = 64, 96
TEXTS = ["7 2 9 ->", "1 4 ->", "3 3 8 0 ->"]


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoTokenizer

    from rlx.models import resolve_model_path
    from rlx.workers.rollout.hf_rollout import HFRollout

    path = resolve_model_path("builtin://tiny-qwen2")
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = agent_helpers.TEMPLATE
    rollout = HFRollout(path, max_response_length=R, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                        device=torch.device("cpu"), calculate_log_probs=True)
    return rollout, tok


def prompts(tok, texts=TEXTS, **meta):
    rows = [tok.encode(t, add_special_tokens=False) for t in texts]
    ids = torch.full((len(rows), P), tok.pad_token_id)
    mask = torch.zeros((len(rows), P), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r):] = torch.tensor(r)
        mask[i, P - len(r):] = 1
    chats = [[{"role": "user", "content": t}] for t in texts]
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
                 {"raw_chat": chats, "extra_info": [{} for _ in texts]}, meta=meta)


@torch.no_grad()
def actor_log_probs(model, out: Batch, temperature: float = 1.0) -> torch.Tensor:
    logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                   position_ids=out["position_ids"]).logits.float()
    logits = logits[:, P - 1:-1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)


# ---- async single turn = sync ----------------------------------------------------------------------------
@pytest.mark.parametrize("meta", [dict(n=2, do_sample=False, temperature=0.0),
                                  dict(n=2, do_sample=True, temperature=1.0, seed=5)], ids=["greedy", "sampled"])
def test_async_single_turn_equals_sync(hf, meta):
    rollout, tok = hf
    sync = rollout.generate_sequences(prompts(tok, **meta))
    agent = AgentRollout(rollout, "hf", tok, RolloutConfig(mode="async", calculate_log_probs=True), P, R,
                         tok.pad_token_id)
    out = agent.generate_sequences(prompts(tok, **meta))
    for key in sync.tensors:
        assert torch.equal(sync[key], out[key]), key
    assert out.meta["agent_metrics"]["agent/num_turns/mean"] == 2.0
    # the sampled tokens' log-probs are the actor's
    mask = out["response_mask"].bool()
    actor = actor_log_probs(rollout.model, out)
    assert torch.allclose(out["rollout_log_probs"][mask], actor[mask], atol=1e-4)


def test_requests_are_concurrent(hf):
    """All trajectories' first requests reach the server before it generates: one batch, not one per row."""
    rollout, tok = hf
    agent = AgentRollout(rollout, "hf", tok, RolloutConfig(mode="async"), P, R, tok.pad_token_id)
    batches = []
    original = rollout.generate_ids

    def spy(prompts_, *a, **k):
        batches.append(len(prompts_))
        return original(prompts_, *a, **k)

    rollout.generate_ids = spy
    try:
        agent.generate_sequences(prompts(tok, n=2, do_sample=True, temperature=1.0, seed=1))
    finally:
        del rollout.generate_ids
    assert batches == [2 * len(TEXTS)]


# ---- hermes parser -----------------------------------------------------------------------------------------
def test_hermes_well_formed_and_several():
    text = ('think <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
            '<tool_call>\n{"name": "b", "arguments": "{\\"y\\": 2}"}\n</tool_call> done')
    content, calls = hermes.parse(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [("a", {"x": 1}, None), ("b", {"y": 2}, None)]
    assert content == "think  and  done"


@pytest.mark.parametrize("body,why", [
    ("{not json}", "not valid JSON"),
    ('["a", 1]', "JSON object"),
    ('{"arguments": {}}', "no 'name'"),
    ('{"name": "a", "arguments": "{oops"}', "not valid JSON"),
    ('{"name": "a", "arguments": [1, 2]}', "must be a JSON object"),
])
def test_hermes_malformed_calls_become_errors(body, why):
    content, calls = hermes.parse(f"x <tool_call>{body}</tool_call> y")
    assert len(calls) == 1 and calls[0].error and why in calls[0].error, calls
    assert content == "x  y"


def test_hermes_unclosed_and_plain_text():
    content, calls = hermes.parse('answer <tool_call>{"name": "a", "argum')
    assert len(calls) == 1 and "not closed" in calls[0].error and content == "answer "
    assert hermes.parse("no calls here </tool_call>") == ("no calls here </tool_call>", [])
    _, calls = hermes.parse('<tool_call>{"name": "a"}</tool_call>')  # arguments may be left out
    assert calls[0].arguments == {} and calls[0].error is None


# ---- tools -------------------------------------------------------------------------------------------------
def schema(name):
    return {"type": "function", "function": {"name": name, "description": "", "parameters": {}}}


def test_function_tool_schema_and_truncation():
    s = function_schema(agent_helpers.probe)["function"]
    assert s["name"] == "probe" and s["parameters"]["properties"]["n"] == {"type": "integer",
                                                                           "description": "the number"}
    assert s["parameters"]["required"] == ["n"] and s["description"] == "Report a number back."
    assert truncate("abcdefghij", 4, "left") == "(truncated)...ghij"
    assert truncate("abcdefghij", 4, "right") == "abcd...(truncated)"
    assert truncate("abcdefghij", 4, "middle") == "ab...(truncated)...ij"
    assert truncate("abc", 4, "middle") == "abc"


def test_verl_tool_yaml_and_gsm8k_tool(tmp_path):
    cfg = tmp_path / "tools.yaml"
    cfg.write_text(textwrap.dedent("""\
        tools:
          - class_name: verl.tools.gsm8k_tool.Gsm8kTool
            config: {type: native}
            tool_schema:
              type: function
              function:
                name: calc_gsm8k_reward
                description: check
                parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}
        """))
    tools = load_tools(str(cfg), None)
    tool = tools["calc_gsm8k_reward"]
    kwargs = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}

    async def run():
        return await asyncio.gather(call_tool(tool, {"answer": "72"}, kwargs, 5.0),
                                    call_tool(tool, {"answer": "#### 1,000"}, kwargs, 5.0),
                                    call_tool(tool, {"answer": 71}, kwargs, 5.0))

    right, wrong, number = asyncio.run(run())
    assert right.text == "Current parsed answer='72' reward=1.0" and right.reward == 0.0 and not right.error
    assert wrong.text == "Current parsed answer='#### 1,000' reward=0.0" and wrong.reward == -0.05
    assert number.text == "Current parsed answer='71' reward=0.0"
    assert tool._state == {}  # every instance released


# ---- the tool agent's trajectory ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trajectory(hf):
    rollout, tok = hf
    cfg = RolloutConfig(mode="async", calculate_log_probs=True)
    cfg.multi_turn.enable, cfg.multi_turn.max_assistant_turns = True, 3
    cfg.multi_turn.function_tool_path = agent_helpers.__file__
    agent = AgentRollout(rollout, "hf", tok, cfg, P, R, tok.pad_token_id)
    # probe as an async function: the sync one would start tool worker processes (tests/e2e/test_faults_tools_fatal.py)
    agent.ctx.tools["probe"] = FunctionTool(agent_helpers.async_probe, agent.ctx.tools["probe"].tool_schema)
    agent.loops["forced"] = (agent_helpers.ForcedToolAgent, {"turn_tokens": 6})
    batch = prompts(tok, n=1, do_sample=True, temperature=1.0, seed=3)
    batch.non_tensors["agent_name"] = ["forced"] * len(TEXTS)
    return agent, agent.generate_sequences(batch)


def runs(mask_row):
    """[(value, length)] of the 1-runs and 0-runs of a row's mask up to its last 1."""
    out = []
    for v in mask_row.tolist():
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return [tuple(x) for x in out]


def test_tool_turns_are_in_the_sequence_and_masked_out(trajectory, hf):
    _, tok = hf
    agent, out = trajectory
    m = out.meta["agent_metrics"]
    assert m["agent/num_turns/mean"] == 6.0  # 3 assistant turns, 2 tool turns, + 1
    assert m["agent/tool_calls/mean"] == 2.0 and m["agent/tool_errors/mean"] == 0.0
    for k in range(len(TEXTS)):
        resp, rmask, attn = out["responses"][k], out["response_mask"][k], out["attention_mask"][k, P:]
        length = int(attn.sum())
        assert torch.all(attn[:length] == 1) and torch.all(attn[length:] == 0)
        r = runs(rmask[:length])
        # model turn, tool turn, model turn, tool turn, model turn (each model turn 6 tokens or up to its EOS)
        assert [v for v, _ in r] == [1, 0, 1, 0, 1], r
        start = 0
        for v, n in r:
            seg = resp[start:start + n].tolist()
            if v == 0:
                text = tok.decode(seg)
                before = resp[:start].tolist()
                lead = "" if before[-1] == tok.eos_token_id else "<|eos|>"
                assert text.startswith(lead + " [tool]probe saw "), text
                assert text.endswith("<|eos|> [assistant]"), text
            start += n
        assert out["rollout_log_probs"][k][rmask == 0].abs().sum() == 0
    # the first tool's reply reports the length of the model's first turn's text
    first = out["responses"][0]
    r = runs(out["response_mask"][0][:int(out["attention_mask"][0, P:].sum())])
    turn = tok.decode(first[:r[0][1]].tolist())
    assert f"probe saw {len(turn)}<|eos|>" in tok.decode(first[r[0][1]:r[0][1] + r[1][1]].tolist())


def test_sampled_log_probs_are_the_actors_on_every_model_turn(trajectory, hf):
    rollout, _ = hf
    _, out = trajectory
    mask = out["response_mask"].bool()
    actor = actor_log_probs(rollout.model, out)
    assert torch.allclose(out["rollout_log_probs"][mask], actor[mask], atol=1e-4)


def policy_grad(model, out: Batch, old: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    from rlx.algos.core_algos import compute_policy_loss

    model.zero_grad(set_to_none=True)
    logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                   position_ids=out["position_ids"]).logits.float()[:, P - 1:-1]
    lp = torch.log_softmax(logits, -1).gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)
    loss, *_ = compute_policy_loss(old, lp, adv, out["response_mask"], loss_agg_mode="token-mean")
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone()


def test_tool_tokens_get_no_gradient_and_no_advantage(trajectory, hf):
    from rlx.algos.core_algos import compute_grpo_outcome_advantage

    rollout, _ = hf
    _, out = trajectory
    model = rollout.model
    mask = out["response_mask"]
    tool = (out["attention_mask"][:, P:] == 1) & (mask == 0)
    assert tool.any()
    # GRPO: the outcome advantage covers the model's tokens only
    scores = torch.zeros(mask.shape)
    scores[torch.arange(len(mask)), torch.tensor([int(r.nonzero().max()) for r in mask])] = torch.tensor(
        [0.0, 1.0, 0.5])
    adv, _ = compute_grpo_outcome_advantage(scores, mask, ["g"] * len(mask))
    assert torch.all(adv[tool] == 0) and torch.any(adv[mask.bool()] != 0)

    with torch.enable_grad():
        old = actor_log_probs(model, out) + 0.05 * mask
        base = policy_grad(model, out, old, adv)
        # change the tool tokens' (old) log-probs and advantages wildly: the gradient does not move
        old2, adv2 = old.clone(), adv.clone()
        old2[tool], adv2[tool] = -30.0, 1e4
        assert torch.equal(policy_grad(model, out, old2, adv2), base)
        # the tool tokens are context: changing one changes the later model tokens' gradient
        changed = Batch(dict(out.tensors))
        k, col = [int(x) for x in tool.nonzero()[0]]
        responses = out["responses"].clone()
        responses[k, col] = (responses[k, col] + 1) % 200 + 3
        changed.tensors["responses"] = responses
        changed.tensors["input_ids"] = torch.cat([out["prompts"], responses], dim=1)
        assert not torch.equal(policy_grad(model, changed, old, adv), base)
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("override,named", [
    ("actor_rollout_ref.rollout.name=sglang", "name=sglang"),
    ("actor_rollout_ref.rollout.mode=fast", "rollout.mode='fast'"),
    ("actor_rollout_ref.rollout.multi_turn.format=qwen", "multi_turn.format='qwen'"),
    ("actor_rollout_ref.rollout.multi_turn.use_inference_chat_template=true", "use_inference_chat_template"),
    ("actor_rollout_ref.rollout.agent.default_agent_loop=react", "default_agent_loop='react'"),
])
def test_agent_keys_refused_by_name(override, named):
    from conftest import load_config

    with pytest.raises(ValueError) as e:
        load_config([override])
    assert named in str(e.value), str(e.value)


def test_a_function_tool_path_that_is_not_python_is_refused(tmp_path):
    from rlx.workers.rollout.agent.tools import load_function_tools

    f = tmp_path / "tools.txt"
    f.write_text("def add(a: int, b: int) -> int:\n    return a + b\n")
    with pytest.raises(ValueError, match=r"function_tool_path='.*tools\.txt' is not a Python file\. Fix: a \.py file"):
        load_function_tools(str(f))
