"""What every worker role shares: rank bookkeeping and joining the role's process group."""
from __future__ import annotations

import logging
import socket

import torch


class Worker:
    def __init__(self, cfg, rank: int, world_size: int):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.device = None
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank{rank}] %(message)s")
        if cfg.trainer.device == "cpu":
            torch.set_num_threads(1)

    def addr_port(self):
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def init_distributed(self, master_addr: str, master_port: int) -> None:
        from rlx.workers.engine.fsdp import init_distributed

        self.device = init_distributed(self.cfg.trainer.device, self.rank, self.world_size, master_addr, master_port)
        torch.manual_seed(self.cfg.trainer.seed)
