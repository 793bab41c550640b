"""Which process of a run holds its checkpoint folder's lock (mdk/folder_lock.py): the one that
hosts rank 0, which writes the checkpoints; under torchrun or SLURM, rank 0's task only, so the
run's other tasks do not compete for it (when it refuses, they stop at the rendezvous).
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
    """The lock on ``paths.checkpoints``, when this process holds it."""
    if not holds_the_lock(cfg, env):
        return contextlib.nullcontext()
    return one_run(checkpoint_root(cfg), str(run_dir))
