"""Interaction agents (`rollout.multi_turn.interaction_config_path`, verl's): a user-written class plays the user and
answers the model turn by turn. In the `tool_agent` loop, a model turn without a tool call goes to the row's
interaction (`extra_info.interaction_kwargs.name`); its reply becomes a user turn (context only, like a tool turn) and
the model answers again, until the interaction says to stop, a turn limit, or the response budget.

The class has verl's methods (all async), one instance per name serving every trajectory by `instance_id`:
    start_interaction(instance_id, **interaction_kwargs) -> instance_id     once per trajectory, before its first turn
    generate_response(instance_id, messages, **interaction_kwargs) -> (should_terminate, reply, turn_score, extra)
    calculate_score(instance_id, **kwargs) -> float                          the interaction's own use
    finalize_interaction(instance_id, **kwargs) -> None                      once per trajectory, when it ends
The YAML is verl's:

    interaction:
      - name: gsm8k                       # optional: the class name without its "Interaction" suffix, lowercased
        class_name: pkg.module.Class      # verl.interactions.gsm8k_interaction.Gsm8kInteraction maps to rlx's
        config: {}                        # the constructor's `config` (rlx adds `name`)
"""
from __future__ import annotations

import inspect
import os
import uuid
from typing import Any, Optional

from rlx import verl_names
from rlx.reward.rules.gsm8k import compute_score

KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"
VERL_INTERACTION_CLASSES = {
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": "rlx.workers.rollout.agent.interactions.Gsm8kInteraction"}


class BaseInteraction:
    """Base of interaction classes (verl's `verl.interactions.base.BaseInteraction` methods and signatures)."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.name: str = config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: Optional[str] = None, **kwargs) -> str:
        return instance_id if instance_id is not None else str(uuid.uuid4())

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs) -> tuple[bool, str, float, dict[str, Any]]:
        """(should the trajectory end, the user's reply, this turn's score, anything else)."""
        raise NotImplementedError(f"{type(self).__name__} must implement generate_response")

    async def calculate_score(self, instance_id: Optional[str] = None, **kwargs) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: Optional[str] = None, **kwargs) -> None:
        return None


class Gsm8kInteraction(BaseInteraction):
    """verl's GSM8K interaction: checks the model's last answer ("#### N", strict) against
    `interaction_kwargs.ground_truth`; right: "Your response is correct!" and the end; wrong: asks to try again."""

    def __init__(self, config: dict):
        super().__init__(config)
        self._state: dict[str, dict] = {}

    async def start_interaction(self, instance_id: Optional[str] = None, ground_truth: Optional[str] = None,
                                **kwargs) -> str:
        instance_id = instance_id or str(uuid.uuid4())
        self._state[instance_id] = {"response": "", "ground_truth": ground_truth}
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs):
        last = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        self._state[instance_id]["response"] = last
        score = await self.calculate_score(instance_id)
        if score == 1.0:
            return True, "Your response is correct!", score, {}
        return False, "Your response is incorrect! You need to reflect on your answer and try again.", score, {}

    async def calculate_score(self, instance_id: Optional[str] = None, **kwargs) -> float:
        assert instance_id is not None  # verl's signature; the runner passes the id start_interaction got
        s = self._state[instance_id]
        return compute_score(s["response"], s["ground_truth"], method="strict", format_score=0.0, score=1.0)

    async def finalize_interaction(self, instance_id: Optional[str] = None, **kwargs) -> None:
        if instance_id is not None:
            self._state.pop(instance_id, None)


def default_name(class_name: str) -> str:
    """verl's name of an entry without one: the class name without an "Interaction" suffix, lowercased."""
    simple = class_name.rsplit(".", 1)[-1]
    return (simple[:-len("Interaction")] if simple.endswith("Interaction") else simple).lower()


def load_interactions(path: Optional[str]) -> dict[str, BaseInteraction]:
    """{name: instance} of verl's interaction YAML (empty without a path)."""
    import yaml

    if not path:
        return {}
    if not os.path.isfile(os.path.expanduser(path)):
        raise ValueError(f"{KEY}={path!r} is not a file. Fix: {KEY}=<the path of verl's interaction YAML>.")
    with open(os.path.expanduser(path)) as f:
        doc = yaml.safe_load(f) or {}
    entries = doc.get("interaction") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{KEY}={path!r} has no `interaction:` list. Fix: write `interaction: [{{name: ..., "
                         f"class_name: package.module.Class, config: {{}}}}]`.")
    out: dict[str, BaseInteraction] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry.get("class_name"):
            raise ValueError(f"{KEY}={path!r}: entry {i} has no class_name. Fix: class_name: package.module.Class.")
        class_name = str(entry["class_name"])
        name = str(entry.get("name") or default_name(class_name))
        if name in out:
            raise ValueError(f"{KEY}={path!r}: two interactions are named {name!r}. Fix: give each a unique name.")
        cls = _import(class_name, path)
        out[name] = cls(config={**(entry.get("config") or {}), "name": name})
    return out


def _import(class_name: str, path: str) -> type:
    target = VERL_INTERACTION_CLASSES.get(class_name, class_name)
    cls = verl_names.import_user_object(target, f"{KEY}={path!r}: class_name {class_name!r}",
                                        "put its module on PYTHONPATH.") if "." in target else None
    missing = [m for m in ("start_interaction", "generate_response", "finalize_interaction")
               if not inspect.iscoroutinefunction(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        raise ValueError(f"{KEY}={path!r}: class_name {class_name!r} is not an interaction class (async "
                         f"{', '.join(missing) or 'methods'} missing). Fix: subclass {__name__}.BaseInteraction.")
    return cls
