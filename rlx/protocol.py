"""The one container that crosses the Ray boundary: named tensors + non-tensor fields + meta info.

Everything is split and concatenated along dim 0 (the batch dimension) for data parallelism.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        sizes = {k: v.shape[0] for k, v in self.tensors.items()}
        sizes.update({k: len(v) for k, v in self.non_tensors.items()})
        assert len(set(sizes.values())) <= 1, f"batch fields disagree on batch size: {sizes}"
        self.non_tensors = {k: np.asarray(v, dtype=object) for k, v in self.non_tensors.items()}

    def __len__(self) -> int:
        for v in self.tensors.values():
            return v.shape[0]
        for arr in self.non_tensors.values():
            return len(arr)
        return 0

    def __getitem__(self, key: str):
        return self.tensors[key] if key in self.tensors else self.non_tensors[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    # ---- construction / combination -------------------------------------------------------------
    def select(self, *keys: str) -> "Batch":
        return Batch({k: self.tensors[k] for k in keys if k in self.tensors},
                     {k: self.non_tensors[k] for k in keys if k in self.non_tensors}, dict(self.meta))

    def union(self, other: "Batch") -> "Batch":
        assert len(self) == len(other) or len(self) == 0 or len(other) == 0, (len(self), len(other))
        return Batch({**self.tensors, **other.tensors}, {**self.non_tensors, **other.non_tensors},
                     {**self.meta, **other.meta})

    def index(self, idx) -> "Batch":
        idx_t = torch.as_tensor(idx, dtype=torch.long)
        idx_np = idx_t.numpy()
        return Batch({k: v[idx_t] for k, v in self.tensors.items()},
                     {k: v[idx_np] for k, v in self.non_tensors.items()}, dict(self.meta))

    def slice(self, start: int, end: int) -> "Batch":
        return Batch({k: v[start:end] for k, v in self.tensors.items()},
                     {k: v[start:end] for k, v in self.non_tensors.items()}, dict(self.meta))

    def chunk(self, n: int) -> list["Batch"]:
        size = len(self)
        assert size % n == 0, f"batch of {size} does not split into {n} equal chunks"
        step = size // n
        return [self.slice(i * step, (i + 1) * step) for i in range(n)]

    def split(self, size: int) -> list["Batch"]:
        return [self.slice(i, min(i + size, len(self))) for i in range(0, len(self), size)]

    def repeat_interleave(self, n: int) -> "Batch":
        return Batch({k: v.repeat_interleave(n, dim=0) for k, v in self.tensors.items()},
                     {k: np.repeat(v, n, axis=0) for k, v in self.non_tensors.items()}, dict(self.meta))

    @staticmethod
    def concat(batches: list["Batch"]) -> "Batch":
        assert batches, "nothing to concatenate"
        first = batches[0]
        return Batch({k: torch.cat([b.tensors[k] for b in batches]) for k in first.tensors},
                     {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in first.non_tensors},
                     dict(first.meta))

    def to(self, device) -> "Batch":
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, self.non_tensors, self.meta)
