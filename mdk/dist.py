"""The one module that owns distributed state.

Every other module asks here for rank / world size / device and never reads RANK, SLURM_* or
MASTER_* itself. All helpers are safe to call when torch.distributed is not initialised
(single process): rank 0 of a world of 1.
"""
from __future__ import annotations

import logging

import torch
import torch.distributed as tdist

log = logging.getLogger(__name__)


def is_initialized() -> bool:
    return tdist.is_available() and tdist.is_initialized()


def get_rank() -> int:
    return tdist.get_rank() if is_initialized() else 0


def world_size() -> int:
    return tdist.get_world_size() if is_initialized() else 1


def is_main_process() -> bool:
    """Rank-0-only side effects (checkpoints, metric sinks, progress bar) are decided here."""
    return get_rank() == 0


def barrier() -> None:
    if is_initialized():
        tdist.barrier()


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """In-place MAX all-reduce (calibration caps); a no-op in a single process."""
    if is_initialized():
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return t


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if is_initialized():
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t


def all_gather_object(obj: object) -> list:
    """Gather any picklable object from every rank (rank order); [obj] in a single process."""
    if not is_initialized():
        return [obj]
    out: list = [None] * world_size()
    tdist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: object, src: int = 0) -> object:
    if not is_initialized():
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]
