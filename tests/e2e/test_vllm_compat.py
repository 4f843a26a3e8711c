"""End-to-end half of tests/unit/test_vllm_compat.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
import dataclasses
import pytest
from rlx.workers.rollout import vllm_compat as vc
from unit.test_vllm_compat import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    needs_vllm,
)


@needs_vllm
def test_installed_release_matches_the_tables():
    """The adapter's view of the installed vLLM, read from its files, agrees with the imported package; the engine
    arguments the tables assign to this release are really its EngineArgs fields."""
    import torch
    import vllm
    from vllm.engine.arg_utils import EngineArgs

    assert vc.installed_version() == vllm.__version__
    assert vc.installed_torch_pin() == ".".join(torch.__version__.split("+")[0].split(".")[:2])
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    version = vc.parse_version(vllm.__version__)
    newer = version >= (0, 32, 0)
    assert (vc.ONLY_FROM_0_32 <= fields) is newer and not (vc.ONLY_BEFORE_0_32 & fields) is newer
    assert "swap_space" not in fields or not newer
    import inspect

    from vllm import LLM

    returns = inspect.signature(LLM.wake_up).return_annotation
    assert (returns in (bool, "bool")) is vc.api_for(vllm.__version__).wake_up_reports_awake, returns


@needs_vllm
def test_rollout_refuses_an_engine_argument_of_another_release():
    """The real construction path: the engine_kwargs check runs before any engine is built."""
    import vllm

    from rlx.config.schema import RolloutConfig
    from rlx.workers.rollout.vllm_rollout import VLLMRollout

    newer = vc.api_for(vllm.__version__).wake_up_reports_awake
    key = "calculate_kv_scales" if newer else "sleep_mode_offload_cudagraph"
    cfg = RolloutConfig(name="vllm", tensor_model_parallel_size=1, engine_kwargs={key: True})
    with pytest.raises(ValueError, match=rf"actor_rollout_ref.rollout.engine_kwargs.{key} .*not an engine argument "
                                         rf"of the installed vLLM {vllm.__version__}"):
        VLLMRollout("builtin://tiny-qwen2", cfg, max_prompt_length=8, max_response_length=8, pad_token_id=0,
                    eos_token_id=2, dtype="float32")
