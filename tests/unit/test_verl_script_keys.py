"""Keys of verl's example scripts: each does what verl's does, or is refused by name with the reason.

- `actor.freeze_vision_tower`: a vision-language policy's vision tower stops training (a tiny Gemma 3 with an image
  in its input: the tower gets gradients without the key, none with it, and rlx's optimizer leaves it unchanged);
  a text-only model trains whole, with one note.
- `rollout.data_parallel_size` / `expert_parallel_size`: verl's default 1 (rlx's layout) accepted, above 1 refused.
- `rollout.trace.*`: accepted while `trace.backend` is null (inert, as in verl); a backend is refused.
- Keys verl 0.9.1 does not have either (`model.torch_dtype`, `reward_model.sandbox_fusion.*`):
  the unknown-key error says where the setting lives, or why there is none.
"""
from __future__ import annotations

import pytest
import torch

from conftest import load_config


def tiny_gemma3():
    """A vision-language model from a config (random weights): SigLIP tower (`model.vision_tower`), 4 image tokens."""
    from transformers import AutoModelForCausalLM, Gemma3Config

    cfg = Gemma3Config(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, vocab_size=300),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=290, boi_token_index=291, eoi_token_index=292)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg)


def image_loss(model):
    ids = torch.tensor([[2, 5] + [290] * 4 + [7, 8, 9]])
    torch.manual_seed(1)
    out = model(input_ids=ids, pixel_values=torch.randn(1, 3, 28, 28), labels=ids.masked_fill(ids == 290, -100),
                token_type_ids=(ids == 290).long())
    return out.loss


def test_freeze_vision_tower_stops_the_towers_training():
    from rlx.config.schema import OptimConfig
    from rlx.engine.fsdp import build_optimizer
    from rlx.engine.vision import apply_freeze_vision_tower, vision_tower

    free = tiny_gemma3()
    image_loss(free).backward()
    tower_grads = [p.grad is not None for p in vision_tower(free).parameters()]
    assert sum(tower_grads) >= 20  # the image reaches the loss through the tower (its pooling head is unused)

    model = tiny_gemma3()
    tower = apply_freeze_vision_tower(model, True)
    assert tower is model.model.vision_tower
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt, _ = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.0), total_steps=1)
    trained = {id(p) for group in opt.param_groups for p in group["params"]}
    tower_ids = {id(p) for p in tower.parameters()}
    assert not trained & tower_ids and len(trained) == sum(1 for _ in model.parameters()) - len(tower_ids)
    image_loss(model).backward()
    assert all(p.grad is None for p in tower.parameters())
    opt.step()
    after = dict(model.named_parameters())
    tower_names = {n for n, p in model.named_parameters() if id(p) in tower_ids}
    assert all(torch.equal(before[n], after[n]) for n in tower_names)
    changed = [n for n in before if n not in tower_names and not torch.equal(before[n], after[n])]
    assert any(n.startswith("model.language_model.") for n in changed), changed  # the language model trains


def test_freeze_vision_tower_on_a_text_model_is_a_note(capsys):
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlx.engine.vision import apply_freeze_vision_tower

    model = AutoModelForCausalLM.from_config(Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                         num_attention_heads=2, num_key_value_heads=1,
                                                         vocab_size=64))
    assert apply_freeze_vision_tower(model, True) is None
    assert all(p.requires_grad for p in model.parameters())
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "freeze_vision_tower=True" in err[0] and "no vision tower" in err[0], err
    assert apply_freeze_vision_tower(model, False) is None and capsys.readouterr().err == ""  # off: silent
    assert apply_freeze_vision_tower(model, True, rank=1) is None and capsys.readouterr().err == ""  # rank 0 says it


def test_freeze_vision_tower_key_is_verls():
    cfg = load_config(["actor_rollout_ref.actor.freeze_vision_tower=True"])
    assert cfg.actor_rollout_ref.actor.freeze_vision_tower is True
    assert load_config([]).actor_rollout_ref.actor.freeze_vision_tower is False


@pytest.mark.parametrize("key", ["data_parallel_size", "expert_parallel_size"])
def test_rollout_parallel_sizes_at_one_pass_above_one_refused(key):
    full = f"actor_rollout_ref.rollout.{key}"
    assert getattr(load_config([f"{full}=1"]).actor_rollout_ref.rollout, key) == 1
    with pytest.raises(ValueError) as err:
        load_config([f"{full}=2"])
    msg = str(err.value)
    assert f"{full}=2 is not supported" in msg and "tensor-parallel group" in msg and f"{full}=1" in msg, msg


def test_trace_keys_are_inert_without_a_backend_and_a_backend_is_refused():
    cfg = load_config(["actor_rollout_ref.rollout.trace.token2text=True",
                       "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker=4",
                       "trainer.project_name=proj"])
    trace = cfg.actor_rollout_ref.rollout.trace
    assert (trace.backend, trace.token2text, trace.max_samples_per_step_per_worker) == (None, True, 4)
    assert trace.project_name == "proj"  # verl's default follows trainer.project_name
    for backend in ("mlflow", "weave"):
        with pytest.raises(ValueError) as err:
            load_config([f"actor_rollout_ref.rollout.trace.backend={backend}"])
        assert f"actor_rollout_ref.rollout.trace.backend='{backend}' is not supported" in str(err.value)
        assert "tracing" in str(err.value)


@pytest.mark.parametrize("override,says", [
    ("actor_rollout_ref.model.torch_dtype=bfloat16", "actor_rollout_ref.actor.fsdp_config.model_dtype"),
    ("reward_model.sandbox_fusion.url=http://sandbox/run_code", "reward.sandbox_fusion"),
    ("reward_model.sandbox_fusion.max_concurrent=128", "not implemented"),
])
def test_keys_verl_does_not_have_either_say_where_the_setting_is(override, says):
    key = override.split("=")[0]
    with pytest.raises(ValueError) as err:
        load_config([override])
    msg = str(err.value)
    assert msg.startswith(f"Unknown config key '{key}'") and says in msg and "Did you mean" not in msg, msg


def test_a_reward_file_importing_a_verl_name_rlx_does_not_serve_is_told_what_it_serves(tmp_path):
    """verl's reward helpers rlx implements are served (tests/unit/test_verl_names.py); any other verl module is
    refused in one line naming it, what rlx serves and the fix."""
    from rlx.config.schema import CustomRewardFunctionConfig
    from rlx.reward.functions import load_reward_fn

    path = tmp_path / "reward_function.py"
    path.write_text("from verl.utils.reward_score import prime_math\n\n"
                    "def char_count_reward_function(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return float(prime_math.compute_score(solution_str, ground_truth)[0])\n")
    with pytest.raises(ValueError) as err:
        load_reward_fn(CustomRewardFunctionConfig(path=str(path), name="char_count_reward_function"))
    msg = str(err.value)
    assert "verl.utils.reward_score.prime_math is not one of the verl names rlx serves" in msg, msg
    assert "math_reward: compute_score, last_boxed_only_string, remove_boxed" in msg and "Fix:" in msg, msg
    path.write_text("import numpy_does_not_exist\n")  # another missing module: no verl hint
    with pytest.raises(ValueError) as err:
        load_reward_fn(CustomRewardFunctionConfig(path=str(path), name="f"))
    assert "verl" not in str(err.value)


def test_the_served_verl_helpers_act_as_verls_helpers():
    import importlib
    import sys

    from rlx import verl_names

    verl_names.install()
    names = ["verl.utils.reward_score.default_compute_score", "verl.utils.reward_score.math_dapo.normalize_final_answer"]
    names += [f"verl.utils.reward_score.{h}.{f}" for h in ("math_reward", "math_dapo")
              for f in ("last_boxed_only_string", "remove_boxed")]

    def resolve(dotted):
        module, _, attr = dotted.rpartition(".")
        return getattr(importlib.import_module(module), attr)

    try:
        fns = {name: resolve(name) for name in names}
    finally:
        for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
            if getattr(sys.modules[name], "__rlx_serves_verl__", False):
                del sys.modules[name]
    assert all(callable(f) for f in fns.values())
    text = "so the total is \\boxed{3} at first, then \\boxed{\\frac{1}{2}}."
    for helper in ("math_reward", "math_dapo"):
        boxed = fns[f"verl.utils.reward_score.{helper}.last_boxed_only_string"](text)
        assert boxed == "\\boxed{\\frac{1}{2}}"
        assert fns[f"verl.utils.reward_score.{helper}.remove_boxed"](boxed) == "\\frac{1}{2}"
    normalize = fns["verl.utils.reward_score.math_dapo.normalize_final_answer"]
    assert normalize("x = 1,000 dollars") == "1000" and normalize("\\text{5} inches") == "5"
    assert fns["verl.utils.reward_score.default_compute_score"]("openai/gsm8k", "so #### 72", "72") == 1.0
