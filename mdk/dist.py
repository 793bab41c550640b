"""The collectives between ranks (who a process is, is its ``mdk.world.World``).

Every helper works without torch.distributed (rank 0 of 1), and takes tensors on any device,
moving them to the backend's (NCCL: this GPU; gloo: the CPU) when needed.
"""
from __future__ import annotations

import functools
import logging
from typing import Callable

import torch
import torch.distributed as tdist

from mdk import sync_bn

log = logging.getLogger(__name__)


def is_initialized() -> bool:
    return tdist.is_available() and tdist.is_initialized()


def barrier() -> None:
    if is_initialized():
        tdist.barrier()


def comm_device() -> torch.device:
    """Where tensors of a collective must live: this process's GPU under NCCL, else the CPU."""
    if is_initialized() and tdist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _in_place(t: torch.Tensor, collective: Callable[[torch.Tensor], object]) -> torch.Tensor:
    """``collective`` on ``t`` in place wherever it lives (through a copy off the backend's
    device); a no-op in a single process."""
    if not is_initialized():
        return t
    buf = t.to(comm_device())  # ``t`` itself when it is there already
    collective(buf)
    if buf is not t:
        t.copy_(buf)
    return t


def _all_reduce(t: torch.Tensor, op: tdist.ReduceOp) -> torch.Tensor:
    return _in_place(t, functools.partial(tdist.all_reduce, op=op))


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """In-place MAX all-reduce (calibration caps, stop flags); a no-op in a single process."""
    return _all_reduce(t, tdist.ReduceOp.MAX)


def max_flag_started(value: float) -> Callable[[], float]:
    """Start a MAX all-reduce of one number; the returned call waits for and reads it. Read a step
    later, it costs no host sync per step (the stop flag's agreement)."""
    if not is_initialized():
        return lambda: value
    dev = comm_device()
    buf = torch.full((1,), value, dtype=torch.float32, device=dev)  # a kernel, not a copy
    work = tdist.all_reduce(buf, op=tdist.ReduceOp.MAX, async_op=True)
    if dev.type != "cuda":
        return lambda: (work.wait(), float(buf.item()))[1]
    work.wait()  # NCCL: the current stream waits for it; the host does not
    host = torch.empty(1, dtype=torch.float32, pin_memory=True)
    host.copy_(buf, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return lambda: (done.synchronize(), float(host.item()))[1]


def all_reduce_min(t: torch.Tensor) -> torch.Tensor:
    return _all_reduce(t, tdist.ReduceOp.MIN)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    return _all_reduce(t, tdist.ReduceOp.SUM)


def ordered_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """Sum of every rank's ``parts`` added one at a time in global order, so every split of the
    world gives the same bits (docs/distributed.md, ``dist.exact_chunk``); every rank gets it.
    ``parts``: non-empty, of one shape and dtype, the same count on every rank."""
    rank, world = (tdist.get_rank(), tdist.get_world_size()) if is_initialized() else (0, 1)
    home, dev = parts[0].device, comm_device() if world > 1 else parts[0].device
    acc = None
    if rank > 0:
        acc = torch.empty_like(parts[0], device=dev)
        tdist.recv(acc, src=rank - 1)
    for p in parts:  # additions on the backend's device (the same kernel in every split)
        p = p.to(dev)
        acc = p.clone() if acc is None else acc.add_(p)
    assert acc is not None
    if rank < world - 1:
        tdist.send(acc, dst=rank + 1)
    if world > 1:
        tdist.broadcast(acc, src=world - 1)
    return acc.to(home)


def all_gather_cat(t: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Every rank's 1-d ``t`` (rank r holds ``counts[r]`` values) concatenated in rank order."""
    if not is_initialized():
        return t
    dev, most = comm_device(), max(counts)
    buf = torch.zeros(most, dtype=t.dtype, device=dev)
    buf[: t.numel()] = t
    parts = [torch.empty_like(buf) for _ in counts]
    tdist.all_gather(parts, buf)
    return torch.cat([p[:c] for p, c in zip(parts, counts)]).to(t.device)


def broadcast(t: torch.Tensor, src: int = 0) -> torch.Tensor:
    return _in_place(t, functools.partial(tdist.broadcast, src=src))


def all_gather_object(obj: object) -> list:
    if not is_initialized():
        return [obj]
    out: list = [None] * tdist.get_world_size()
    tdist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: object, src: int = 0) -> object:
    if not is_initialized():
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]


def convert_sync_bn(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``dist.sync_bn=true``: BN over the global batch; torch's SyncBatchNorm on CUDA,
    mdk.sync_bn on the CPU (torch's refuses CPU tensors)."""
    n = sum(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if n == 0:
        log.info("dist.sync_bn=true but the model has no BatchNorm at this stage; nothing to convert")
        return model
    if device.type == "cpu":
        log.info("dist.sync_bn=true: %d BatchNorm layers normalise over the global batch "
                 "(mdk.sync_bn, gloo)", n)
        return sync_bn.convert(model)
    log.info("dist.sync_bn=true: %d BatchNorm layers -> SyncBatchNorm", n)
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
