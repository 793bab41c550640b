"""The one place that reads how this process was started: torchrun, SLURM/submitit, or by hand.

Returns a ProcessEnv; nothing else in the code base reads RANK / SLURM_* / MASTER_* variables.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class ProcessEnv:
    source: str            # "torchrun" | "slurm" | "submitit_local" | "none"
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    local_world_size: int = 1  # processes on this machine (one GPU each with CUDA)

    @property
    def external(self) -> bool:
        """True when something else (torchrun, SLURM) already started one process per rank."""
        return self.source != "none"


def detect() -> ProcessEnv:
    e = os.environ
    if "TORCHELASTIC_RUN_ID" in e or ("RANK" in e and "WORLD_SIZE" in e and "MASTER_ADDR" in e):
        world = int(e["WORLD_SIZE"])
        return ProcessEnv("torchrun", int(e["RANK"]), int(e.get("LOCAL_RANK", 0)), world,
                          e.get("MASTER_ADDR"), int(e.get("MASTER_PORT", 29500)),
                          int(e.get("LOCAL_WORLD_SIZE", world)))
    executor = e.get("SUBMITIT_EXECUTOR")
    slurm = executor == "slurm" and "SLURM_PROCID" in e and int(e.get("SLURM_NTASKS", "1") or 1) > 1
    # hydra/launcher=submitit_local with dist.gpus>1: submitit started one process per task on
    # this machine (without this, each would spawn dist.gpus workers of its own).
    local = executor == "local" and int(e.get("SUBMITIT_LOCAL_NTASKS", "1") or 1) > 1
    if not (slurm or local):
        return ProcessEnv("none")
    # submitit computes MASTER_ADDR/PORT from the job (port seeded by the job id).
    import submitit  # here: only jobs started by submitit need it (run.py loads this module)

    te = submitit.helpers.TorchDistributedEnvironment()
    return ProcessEnv("slurm" if slurm else "submitit_local", te.rank, te.local_rank,
                      te.world_size, te.master_addr if slurm else "127.0.0.1", int(te.master_port),
                      te.local_world_size)


def leave_torchrun_rank() -> None:
    """End a finished torchrun rank without interpreter teardown: gloo's C++ statics can abort
    there (SIGABRT), which torchrun would report as a failed job. Others are left alone (submitit
    must still write its result after the task returns)."""
    if detect().source == "torchrun":
        leave_process()


def leave_process() -> None:
    """Flush logs and std streams, then exit with status 0 skipping interpreter teardown."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
