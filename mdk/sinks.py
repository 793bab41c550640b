"""Metric sinks: TensorBoard, wandb, or nothing. Off (or not rank 0) means a null object, so the
engine never asks "is logging on?"."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger(__name__)


class NullSink:
    def log(self, scalars: Mapping[str, float], step: int) -> None: ...
    def close(self) -> None: ...


class TensorBoardSink(NullSink):
    def __init__(self, logdir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.w = SummaryWriter(str(logdir))

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for k, v in scalars.items():
            self.w.add_scalar(k, v, step)

    def close(self) -> None:
        self.w.close()


class WandbSink(NullSink):
    def __init__(self, run_dir: Path, project: str, config: dict) -> None:
        import wandb

        # Never block on the network: without an API key (or with WANDB_MODE set) run offline;
        # the run can be synced later with `wandb sync <run_dir>/wandb/offline-run-*`.
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self.run = wandb.init(project=project, dir=str(run_dir), config=config, mode=mode,
                              settings=wandb.Settings(init_timeout=30, silent=True))
        log.info("wandb logging in %s mode", mode)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.run.finish()


class MultiSink(NullSink):
    def __init__(self, sinks: list[NullSink]) -> None:
        self.sinks = sinks

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for s in self.sinks:
            s.log(scalars, step)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def build_sinks(cfg_logger: Any, run_dir: Path, config: dict, is_main: bool) -> NullSink:
    if not is_main:
        return NullSink()
    sinks: list[NullSink] = []
    if cfg_logger.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tensorboard"))
    if cfg_logger.wandb:
        sinks.append(WandbSink(run_dir, cfg_logger.wandb_project, config))
    return MultiSink(sinks) if sinks else NullSink()
