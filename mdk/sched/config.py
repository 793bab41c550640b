"""The ``scheduler`` config group's schemas (conf/scheduler/*.yaml); torch-free, they load before
Hydra composes. The scheduler classes check the values (``mdk.sched.base.check_config``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING


@dataclass
class WarmupConf:
    iters: int = 0
    start_factor: float = 1.0
    method: str = "linear"
    mode: str = "mdk"     # mdk: warmup multiplies, the main clock starts at 0 | gti: it delays it
    epochs: int = 0       # warmup in epochs instead of iterations (GTI's unit)


@dataclass
class SchedulerConf:
    _target_: str = MISSING
    _partial_: bool = True
    interval: str = "epoch"
    warmup: WarmupConf = field(default_factory=WarmupConf)


@dataclass
class StepLRConf(SchedulerConf):
    step_size: int = 5
    gamma: float = 0.1


@dataclass
class MultiStepLRConf(SchedulerConf):
    milestones: list[int] = field(default_factory=lambda: [8, 11])
    gamma: float = 0.1


@dataclass
class CosineConf(SchedulerConf):
    T_max: Optional[int] = None   # null: the stage's length
    eta_min: float = 0.0


@dataclass
class CosineRestartsConf(SchedulerConf):
    T_0: int = 5
    T_mult: int = 1
    eta_min: float = 0.0


@dataclass
class OneCycleConf(SchedulerConf):
    interval: str = "iter"
    total_steps: Optional[int] = None   # null: the stage's length
    pct_start: float = 0.3
    div_factor: float = 25.0
    final_div_factor: float = 1e4


SCHEMAS: dict[str, type] = {"step": StepLRConf, "multistep": MultiStepLRConf, "cosine": CosineConf,
                            "cosine_restarts": CosineRestartsConf, "onecycle": OneCycleConf}
