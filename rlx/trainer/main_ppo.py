"""Entry point: `python -m rlx.trainer.main_ppo key=value ...` (verl's key names).

compose + strict key check -> typed config -> validate (all before Ray starts) -> ray.init -> trainer.fit().
"""
from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("rlx")


def parse_argv(argv: list[str]) -> tuple[list[str], str | None, str]:
    """Split Hydra-style `--config-path/--config-name` flags from key=value overrides."""
    overrides, config_dir, config_name = [], None, "ppo_trainer"
    it = iter(argv)
    for arg in it:
        if arg.startswith("--config-path") or arg.startswith("--config-name") or arg in ("-cp", "-cn"):
            name, _, value = arg.partition("=")
            value = value or next(it)
            if name in ("--config-path", "-cp"):
                config_dir = os.path.abspath(value)
            else:
                config_name = value
        else:
            overrides.append(arg)
    return overrides, config_dir, config_name


def choose_rollout(cfg) -> str:
    from rlx.workers.rollout import vllm_available

    name = cfg.actor_rollout_ref.rollout.name
    if name != "auto":
        return name
    if vllm_available():
        return "vllm"
    log.warning("rollout: vLLM is not installed, falling back to actor_rollout_ref.rollout.name=hf "
                "(install vLLM with scripts/setup.sh for the fast rollout)")
    return "hf"


def init_ray(cfg) -> None:
    """Join the cluster named by ray_init.address / RAY_ADDRESS, else start a local Ray.

    No runtime env is passed here: `WorkerGroup` gives every worker the environment it needs, so nothing can
    clash with the runtime env of a `ray job submit`.
    """
    import ray

    if ray.is_initialized():
        return
    address = cfg.ray_init.address or os.environ.get("RAY_ADDRESS")
    if address:  # join the existing cluster; never start a second, local one
        ray.init(address=address)
    else:
        ray.init(num_cpus=cfg.ray_init.num_cpus, include_dashboard=False)


def run(cfg):
    """Start Ray (if needed), train; returns the trainer (its `history` holds the per-step metrics)."""
    from rlx.trainer.ppo_trainer import RayPPOTrainer

    rollout_name = choose_rollout(cfg)
    log.info("rollout: %s", rollout_name)
    init_ray(cfg)
    trainer = RayPPOTrainer(cfg, rollout_name)
    trainer.history = trainer.fit()
    if trainer.val_history:
        first, last = trainer.val_history[0], trainer.val_history[-1]
        for key in sorted(k for k in first if k.endswith("/reward/mean")):
            print(f"validation {key}: start {first[key]:.4f} -> end {last.get(key, float('nan')):.4f}", flush=True)
    return trainer


def main(argv: list[str] | None = None) -> int:
    from rlx.config import load_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    overrides, config_dir, config_name = parse_argv(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(overrides, config_dir, config_name)
    except ValueError as e:
        print(f"rlx: config error\n{e}", file=sys.stderr)
        return 2
    run(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
