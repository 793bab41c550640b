"""What a stage's work function gets: the ``StageContext``, built once by the stage runner."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from omegaconf import DictConfig

from mdk.checkpoint.layout import StageCheckpointer, Start
from mdk.stage_config import StageConf
from mdk.world import World


@dataclass
class StageContext:
    cfg: DictConfig
    run_dir: Path
    world: World
    spec: StageConf
    model: torch.nn.Module          # in the stage's mode, on world.device (not DDP-wrapped)
    train_ds: Any
    val_ds: Any
    checkpoints: StageCheckpointer
    start: Start
    loss_fn: torch.nn.Module
    # evaluate(keep=None): mAP etc. on the val split; ``keep`` receives the evaluator's full
    # result and the detections (for reports)
    evaluate: Callable[..., dict[str, Any]] = field(repr=False, default=dict)
    step_offset: int = 0              # optimizer steps of the pipeline's earlier stages
    group: Optional[str] = None       # the sweep this job belongs to (metric sinks group by it)
    started: float = 0.0              # time.perf_counter() when the stage began (trainer.time)
