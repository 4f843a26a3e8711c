"""The console: known harmless warnings are dropped at their source (exact records), others still show."""
import logging


def _record(name, msg, *args):
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)


def test_vllm_rotary_reload_note_is_dropped_and_nothing_else():
    from rlx.workers.rollout.vllm_rollout import _RotaryReloadFilter, _quiet_rotary_reload_warning

    f = _RotaryReloadFilter()
    name = "vllm.model_executor.model_loader.reload.layerwise"
    assert not f.filter(_record(name, "%s: Failed to load weights", "RotaryEmbedding"))
    assert not f.filter(_record(name, "%s: Failed to load weights", "Llama3RotaryEmbedding"))
    assert f.filter(_record(name, "%s: Failed to load weights", "QKVParallelLinear"))  # a real failure shows
    assert f.filter(_record(name, "%s: Delayed processing", "RotaryEmbedding"))
    _quiet_rotary_reload_warning()
    _quiet_rotary_reload_warning()
    assert sum(isinstance(x, _RotaryReloadFilter) for x in logging.getLogger(name).filters) == 1


def test_ray_token_auth_note_is_dropped_but_auth_off_still_warns():
    from rlx.trainer.console import drop_known_harmless_warnings

    drop_known_harmless_warnings()
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    assert not logger.filter(_record(logger.name, "Token authentication is enabled for this Ray cluster. Set "
                                                  "RAY_AUTH_MODE=disabled to opt out."))
    assert logger.filter(_record(logger.name, "Token authentication is disabled for this Ray cluster. Anyone ..."))


def test_validation_summary_says_start_only_when_validated_before_training():
    from rlx.trainer.console import validation_summary

    key = "val/digits/reward/mean"
    history = [{key: 0.1, "timing_s/testing": 1.0}, {key: 0.25}, {key: 0.5}]
    assert validation_summary(history, True) == [f"validation {key}: start 0.1000 -> end 0.5000"]
    # trainer.val_before_train=False: the first validation ran after training steps; it is no "start"
    no_start = validation_summary(history[1:], False)
    assert no_start == [f"validation {key}: end 0.5000 (no validation before training: trainer.val_before_train=False)"]
    assert "start" not in validation_summary(history[2:], False)[0]
    assert validation_summary(history[:1], True) == [f"validation {key}: 0.1000"]  # val_only: one value
    assert validation_summary([], True) == validation_summary([], False) == []
