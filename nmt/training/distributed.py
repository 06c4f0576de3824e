"""Data-parallel training through PyTorch's own engine: `torchrun` starts the processes, DDP syncs gradients.

    torchrun --standalone --nproc_per_node 2 -m nmt.cli.train experiment=quickstart run_dir=runs/ddp

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; a process group is opened with `gloo` on CPU and `nccl`
on CUDA (each process on the GPU of its LOCAL_RANK). Every process reads the same data and builds the
same epoch's batch list; an update takes `train.accumulate` x WORLD_SIZE consecutive batches of it,
process r the ones at r, r + WORLD_SIZE, ..., so the global batch is their sum and the data position
is global (a run resumes with any number of processes). Only rank 0 logs, validates and writes files;
the others learn its decisions (a new best, early or timed stop) through `agree` and `broadcast`.
Without WORLD_SIZE (or with 1) everything here is a no-op.

A collective waits at most train.dist_timeout_min (default 60) minutes for the other processes. Data preparation
(tokenizer training and encoding: minutes on a large corpus) is rank 0's alone, and the others wait for it on a
file beside the data cache, not in a collective (`main_first`): however long it takes, nothing times out, and if it
fails the others stop with rank 0's own one-line error instead of waiting for a timeout.
"""

from __future__ import annotations

import inspect
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
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

    def setup(self, device: torch.device, timeout_min: float = 60.0) -> torch.device:
        """Open the process group (once), its collectives timing out after `timeout_min` minutes; on CUDA each
        process takes the GPU of its local rank."""
        if not self.enabled:
            return device
        if device.type == "cuda":
            device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            timeout = timedelta(minutes=timeout_min)
            dist.init_process_group(
                "nccl" if device.type == "cuda" else "gloo",
                rank=self.rank,
                world_size=self.world,
                timeout=timeout,
                store=self._attempt_store(timeout),
            )
        return device

    def _attempt_store(self, timeout: timedelta) -> dist.Store | None:
        """Under torchrun, the rendezvous store with a prefix of its own for each restart of the job.

        After a restart torchrun hands the new workers the same store, which still holds the addresses the
        previous attempt's processes published; a new process that reads its peer's key before the peer has
        rewritten it connects to a dead address and fails ("Gloo connectFullMesh failed ... Connection refused",
        one restart in three here; NCCL would read a stale unique id). Keys under an attempt prefix cannot be
        stale. Outside torchrun (no TORCHELASTIC_RESTART_COUNT) None: the usual env:// rendezvous."""
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if attempt is None or "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
            return None
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's agent hosts it
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            self.world,
            is_master=not agent_store and self.rank == 0,
            timeout=timeout,
            multi_tenant=True,
        )
        return dist.PrefixStore(f"nmt/attempt_{attempt}", store)

    def main_first(self, work: Callable[[bool], Any], folder: Path, poll: float = 0.2) -> Any:
        """`work(True)` on rank 0 while the others wait for it on a file in `folder` (no collective, so no
        timeout), then `work(False)` on them (reading what rank 0 made, e.g. its cache). If rank 0's work
        fails, the others raise its error's first line as an NmtError."""
        if not self.enabled:
            return work(True)
        token = self.broadcast(uuid.uuid4().hex if self.main else None)  # every process is here at the start
        done, failed = folder / f".rank0-{token}.done", folder / f".rank0-{token}.failed"
        if self.main:
            try:
                result = work(True)
            except BaseException as err:
                message = str(err).splitlines()[0] if str(err) else type(err).__name__
                if not isinstance(err, NmtError):
                    message = f"rank 0 failed: {type(err).__name__}: {message}"
                folder.mkdir(parents=True, exist_ok=True)
                failed.write_text(message + "\n", encoding="utf-8")
                raise
            folder.mkdir(parents=True, exist_ok=True)
            done.touch()
        else:
            while not done.exists():
                if failed.exists():
                    raise NmtError(failed.read_text(encoding="utf-8").strip())
                time.sleep(poll)
            result = work(False)
        self.broadcast(None)  # every process has seen the marker: rank 0 removes it
        if self.main:
            done.unlink(missing_ok=True)
        return result

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """The model DDP-wrapped for training (gradients averaged over processes), or itself."""
        if not self.enabled:
            return model
        from torch.nn.parallel import DistributedDataParallel

        # The models' buffers are constants (the Transformer's sinusoid table), the same on every process from the
        # start: DDP need not broadcast them before every forward pass (forward_sync_buffers=False where torch has
        # it; its older name, broadcast_buffers, warns as deprecated from torch 2.13 on).
        newer = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
        no_sync = {"forward_sync_buffers" if newer else "broadcast_buffers": False}
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None, **no_sync)

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
