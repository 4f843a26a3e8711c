"""verl interactions, written against verl's classes: one plays a user who hints until the model's "#### N" answer is
right (verl's gsm8k interaction's shape, on verl's base class), one extends verl's own GSM8K interaction."""
from typing import Any, Optional
from uuid import uuid4

from verl.interactions.base import BaseInteraction
from verl.interactions.gsm8k_interaction import Gsm8kInteraction
from verl.utils.reward_score import gsm8k


class HintInteraction(BaseInteraction):
    def __init__(self, config: dict):
        super().__init__(config)
        self._instance_dict = {}
        self.max_hints = int(config.get("max_hints", 2))

    async def start_interaction(self, instance_id: Optional[str] = None, ground_truth: Optional[str] = None,
                                **kwargs) -> str:
        if instance_id is None:
            instance_id = str(uuid4())
        self._instance_dict[instance_id] = {"ground_truth": ground_truth, "hints": 0}
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs) -> tuple[bool, str, float, dict]:
        content = next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), "")
        state = self._instance_dict[instance_id]
        score = gsm8k.compute_score(content, state["ground_truth"], method="strict", format_score=0.0, score=1.0)
        if score == 1.0:
            return True, "Correct.", score, {}
        state["hints"] += 1
        return state["hints"] > self.max_hints, "Not yet: end with '#### <number>'.", score, {"hints": state["hints"]}

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        del self._instance_dict[instance_id]


class PoliteGsm8kInteraction(Gsm8kInteraction):
    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs):
        done, reply, score, extra = await super().generate_response(instance_id, messages, **kwargs)
        return done, "Thank you. " + reply, score, extra
