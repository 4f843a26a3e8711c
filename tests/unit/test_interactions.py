"""Interaction agents (multi_turn.interaction_config_path) and repeated rollouts (multi_turn.num_repeat_rollouts)
through the real agent rollout on CPU (HF engine, tiny model): the interaction answers each model turn without a
tool call, its replies are context-only user turns, its scores reach the reward function's extra_info; with
num_repeat_rollouts the trained turn is the first and the simulated conversations go to the reward."""
import asyncio
import textwrap

import pytest

from rlx.config.schema import RolloutConfig
from rlx.workers.rollout.agent.interactions import Gsm8kInteraction, load_interactions
from rlx.workers.rollout.agent.runner import AgentRollout

import agent_helpers
from tests.unit.test_agent_loop import P, TEXTS, hf, prompts, runs  # noqa: F401  (hf: the module's engine fixture)

R = 160


def interaction_yaml(tmp_path, patience=3):
    path = tmp_path / "interaction.yaml"
    path.write_text(textwrap.dedent(f"""\
        interaction:
          - class_name: agent_helpers.TryAgain
            config: {{patience: {patience}}}
        """))
    return str(path)


def rollout(hf, tmp_path, **multi_turn):
    engine, tok = hf
    cfg = RolloutConfig(mode="async", calculate_log_probs=True)
    cfg.multi_turn.enable = True
    cfg.multi_turn.interaction_config_path = interaction_yaml(tmp_path)
    for k, v in multi_turn.items():
        setattr(cfg.multi_turn, k, v)
    agent = AgentRollout(engine, "hf", tok, cfg, P, R, tok.pad_token_id)
    agent.loops["capped"] = (agent_helpers.CappedAgent, {"turn_tokens": 6})
    batch = prompts(tok, n=1, do_sample=True, temperature=1.0, seed=3)
    batch.non_tensors["agent_name"] = ["capped"] * len(TEXTS)
    batch.non_tensors["extra_info"] = [{"interaction_kwargs": {"name": "tryagain"}} for _ in TEXTS]
    return agent, batch


def test_the_interaction_answers_each_turn_until_it_accepts(hf, tmp_path):
    _, tok = hf
    agent, batch = rollout(hf, tmp_path)
    out = agent.generate_sequences(batch)
    interaction = agent.ctx.interactions["tryagain"]  # the name verl derives from the class name
    m = out.meta["agent_metrics"]
    assert m["agent/interaction_turns/mean"] == 3.0 and m["agent/interaction_score/mean"] == 1.0
    assert m["agent/num_turns/mean"] == 6.0  # 3 model turns, 2 user turns (the accepting reply adds no tokens), +1
    for k in range(len(TEXTS)):
        length = int(out["attention_mask"][k, P:].sum())
        resp, rmask = out["responses"][k][:length].tolist(), out["response_mask"][k][:length]
        r = runs(rmask)
        assert [v for v, _ in r] == [1, 0, 1, 0, 1], r
        start, model_turns, asks = 0, [], []
        for v, n in r:
            (model_turns if v else asks).append(resp[start:start + n])
            start += n
        for i, seg in enumerate(asks, 1):  # the user turn as the chat template writes it after the model's turn
            assert tok.decode(seg).endswith(f" [user]Try again ({i})<|eos|> [assistant]"), tok.decode(seg)
        assert out["rollout_log_probs"][k][:length][rmask == 0].abs().sum() == 0
        # what the interaction read last: the row's chat, the model's turns as text, its own replies
        last = next(s for s in reversed(interaction.seen) if s[0]["content"] == TEXTS[k])
        assert [msg["role"] for msg in last] == ["user", "assistant", "user", "assistant", "user", "assistant"]
        assert [msg["content"] for msg in last[1::2]] == [tok.decode(t, skip_special_tokens=True)
                                                          for t in model_turns]
        assert out.non_tensors["agent_extra"][k] == {"turn_scores": [0.0, 0.0, 1.0]}
    assert interaction.open == {}  # every trajectory finalized


def test_the_interactions_scores_reach_the_reward_functions_extra_info(hf, tmp_path):
    from rlx.reward.manager import RewardManager

    _, tok = hf
    agent, batch = rollout(hf, tmp_path)
    out = agent.generate_sequences(batch)
    out.non_tensors.update(data_source=["d"] * len(TEXTS), ground_truth=["1"] * len(TEXTS),
                           extra_info=[{"index": i} for i in range(len(TEXTS))])
    seen = []

    def score(data_source, solution_str, ground_truth, extra_info=None, **kw):
        seen.append(extra_info)
        return sum(extra_info["turn_scores"])

    scores, _ = RewardManager(tok, score)(out)
    assert scores.sum(-1).tolist() == [1.0] * len(TEXTS)
    assert [e["index"] for e in seen] == list(range(len(TEXTS)))


def test_repeated_rollouts_train_the_first_turn_and_give_the_conversations_to_the_reward(hf, tmp_path):
    _, tok = hf
    agent, batch = rollout(hf, tmp_path, num_repeat_rollouts=2)
    out = agent.generate_sequences(batch)
    for k in range(len(TEXTS)):
        length = int(out["attention_mask"][k, P:].sum())
        assert 0 < length <= 6 and out["response_mask"][k][:length].tolist() == [1] * length  # the first turn only
        first = tok.decode(out["responses"][k][:length].tolist(), skip_special_tokens=True)
        extra = out.non_tensors["agent_extra"][k]
        assert len(extra["messages"]) == 2 and extra["turn_scores"] == [[0.0, 0.0, 1.0]] * 2
        for talk in extra["messages"]:
            assert [msg["role"] for msg in talk] == ["user", "assistant"] * 3 + ["user"]
            assert talk[1]["content"] == first and talk[2]["content"] == "Try again (1)"
            assert talk[-1]["content"] == "Accepted."
        # each future samples for itself: their continuations differ
        a, b = extra["messages"]
        assert [x["content"] for x in a[3::2]] != [x["content"] for x in b[3::2]]
    assert agent.ctx.interactions["tryagain"].open == {}


def test_a_row_without_its_interaction_is_told_what_to_add(hf, tmp_path):
    agent, batch = rollout(hf, tmp_path)
    batch.non_tensors["extra_info"] = [{} for _ in TEXTS]
    with pytest.raises(ValueError, match=r"extra_info.interaction_kwargs.name naming one of \['tryagain'\]"):
        agent.generate_sequences(batch)


def test_verls_gsm8k_interaction_yaml_loads_rlxs_and_judges_answers(tmp_path):
    path = tmp_path / "gsm8k_interaction.yaml"
    path.write_text("interaction:\n  - name: gsm8k\n    class_name: verl.interactions.gsm8k_interaction."
                    "Gsm8kInteraction\n    config: {}\n")
    (gsm8k,) = load_interactions(str(path)).values()
    assert isinstance(gsm8k, Gsm8kInteraction) and gsm8k.name == "gsm8k"

    async def talk():
        iid = await gsm8k.start_interaction("a", ground_truth="72")
        wrong = await gsm8k.generate_response(iid, [{"role": "assistant", "content": "#### 71"}])
        right = await gsm8k.generate_response(iid, [{"role": "assistant", "content": "so #### 72"}])
        await gsm8k.finalize_interaction(iid)
        return wrong, right

    wrong, right = asyncio.run(talk())
    assert wrong[:3] == (False, "Your response is incorrect! You need to reflect on your answer and try again.", 0.0)
    assert right[:3] == (True, "Your response is correct!", 1.0) and gsm8k._state == {}


@pytest.mark.parametrize("text,says", [
    ("interaction: []\n", "has no `interaction:` list"),
    ("interaction:\n  - config: {}\n", "entry 0 has no class_name"),
    ("interaction:\n  - class_name: nowhere.Thing\n", "cannot be imported"),
    ("interaction:\n  - class_name: agent_helpers.CappedAgent\n", "is not an interaction class"),
    ("interaction:\n  - {class_name: agent_helpers.TryAgain}\n  - {class_name: agent_helpers.TryAgain}\n",
     "two interactions are named 'tryagain'"),
])
def test_bad_interaction_yaml_is_named(tmp_path, text, says):
    path = tmp_path / "i.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match="interaction_config_path") as e:
        load_interactions(str(path))
    assert says in str(e.value)


def test_config_keys():
    from conftest import load_config

    cfg = load_config(["actor_rollout_ref.rollout.multi_turn.interaction_config_path=i.yaml",
                       "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=3"])
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    assert (mt.interaction_config_path, mt.num_repeat_rollouts) == ("i.yaml", 3)
    with pytest.raises(ValueError, match="num_repeat_rollouts=2 simulates conversations with an interaction agent"):
        load_config(["actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=2"])
    with pytest.raises(ValueError, match="num_repeat_rollouts=0 must be a positive integer"):
        load_config(["actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=0"])
