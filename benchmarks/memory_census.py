"""Where the memory of one training step goes, by tensor class: a census of every storage the step allocates.

`MemoryCensus` is a TorchDispatchMode: every tensor an op returns whose storage it has not seen is recorded
with its bytes and a class (forward/backward, the code that made it, the op, the dtype), and forgotten when the
storage is freed (a weak reference on the storage object, which PyTorch keeps as long as the storage lives).
It tracks, per class, the bytes alive

* at the start of backward (the first op the autograd engine runs): what forward left for backward on the
  device (saved tensors that stayed, the loss's inputs; offloaded tensors are on the host by then), and
* at the peak of the bytes alive over forward and backward, up to the first optimizer step (whose own peak
  does not grow with the tokens); storages allocated before the census started, such as parameters and
  optimizer state, are not counted: the census sees what the step allocates.

It runs on CPU and CUDA alike (on CPU it is how the breakdown is developed at small scale), costs a Python call
per op, and does not change any result. `marginal(short, long)` turns two censuses at different lengths into
KB per added token, one class a row (what is constant cancels); `print_breakdown` prints it.

The class of a tensor: in backward inside an autograd node implemented in C++, that node's name (e.g.
`MmBackward0`); otherwise the innermost Python function outside torch itself (`Qwen2RMSNorm.forward`,
`_TiledLayer.backward`, ...), then the op and the dtype.
"""
from __future__ import annotations

import os
import sys
import weakref
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlx.offload.patching import tensors_in  # an op's output: a tensor, or tensors in lists/tuples

_TORCH_DIR = os.path.dirname(torch.__file__)
_HERE = os.path.abspath(__file__)


def _where() -> str:
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_TORCH_DIR) and os.path.abspath(fn) != _HERE and "/contextlib.py" not in fn:
            return f"{os.path.basename(fn)}:{getattr(f.f_code, 'co_qualname', f.f_code.co_name)}"
        f = f.f_back
    return "?"


class MemoryCensus(TorchDispatchMode):
    def __init__(self, device_type: str | None = None):
        super().__init__()
        self.device_type = device_type  # count only tensors on this device type (the pinned host pool is not GPU memory)
        self.live: dict[int, tuple[str, int]] = {}  # storage data_ptr -> (class, bytes)
        self.by_class: dict[str, int] = defaultdict(int)
        self.total = 0
        self.peak = 0
        self.at_peak: dict[str, int] = {}
        self.at_backward: dict[str, int] | None = None
        self.total_at_backward = 0
        self.n_ops = 0
        self.frozen = False  # set by the first optimizer step: its peak is flat in the tokens
        self._hook = None

    def __enter__(self):
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.frozen = False
        self._hook = register_optimizer_step_pre_hook(lambda *args: setattr(self, "frozen", True))
        return super().__enter__()

    def __exit__(self, *exc):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        return super().__exit__(*exc)

    # ---- recording ------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.n_ops += 1
        node = torch._C._current_autograd_node()
        if node is not None and self.at_backward is None:
            self.at_backward, self.total_at_backward = dict(self.by_class), self.total
        for t in tensors_in(out):
            self._record(t, func, node)
        return out

    def _record(self, t: torch.Tensor, func, node) -> None:
        if type(t) is not torch.Tensor or t.layout != torch.strided:
            return
        if self.device_type is not None and t.device.type != self.device_type:
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        ptr, nbytes = st.data_ptr(), st.nbytes()
        if nbytes == 0 or ptr in self.live:
            return
        bwd = node is not None
        where = node.name() if bwd and not _is_python_node(node) else _where()
        op = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
        cls = f"{'bwd' if bwd else 'fwd'} | {where} | {op} | {str(t.dtype).replace('torch.', '')}"
        self.live[ptr] = (cls, nbytes)
        self.by_class[cls] += nbytes
        self.total += nbytes
        if self.total > self.peak and not self.frozen:
            self.peak = self.total
            self.at_peak = dict(self.by_class)
        weakref.finalize(st, self._freed, ptr)

    def _freed(self, ptr: int) -> None:
        rec = self.live.pop(ptr, None)
        if rec is not None:
            self.by_class[rec[0]] -= rec[1]
            self.total -= rec[1]

    # ---- reporting ------------------------------------------------------------------------------------
    def summary(self, tokens: int) -> dict:
        """Bytes per class alive at the peak and at the start of backward, and their totals."""
        return dict(tokens=tokens, ops=self.n_ops, peak=self.peak, backward_start=self.total_at_backward,
                    at_peak=dict(self.at_peak), at_backward=dict(self.at_backward or {}))


def marginal(short: dict, long: dict, min_kb: float = 0.05) -> dict:
    """KB (1000 B) per token of growth from the `short` census to the `long` one, per class and in total: what
    grows with the sequence (constants, such as parameter gradients and optimizer temporaries, cancel)."""
    dt = long["tokens"] - short["tokens"]
    rows = []
    for cls in set(short["at_peak"]) | set(long["at_peak"]) | set(short["at_backward"]) | set(long["at_backward"]):
        peak = (long["at_peak"].get(cls, 0) - short["at_peak"].get(cls, 0)) / dt / 1e3
        held = (long["at_backward"].get(cls, 0) - short["at_backward"].get(cls, 0)) / dt / 1e3
        if abs(peak) >= min_kb or abs(held) >= min_kb:
            rows.append(dict(cls=cls, peak_kb=peak, backward_start_kb=held))
    rows.sort(key=lambda r: (-r["peak_kb"], -r["backward_start_kb"]))
    return dict(tokens=(short["tokens"], long["tokens"]), ops=long["ops"],
                peak_kb=(long["peak"] - short["peak"]) / dt / 1e3,
                backward_start_kb=(long["backward_start"] - short["backward_start"]) / dt / 1e3, rows=rows,
                peak_gib=(short.get("peak_gib"), long.get("peak_gib")), step_s=(short.get("step_s"), long.get("step_s")))


def print_breakdown(s: dict, title: str) -> None:
    print(f"\n#### {title}: {s['tokens'][0]} -> {s['tokens'][1]} tokens; KB per added token (1000 B) of what the "
          f"step allocates")
    print(f"alive at the peak: {s['peak_kb']:.2f} KB/token; held at the start of backward: "
          f"{s['backward_start_kb']:.2f} KB/token (rows below {0.05} KB/token left out)\n")
    print("| phase | made by | op | dtype | at peak | at backward start |")
    print("|---|---|---|---|---|---|")
    for r in s["rows"]:
        print("| " + " | ".join(r["cls"].split(" | ")) + f" | {r['peak_kb']:.2f} | {r['backward_start_kb']:.2f} |")


def _is_python_node(node) -> bool:
    """A custom autograd Function's node (`_TiledLayerBackward`; C++ nodes end in a digit: `MmBackward0`):
    its own Python frames name it better."""
    return node.name().endswith("Backward")

