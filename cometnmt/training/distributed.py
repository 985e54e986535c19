"""Data parallelism on PyTorch's own engine: ``torchrun`` sets RANK/WORLD_SIZE/LOCAL_RANK, we join
the process group (gloo on the CPU, NCCL on GPUs) and wrap the model in DistributedDataParallel.
Without those variables everything runs as a single process."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_from_env(device_kind: str) -> DistInfo:
    """Join the process group torchrun described, if any. ``device_kind``: 'cpu' or 'cuda'."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if device_kind == "cuda":  # before joining, so NCCL binds each rank to its own GPU
        torch.cuda.set_device(info.local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
    return info


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place; unchanged in a single process."""
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
