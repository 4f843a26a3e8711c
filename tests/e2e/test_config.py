"""End-to-end half of tests/unit/test_config.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested."""
from conftest import load_config  # the quickstart job's config


def test_validation_does_no_io(monkeypatch):
    """validate reads no file, probes no package and asks for no GPU: the model's files, the packages and the GPUs
    are the preflight's (rlx.trainer.probes), which says the same errors before any worker starts."""
    import builtins
    import importlib.util
    import os
    import subprocess

    from rlx.config.validate import config_errors
    import rlx.algos.advantages, rlx.algos.core_algos, rlx.algos.policy_losses  # noqa: F401,E401 - the choices' registries

    cfg = load_config(["trainer.device=cuda", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.name=vllm",
                       "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.target_modules=[q_proj]",
                       "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                       "actor_rollout_ref.model.use_remove_padding=True",
                       "actor_rollout_ref.model.enable_activation_offload=True",
                       "actor_rollout_ref.model.use_liger=True", "trainer.logger=[console,swanlab]",
                       "actor_rollout_ref.rollout.multi_turn.tool_config_path=/nonexistent/tools.yaml"],
                      validate=False)

    def io(*a, **k):
        raise AssertionError(f"validation did IO: {a}")

    for module, name in ((builtins, "open"), (os.path, "exists"), (os.path, "isfile"), (importlib.util, "find_spec"),
                         (subprocess, "run"), (subprocess, "check_output")):
        monkeypatch.setattr(module, name, io)
    config_errors(cfg)  # no AssertionError from the stand-ins
