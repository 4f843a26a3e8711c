"""Typed configuration: the root of the config tree (RLXConfig), the single source of truth for every key.

Each section lives in a module of its own with its dataclasses and, beside them, its rules (a `check_*(cfg,
errors)` function; closed choices are declared on the field with rlx.config.rules.choice): rlx.config.data,
.actor_rollout_ref (.model, .actor, .rollout; .fsdp for what every trained model shares), .critic,
.reward_model, .algorithm, .trainer, .profiler, .async_training, ... rlx.config.validate runs them all. A new
section is a module with its dataclass and its rules, one field here, and one line in validate.RULES.

`rlx/trainer/config/ppo_trainer.yaml` is the YAML view of these dataclasses (regenerate it with
`python -m rlx.config.export`); a test keeps the two identical. Key names follow verl's ppo_trainer.yaml
so that a verl command line works unchanged. Every leaf key does what its docstring says, or is refused:
keys that verl has and rlx does not implement yet are present with verl's defaults and listed in
`NOT_SUPPORTED` (setting one to another value fails validation); verl's deprecated keys are in `DEPRECATED`;
keys that only mirror another key are in `FOLLOWS`; the few keys that are no-ops by design are in
`NO_OP_BY_DESIGN`, each with the reason (these tables: rlx.config.verl_compat). `tests/unit/test_config_keys.py`
walks the schema and fails on a key that is none of these and that no consumer reads.
Each field carries a docstring (the string literal under it); the YAML export turns them into comments.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rlx.config.actor import ActorConfig, PolicyLossConfig, RefConfig
from rlx.config.actor_rollout_ref import ActorRolloutRefConfig
from rlx.config.algorithm import (AlgorithmConfig, FilterGroupsConfig, KLCtrlConfig, PFPPOConfig,
                                  RolloutCorrectionConfig)
from rlx.config.async_training import AsyncTrainingConfig, RolloutPoolConfig
from rlx.config.critic import CriticConfig, CriticModelConfig
from rlx.config.data import DataConfig
from rlx.config.fsdp import CheckpointContents, FSDPConfig, OptimConfig
from rlx.config.model import FusedKernelOptions, ModelConfig
from rlx.config.profiler import GlobalProfilerConfig
from rlx.config.reward import RewardSection, SandboxFusionConfig
from rlx.config.reward_model import CustomRewardFunctionConfig, RewardModelConfig, RewardModelModelConfig
from rlx.config.rollout import CheckpointEngineConfig, RolloutConfig, TraceConfig, ValKwargs
from rlx.config.trainer import RayInitConfig, TrainerConfig

__all__ = [  # the sections' dataclasses, importable from here as before the split
    "ActorConfig", "ActorRolloutRefConfig", "AlgorithmConfig", "AsyncTrainingConfig", "CheckpointContents",
    "CheckpointEngineConfig", "CriticConfig", "CriticModelConfig", "CustomRewardFunctionConfig", "DataConfig",
    "FSDPConfig", "FilterGroupsConfig", "FusedKernelOptions", "GlobalProfilerConfig", "KLCtrlConfig", "ModelConfig",
    "OptimConfig", "PFPPOConfig", "PolicyLossConfig", "RLXConfig", "RayInitConfig", "RefConfig", "RewardModelConfig",
    "RewardModelModelConfig", "RewardSection", "RolloutConfig", "RolloutCorrectionConfig", "RolloutPoolConfig",
    "SandboxFusionConfig", "TraceConfig", "TrainerConfig", "ValKwargs",
]


@dataclass
class RLXConfig:
    data: DataConfig = field(default_factory=DataConfig)
    """Datasets and lengths."""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """Actor, rollout and reference policy."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value model (used by gae)."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Reward settings."""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """User score function."""
    reward: RewardSection = field(default_factory=RewardSection)
    """verl 0.9.1's reward section: each key is another spelling of a legacy key (rlx.config.reward.ALIASES) and
    acts as that key; setting both spellings to different values is an error."""
    sandbox_fusion: SandboxFusionConfig = field(default_factory=SandboxFusionConfig)
    """verl's remote code sandbox for code rewards (not supported)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimation and KL."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop, logging, checkpoints, resources."""
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    """Ray."""
    global_profiler: GlobalProfilerConfig = field(default_factory=GlobalProfilerConfig)
    """Profiling: which steps, which tool, where the traces go (each role's profiler key says which ranks)."""
    rollout: RolloutPoolConfig = field(default_factory=RolloutPoolConfig)
    """The rollout's own GPUs with actor_rollout_ref.hybrid_engine=False (verl's disaggregated recipes)."""
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """How far the disaggregated rollout runs ahead of the trainer (staleness bound, sync period, partial rollout)."""

