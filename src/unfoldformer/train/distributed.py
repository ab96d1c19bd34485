"""This process's place in a (possibly single-process) run, and torchrun's DDP set-up (rank 0 writes all files)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ..recipe import TrainConfig
from ..runs import resolve_device

__all__ = ["DistInfo", "setup_distributed"]


@dataclass
class DistInfo:
    """This process's place in a (possibly single-process) run."""

    rank: int = 0
    world: int = 1
    local_world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed(cfg: TrainConfig) -> DistInfo:
    """Read torchrun's RANK / WORLD_SIZE / LOCAL_RANK; start gloo (CPU) or nccl (GPU) when WORLD_SIZE > 1."""
    import torch.distributed as dist
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(resolve_device(cfg.run.device))
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        device = torch.device(f"cuda:{local_rank}")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return DistInfo(rank, world, int(os.environ.get("LOCAL_WORLD_SIZE", str(world))), device)
