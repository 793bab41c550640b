"""Which process of a run holds its checkpoint folder's lock (mdk/folder_lock.py).

The one that hosts rank 0, since rank 0 writes the checkpoints: the launching process of a run
on one machine (its local workers run under it), machine 0's with ``dist.nodes>1`` started by
hand, and rank 0's task under torchrun or SLURM (the other tasks of the same run must not
compete with it for the lock). When rank 0's task refuses, the other tasks stop at the
rendezvous (torchrun ends them at once; under SLURM they wait ``dist.timeout_s``). A requeued
SLURM job or a restarted torchrun rank comes back after its previous process has ended, so the
kernel has released that lock: it is taken over, with a log line.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import ContextManager

from omegaconf import DictConfig

from launchers.processes.env import ProcessEnv
from mdk.folder_lock import one_run
from mdk.stage_checkpoint import checkpoint_root


def holds_the_lock(cfg: DictConfig, env: ProcessEnv) -> bool:
    """This process hosts (or is) rank 0 of the run."""
    return (env.rank if env.external else int(cfg.dist.rank)) == 0


def folder_lock(cfg: DictConfig, env: ProcessEnv, run_dir: Path) -> ContextManager:
    """The lock on ``paths.checkpoints`` for this run, taken here when this process holds it."""
    if not holds_the_lock(cfg, env):
        return contextlib.nullcontext()
    return one_run(checkpoint_root(cfg), str(run_dir))
