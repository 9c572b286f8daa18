"""Data-parallel training on several processes or GPUs, for both trainers (chapters 09 and 10).

Launched by `torchrun --nproc_per_node=N` (which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT in each process's environment), a trainer opens a `DataParallel`: it joins the process
group (gloo on CPUs, NCCL on GPUs), wraps the model in PyTorch's `DistributedDataParallel`, and gives each
process a disjoint slice of every global batch. Every process draws the SAME global batch from the same
seed and keeps only its rows, so the data needs no sharding and N processes see exactly what one process
would. DDP then averages the gradients over the processes during `backward`; the per-process loss is
weighted (`DataParallel.weight`) so that this average is exactly the gradient of the global batch's loss,
even when the slices hold different numbers of rows or of counted (non-PAD) targets. The optimiser steps
then agree on every process, and the weights stay equal without further communication. That holds for
Muon too (`tl.muon`, chapter 11): every process orthogonalises the same averaged gradients itself, so each
keeps the whole optimizer state and rank 0's checkpoint is complete (Keller Jordan's distributed Muon
instead shares the Newton-Schulz work out and gathers the new weights: less compute, more communication).

Without torchrun (no RANK / WORLD_SIZE / LOCAL_RANK), or with WORLD_SIZE=1, `DataParallel` does nothing:
the trainers run as they always did.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["launched_by_torchrun", "is_main_process", "DataParallel"]

_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def launched_by_torchrun() -> bool:
    """True when this process was started by torchrun with more than one process in all."""
    if not all(name in os.environ for name in _TORCHRUN_VARIABLES):
        return False
    return int(os.environ["WORLD_SIZE"]) > 1


def is_main_process() -> bool:
    """True in the process that prints and saves: rank 0, or the only process when there is no torchrun."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


class DataParallel:
    """This process's part of a data-parallel run, or a no-op for a single process.

    Args:
        device: where the caller wants to train. Under torchrun a CUDA device becomes this process's own
            GPU, cuda:LOCAL_RANK.

    Attributes:
        rank, world_size: this process's index and the number of processes (0 and 1 without torchrun).
        device: where this process trains.
        active: whether several processes take part (a process group is in use).
    """

    def __init__(self, device: torch.device) -> None:
        self.rank, self.world_size, self.device = 0, 1, device
        self._created = False
        if dist.is_available() and dist.is_initialized():  # the caller set up the group itself: use it
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        elif launched_by_torchrun():
            if device.type == "cuda":
                local_rank = int(os.environ["LOCAL_RANK"])
                self.device = torch.device("cuda", local_rank)
                torch.cuda.set_device(self.device)
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend=backend, timeout=timedelta(minutes=30))
            self._created = True
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.active = self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Whether this process prints, shows progress and saves (rank 0)."""
        return self.rank == 0

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module to call in training: `DistributedDataParallel(model)` when active, else `model` itself.

        DDP broadcasts rank 0's weights and buffers to every process when it is built, and averages the
        gradients over the processes in `backward`. Evaluation and saving use `model`, never the wrapper.
        """
        if not self.active:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def rows(self, batch_size: int) -> slice:
        """This process's rows of a global batch of `batch_size`: a contiguous slice, disjoint from the others.

        The sizes differ by at most one (the first batch_size % world_size processes take one more row).
        """
        if batch_size < self.world_size:
            raise ValueError(
                f"batch_size ({batch_size}) is the global batch, shared by the {self.world_size} processes: it "
                f"must be at least {self.world_size} so that every process gets a row"
            )
        base, extra = divmod(batch_size, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (1 if self.rank < extra else 0))

    def weight(self, local_count: int | Tensor, global_count: int | Tensor) -> float | Tensor:
        """The factor on this process's MEAN loss that makes DDP's average gradient the global mean's gradient.

        With a local mean over `local_count` terms, sum_r weight_r * mean_r / world_size (what DDP's averaging
        computes) equals the sum of all terms / global_count when weight_r = world_size * local_count /
        global_count. It is 1 for a single process.
        """
        if not self.active:
            return 1.0
        return self.world_size * local_count / global_count

    def sum(self, value: Tensor) -> Tensor:
        """The sum of `value` over the processes (a copy; `value` itself when not active)."""
        if not self.active:
            return value
        total = value.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total

    def close(self, wait: bool = True) -> None:
        """Leave the process group if this object joined it (a group the caller made stays open).

        Args:
            wait: first wait until every process is done (False after an error, when others may never come).
        """
        if self._created and dist.is_initialized():
            if wait:
                dist.barrier()
            dist.destroy_process_group()
            self._created = False
