"""Reward models (`reward_model.enable`): the score read at the last valid token, the reward model's own chat
template, the token-level layout, and PPO scored by a reward model through Ray (2 CPU workers)."""
from __future__ import annotations

import pytest
import torch

from rlx.reward.rm_inputs import place_scores, retemplated, same_tokenizer
from rlx.engine.packing import last_token_inputs
from rlx.models import resolve_model_path
from rlx.protocol import Batch

RM = "builtin://tiny-qwen2-rm"


def _tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(path))


def _reference_scores(rows: list[list[int]]) -> torch.Tensor:
    """Each row alone, unpadded, through HF's own sequence-classification model: its logit."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(resolve_model_path(RM), torch_dtype=torch.float32)
    with torch.no_grad():
        return torch.cat([model(torch.tensor([r])).logits[:, 0] for r in rows])


def _engine_model(packed: bool):
    from rlx.engine.fsdp import build_hf_model
    from rlx.engine.attention import packed_attn_implementation
    from rlx.engine.heads import apply_token_head

    attn = packed_attn_implementation("cpu") if packed else "sdpa"
    model = build_hf_model(RM, "critic", torch.float32, attn_implementation=attn)
    apply_token_head(model, "reward", None)
    return model.eval()


def _padded(rows, left: bool) -> Batch:
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        sl = slice(width - len(r), width) if left else slice(0, len(r))
        ids[i, sl], mask[i, sl] = torch.tensor(r), 1
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)})


@pytest.mark.parametrize("left,packed", [(True, False), (False, False), (True, True), (False, True)])
def test_score_is_read_at_the_last_valid_token(left, packed):
    rows = [[10, 11, 12, 13, 14, 15], [20, 21], [30, 31, 32, 33]]
    ti = last_token_inputs(_padded(rows, left), torch.device("cpu"), remove_padding=packed)
    with torch.no_grad():
        got = ti.scatter(_engine_model(packed)(**ti.kwargs))[:, 0]
    torch.testing.assert_close(got, _reference_scores(rows), rtol=1e-5, atol=1e-6)


def test_scores_go_on_the_last_valid_response_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    got = place_scores(torch.tensor([0.5, -2.0, 7.0, 3.0]), mask)
    expected = torch.tensor([[0, 0, 0.5, 0], [-2.0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 3.0]])
    assert torch.equal(got, expected)


def test_a_reward_model_with_another_chat_template_reads_the_conversation_in_its_own():
    actor, rm = _tokenizer("builtin://tiny-qwen2"), _tokenizer(RM)
    assert same_tokenizer(actor, actor) and not same_tokenizer(actor, rm)
    resp = actor("4")["input_ids"] + [actor.eos_token_id]
    responses = torch.tensor([resp + [actor.pad_token_id]])  # right-padded response, the EOS kept by the mask
    batch = Batch({"responses": responses, "response_mask": torch.tensor([[1] * len(resp) + [0]])},
                  {"raw_chat": _obj([[{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "What is 2+2?"}]])})
    out = retemplated(batch, actor, rm, max_length=1000)
    # rm's template: "<|bos|>{role}: {content}" per message; the leading BOS text goes, the actor's EOS text too
    expected = "system: Be brief.<|bos|>user: What is 2+2?<|bos|>assistant: 4"
    assert rm.decode(out["input_ids"][0][out["attention_mask"][0].bool()].tolist()) == expected
    assert out["attention_mask"].sum() == len(rm(expected)["input_ids"])
    cut = retemplated(batch, actor, rm, max_length=5)  # cut on the left: the response's end stays
    assert rm.decode(cut["input_ids"][0].tolist()) == expected[-5:]


def _obj(values):
    import numpy as np

    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


# ---------------------------------------------------------------------------------------------- config
RM_JOB = ["algorithm.adv_estimator=gae", "reward_model.enable=True", f"reward_model.model.path={RM}"]


def test_verl_0_9_reward_section_acts_as_the_legacy_keys():
    from conftest import load_config

    new = load_config(["algorithm.adv_estimator=gae", "reward.reward_model.enable=True",
                       f"reward.reward_model.model_path={RM}", "reward.reward_manager.name=dapo",
                       "reward.custom_reward_function.name=my_score", "reward.reward_kwargs.max_resp_len=8",
                       "reward.reward_model.rollout.dtype=bfloat16"], validate=False)
    assert new.reward_model.enable and new.reward_model.model.path == RM
    assert new.reward_model.reward_manager == "dapo" and new.custom_reward_function.name == "my_score"
    assert new.reward_model.reward_kwargs == {"max_resp_len": 8} and new.reward_model.rollout.dtype == "bfloat16"
    # the same value twice is fine; two different values for one thing name both keys
    load_config(RM_JOB + ["reward.reward_model.enable=True"], validate=False)
    with pytest.raises(ValueError, match=r"reward.reward_manager.name='dapo' and reward_model.reward_manager='batch'"):
        load_config(["reward.reward_manager.name=dapo", "reward_model.reward_manager=batch"], validate=False)


def test_verl_reward_loop_command_keys():
    """What verl's reward-model examples pass (served by vLLM there): accepted, the lengths bound the conversation,
    the serving knobs listed as engine-only, sglang and a resource pool of its own refused by name."""
    from conftest import load_config
    from rlx.workers.reward_model_worker import max_conversation_tokens

    cfg = load_config(RM_JOB + ["reward_model.use_reward_loop=True", "reward_model.rollout.name=vllm",
                                "reward_model.rollout.gpu_memory_utilization=0.8",
                                "reward_model.rollout.tensor_model_parallel_size=1",
                                "reward_model.rollout.prompt_length=2048", "reward_model.rollout.response_length=1024",
                                "reward_model.num_workers=8"])
    assert max_conversation_tokens(cfg) == 3072
    with pytest.raises(ValueError, match="reward_model.rollout.name='sglang'"):
        load_config(RM_JOB + ["reward_model.rollout.name=sglang"])
    with pytest.raises(ValueError, match="reward_model.enable=True needs reward_model.model.path"):
        load_config(["algorithm.adv_estimator=gae", "reward_model.enable=True"])


def test_reward_model_on_a_pool_of_its_own_needs_both_sizes():
    from conftest import load_config
    from rlx.plan import REWARD_MODEL_GROUP, Pool, make_plan
    from rlx.trainer.check import describe

    with pytest.raises(ValueError) as err:
        load_config(RM_JOB + ["reward_model.enable_resource_pool=True", "reward_model.n_gpus_per_node=2"])
    msg = str(err.value)
    assert "reward_model.nnodes=None" in msg and "reward_model.n_gpus_per_node=2:" not in msg, msg
    with pytest.raises(ValueError, match=r"reward_model.n_gpus_per_node=0: .*verl requires both > 0"):
        load_config(RM_JOB + ["reward_model.enable_resource_pool=True", "reward_model.nnodes=1",
                              "reward_model.n_gpus_per_node=0"])
    own = RM_JOB + ["reward_model.enable_resource_pool=True", "reward_model.nnodes=1", "reward_model.n_gpus_per_node=3"]
    cfg = load_config(own)
    plan = make_plan(cfg)
    assert plan.placement.pool_of(REWARD_MODEL_GROUP) == Pool(1, 3) and plan.placement.sharing("trainer") == 2
    assert "the reward model on its own 1 node(s) x 3 = 3 rank(s)" in describe(cfg, plan)
    colocated = load_config(RM_JOB)  # verl's default
    plan = make_plan(colocated)
    assert plan.placement.groups[REWARD_MODEL_GROUP] == "trainer" and plan.placement.sharing("trainer") == 3
    assert "own" not in describe(colocated, plan).split("roles")[0]
