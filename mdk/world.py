"""The process world: who this process is in a run and which device it drives. The launcher makes
one ``World`` per process and passes it down; nothing below it reads RANK / SLURM_* from the
environment, nor does a launcher write them into its own process, so a second run in the same
process (tests, a sweep's next job) never inherits a stale rank or GPU ordinal.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as tdist

from mdk.dist_config import check_backend
from mdk.errors import ConfigError
from mdk.trainer_config import check_device


@dataclass(frozen=True)
class World:
    rank: int = 0                 # global rank
    local_rank: int = 0           # rank on this machine (the GPU ordinal with CUDA)
    size: int = 1                 # processes in the run
    local_size: int = 1           # processes on this machine
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = "gloo"         # process-group backend when size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 does the single-writer side effects (files, sinks, progress bar)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def describe(self) -> str:
        return (f"rank {self.rank}/{self.size} (local {self.local_rank}/{self.local_size}) on "
                f"{self.device}" + (f" with {self.backend}" if self.distributed else ""))


def uses_cuda(device: str) -> bool:
    """Whether ``trainer.device`` means CUDA on this machine (``auto``: when there is a GPU)."""
    device = check_device(device)
    cuda = torch.cuda.is_available()
    if device == "cuda" and not cuda:
        raise ConfigError("trainer.device=cuda but this machine has no usable CUDA GPU; use "
                          "trainer.device=auto (CPU here) or run on a GPU machine")
    return device == "cuda" or (device == "auto" and cuda)


def backend_for(device: str, backend: str = "auto") -> str:
    backend = check_backend(backend)
    cuda = uses_cuda(device)
    if backend == "nccl" and not cuda:
        raise ConfigError("dist.backend=nccl needs CUDA GPUs; use dist.backend=auto (gloo on CPU)")
    return backend if backend != "auto" else "nccl" if cuda else "gloo"


def check_local_size(device: str, local_size: int) -> None:
    """One GPU per process (NCCL only says 'invalid usage' when two ranks share one)."""
    if not uses_cuda(device):
        return
    n = torch.cuda.device_count()
    if local_size > n:
        raise ConfigError(f"dist.gpus={local_size} but this machine has {n} GPU(s); use "
                          f"dist.gpus<={n}, or trainer.device=cpu to run CPU worker processes")


def make_world(rank: int, local_rank: int, size: int, local_size: int, device: str = "auto",
               backend: str = "auto") -> World:
    """The World of this process; with CUDA it also makes ``cuda:<local_rank>`` the current
    device, so NCCL and every ``.cuda()`` use this process's own GPU."""
    check_local_size(device, local_size)
    be = backend_for(device, backend)
    if uses_cuda(device):
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    return World(rank=rank, local_rank=local_rank, size=size, local_size=local_size, device=dev,
                 backend=be)


def single_process(device: str = "auto") -> World:
    return make_world(0, 0, 1, 1, device)


def alone(world: Optional[World], device: str = "cpu") -> World:
    """``world``, or with None the world of a process running alone; refused inside a process
    group, where only the launcher knows the rank."""
    if world is not None:
        return world
    if tdist.is_available() and tdist.is_initialized():
        raise RuntimeError("this process is part of a process group: pass its World (made by "
                           "the launcher) instead of None")
    return single_process(device)
