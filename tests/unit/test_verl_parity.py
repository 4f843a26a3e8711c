"""rlx's estimators, policy losses, aggregations, KL forms and value loss against verl 0.9.1's own functions on random
inputs (fp32, rtol 1e-5): values, gradients and the metrics' names and values.

Skipped unless verl imports (it is no dependency of rlx): put a verl 0.9.1 source tree (and its `tensordict`) on
PYTHONPATH to run it, e.g. `PYTHONPATH=.:<verl-0.9.1>:<site-packages with tensordict> pytest tests/unit/test_verl_parity.py`.
"""
import numpy as np
import pytest
import torch

V = pytest.importorskip("verl.trainer.ppo.core_algos")

from rlx.algos import advantages as A  # noqa: E402
from rlx.algos import core_algos as C  # noqa: E402
from rlx.algos import policy_losses as P  # noqa: E402

B, T = 8, 7
IDX = np.array(["a", "a", "a", "b", "b", "c", "c", "c"], dtype=object)


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(B, T, generator=g) * 3 - 0.05
    new = old + (torch.rand(B, T, generator=g) - 0.5) * 0.8
    adv = torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) < 0.75).float()
    mask[:, 0] = 1
    mask[5] = 0  # a fully masked row
    outcome = torch.zeros(B, T)
    for i in range(B):
        outcome[i, int(mask[i].nonzero().max()) if mask[i].any() else 0] = float(torch.randint(0, 3, (1,),
                                                                                               generator=g))
    dense = torch.randn(B, T, generator=g) * mask
    return dict(old=old, new=new, adv=adv, mask=mask, outcome=outcome, dense=dense)


def same(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a, b)


GLOBAL = dict(dp_size=2, batch_num_tokens=40, global_batch_size=16, loss_scale_factor=3)


@pytest.mark.parametrize("mode", C.LOSS_AGG_MODES)
def test_agg_and_value_loss(data, mode):
    lm = torch.randn(B, T)
    same(C.agg_loss(lm, data["mask"], mode), V.agg_loss(lm, data["mask"], mode))
    same(C.agg_loss(lm, data["mask"], mode, **GLOBAL), V.agg_loss(lm, data["mask"], mode, **GLOBAL))
    vp, ret, val = torch.randn(B, T), torch.randn(B, T), torch.randn(B, T)
    for kw in ({}, GLOBAL):
        same(C.compute_value_loss(vp, ret, val, data["mask"], 0.3, mode, **kw)[0],
             V.compute_value_loss(vp, ret, val, data["mask"], 0.3, mode, **kw)[0])


@pytest.mark.parametrize("kind", C.KL_PENALTY_TYPES)
def test_kl(data, kind):
    a, b = data["new"].clone().requires_grad_(), data["new"].clone().requires_grad_()
    x, y = C.kl_penalty(a, data["old"], kind), V.kl_penalty(b, data["old"], kind)
    same(x.detach(), y.detach())
    (x * data["mask"]).sum().backward()
    (y * data["mask"]).sum().backward()
    same(a.grad, b.grad)


@pytest.mark.parametrize("agg", C.LOSS_AGG_MODES)
@pytest.mark.parametrize("mode", P.LOSS_MODES)
def test_policy_loss(data, mode, agg):
    from verl.workers.config import ActorConfig, PolicyLossConfig

    cfg = ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=2, clip_ratio_low=0.15,
                      clip_ratio_high=0.28, tau_neg=1.3,
                      policy_loss=PolicyLossConfig(loss_mode=mode, dro_beta=0.2, clip_cov_ratio=0.1, kl_cov_ratio=0.1))
    gbi = dict(dp_size=2, batch_num_tokens=40, global_batch_size=16, loss_scale_factor=None)
    for use_global in (False, True):
        cfg.global_batch_info.clear()
        if use_global:
            cfg.global_batch_info.update(gbi)
        a, b = data["new"].clone().requires_grad_(), data["new"].clone().requires_grad_()
        torch.manual_seed(3)  # clip_cov draws its tokens with torch.randperm
        x, mx = P.get_policy_loss_fn(mode)(data["old"], a, data["adv"], data["mask"], agg, cfg,
                                           global_batch=C.GlobalBatchInfo(**gbi) if use_global else None)
        torch.manual_seed(3)
        y, my = V.get_policy_loss_fn(mode)(data["old"], b, data["adv"], data["mask"], agg, cfg)
        same(x.detach(), y.detach())
        x.backward()
        y.backward()
        same(a.grad, b.grad)
        assert set(mx) == set(my)
        for k in my:
            same(mx[k], my[k])


@pytest.mark.parametrize("name", [n for n in A.ADV_ESTIMATORS if n != "gae"])
def test_estimator(data, name):
    from verl.trainer.config import AlgoConfig

    rewards = data["dense"] if name in ("reinforce_plus_plus", "remax", "optimal_token_baseline",
                                        "tir_optimal_token_baseline") else data["outcome"]
    common = dict(token_level_rewards=rewards, response_mask=data["mask"])
    ours, theirs = dict(common), dict(common)
    if name in A.GROUPED:
        ours["index"] = theirs["index"] = IDX
    if name in ("reinforce_plus_plus", "reinforce_plus_plus_baseline", "grpo_passk"):
        theirs["config"], ours["gamma"] = AlgoConfig(gamma=0.9), 0.9
    if name == "remax":
        ours["reward_baselines"] = theirs["reward_baselines"] = torch.randn(B)
    if "optimal_token_baseline" in name:
        extra = dict(old_log_probs=data["old"], sum_pi_squared=torch.rand(B, T) * 0.5,
                     rollout_is_weights=torch.rand(B, T) + 0.5)
        ours.update(extra)
        theirs.update(extra)
    got, want = A.compute_advantage(name, **ours), V.get_adv_estimator_fn(name)(**theirs)
    same(got[0], want[0])
    same(got[1], want[1])


def test_sum_pi_squared():
    import verl.utils.torch_functional as VF

    z = torch.randn(5, 11)
    same(C.sum_pi_squared_from_logits(z), VF.calculate_sum_pi_squared_from_logits(z))
