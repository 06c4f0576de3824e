"""Data-parallel training through PyTorch's own engine: `torchrun` starts the processes, DDP syncs gradients.

    torchrun --standalone --nproc_per_node 2 -m nmt.cli.train experiment=quickstart run_dir=runs/ddp

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; a process group is opened with `gloo` on CPU and `nccl`
on CUDA (each process on the GPU of its LOCAL_RANK). Every process reads the same data and builds the
same epoch's batch list; an update takes `train.accumulate` x WORLD_SIZE consecutive batches of it,
process r the ones at r, r + WORLD_SIZE, ..., so the global batch is their sum and the data position
is global (a run resumes with any number of processes). Only rank 0 logs, validates and writes files;
the others learn its decisions (a new best, early or timed stop) through `agree` and `broadcast`.
Without WORLD_SIZE (or with 1) everything here is a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from nmt.errors import NmtError


@dataclass
class Distributed:
    """This process's place in the job: rank, world size, local rank."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Distributed:
        """Read torchrun's variables; WORLD_SIZE unset or 1 means a single process."""
        try:
            world = int(os.environ.get("WORLD_SIZE", "1"))
            rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
        except ValueError as err:
            raise NmtError(f"torchrun environment: {err}; expected integer RANK, WORLD_SIZE and LOCAL_RANK") from None
        return cls(rank, world, local)

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def setup(self, device: torch.device) -> torch.device:
        """Open the process group (once); on CUDA each process takes the GPU of its local rank."""
        if not self.enabled:
            return device
        if device.type == "cuda":
            device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=self.rank, world_size=self.world)
        return device

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """The model DDP-wrapped for training (gradients averaged over processes), or itself."""
        if not self.enabled:
            return model
        from torch.nn.parallel import DistributedDataParallel

        # The models' buffers are constants (the Transformer's sinusoid table), the same on every process from the
        # start: DDP need not broadcast them before every forward pass.
        return DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False
        )

    def sum(self, values: list[float], device: torch.device) -> list[float]:
        """Element-wise sum over processes."""
        if not self.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.tolist()

    def agree(self, flag: bool, device: torch.device) -> bool:
        """True on every process when it is true on any."""
        return bool(self.sum([float(flag)], device)[0] > 0) if self.enabled else flag

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every process."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every process's `obj`, by rank."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()
