"""Weights from the trainer pool to the rollout pool: one process group spanning the trainer's rank 0 (the source)
and every rollout rank, and a bucketed broadcast over it.

The trainer's ranks gather the full policy weights together (FSDP, one unit at a time: `policy_weights`); its
rank 0 casts each to the rollout's dtype and packs them into flat buckets of `bucket_bytes`, and broadcasts each
bucket as it fills. Every rollout rank receives the same buckets and hands their views, named, to its engine's
`sync_weights` (vLLM's `reload_weights`, or the HF copy), which consumes them as they arrive. Both sides cut the
buckets from the same list of (name, shape), exchanged once when the group is made, so no sizes travel per sync.

The group is a process group of its own (its own TCPStore rendezvous, NCCL on GPUs, gloo on CPU), made next to each
role's own default group: neither pool's collectives see the other. With several rollout ranks on one GPU
(rollout.engines_per_gpu=k) there are k such groups, one per engine slot: slot j holds the trainer's rank 0 and the
j-th rollout rank of every GPU, since NCCL takes no two ranks of one GPU in a group. The source then broadcasts each
bucket once per group (`transfer_slots` says who is in which).
"""
from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
import torch.distributed as dist

DEFAULT_BUCKET_BYTES = 256 * 2**20


@dataclass(frozen=True)
class WeightsInfo:
    """What the rollout receives, in order: each weight's name and shape, all in `dtype`."""
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    bucket_bytes: int = DEFAULT_BUCKET_BYTES

    def buckets(self) -> list[list[int]]:
        """The weights' indices, cut into buckets of at most bucket_bytes (a larger weight is a bucket of its own)."""
        size = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        out: list[list[int]]
        cur: list[int]
        out, cur, cur_bytes = [], [], 0
        for i, shape in enumerate(self.shapes):
            nbytes = _numel(shape) * size
            if cur and cur_bytes + nbytes > self.bucket_bytes:
                out.append(cur)
                cur, cur_bytes = [], 0
            cur.append(i)
            cur_bytes += nbytes
        if cur:
            out.append(cur)
        return out

    @property
    def nbytes(self) -> int:
        return sum(_numel(s) for s in self.shapes) * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def transfer_slots(ranks: int, ranks_per_gpu: int) -> list[list[int]]:
    """The rollout ranks of each transfer group: slot j holds ranks j, j + k, j + 2k, ... (k = ranks_per_gpu; ranks
    b*k .. b*k+k-1 share GPU b), so no group has two ranks on one GPU."""
    assert ranks % ranks_per_gpu == 0, (ranks, ranks_per_gpu)
    return [list(range(j, ranks, ranks_per_gpu)) for j in range(ranks_per_gpu)]


class WeightTransfer:
    """This process's end of the trainer -> rollout groups: the source (rank 0, the trainer's rank 0) is in every
    group of `groups` ((port, world size) each, rollout ranks 1.. of each); a rollout rank is in one."""

    def __init__(self, host: str, groups: list[tuple[int, int]], rank: int, device: torch.device, timeout_s: float):
        assert groups and (rank == 0 or len(groups) == 1), (groups, rank)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.device = rank, device
        # RLX_WEIGHT_TRANSFER=gloo: through host memory over gloo even between GPUs (slower; for a cluster whose GPUs
        # cannot reach each other over NCCL)
        self.backend = "nccl" if device.type == "cuda" and os.environ.get("RLX_WEIGHT_TRANSFER") != "gloo" else "gloo"
        self.wire = device if self.backend == "nccl" else torch.device("cpu")
        self._stores: list[dist.PrefixStore]
        self._stores, self.pgs = [], []
        for port, world_size in groups:  # the source meets the groups one by one, each group's ranks wait for it
            self.pgs.append(self._group(host, port, world_size))

    def _group(self, host: str, port: int, world_size: int):
        tcp = dist.TCPStore(host, port, world_size, is_master=self.rank == 0, timeout=self.timeout)
        store = dist.PrefixStore("rlx_weights", tcp)
        self._stores.append(store)  # the group keeps using it
        if self.backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = self.timeout
            pg = dist.ProcessGroupNCCL(store, self.rank, world_size, opts)
            if hasattr(pg, "_set_sequence_number_for_group"):  # what init_process_group does for its groups
                pg._set_sequence_number_for_group()
            return pg
        return dist.ProcessGroupGloo(store, self.rank, world_size, self.timeout)

    def _broadcast(self, buf: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        for pg in self.pgs:  # the source: to one group after the other (no two NCCL groups waiting on each other)
            pg.broadcast([buf], opts).wait()
        if buf.is_cuda:
            torch.cuda.current_stream().synchronize()

    def send(self, info: WeightsInfo, named: Iterable[tuple[str, torch.Tensor]]) -> dict:
        """The source: broadcast `named` (full tensors, in info's order) bucket by bucket; returns
        `{bytes, seconds}`."""
        assert self.rank == 0
        start, dtype = time.perf_counter(), getattr(torch, info.dtype)
        it = iter(named)
        for bucket in info.buckets():
            numels = [_numel(info.shapes[i]) for i in bucket]
            buf = torch.empty(sum(numels), dtype=dtype, device=self.device)
            off = 0
            for i, n in zip(bucket, numels):
                name, tensor = next(it)
                assert name == info.names[i] and tuple(tensor.shape) == tuple(info.shapes[i]), (name, info.names[i])
                buf[off:off + n].copy_(tensor.reshape(-1), non_blocking=True)
                off += n
            self._broadcast(buf.to(self.wire))
        assert next(it, None) is None, "the policy has more weights than when the transfer group was made"
        return {"bytes": info.nbytes, "seconds": time.perf_counter() - start}

    def receive(self, info: WeightsInfo) -> Iterator[tuple[str, torch.Tensor]]:
        """A rollout rank: the weights, named, as each bucket arrives (views of the bucket)."""
        assert self.rank > 0
        dtype = getattr(torch, info.dtype)
        for bucket in info.buckets():
            numels = [_numel(info.shapes[i]) for i in bucket]
            buf = torch.empty(sum(numels), dtype=dtype, device=self.wire)
            self._broadcast(buf)
            buf = buf.to(self.device)
            off = 0
            for i, n in zip(bucket, numels):
                yield info.names[i], buf[off:off + n].view(info.shapes[i])
                off += n

    def close(self) -> None:
        for pg in self.pgs:
            if hasattr(pg, "shutdown"):
                try:
                    pg.shutdown()
                except Exception:  # noqa: BLE001 -- best effort at exit
                    pass
