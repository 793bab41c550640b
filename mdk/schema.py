"""Typed schemas of the config groups (Hydra structured configs).

Each YAML of ``conf/trainer``, ``conf/dist``, ``conf/step``, ``conf/scheduler`` and ``conf/paths``
starts with ``defaults: [/_schema_<group>_<name>@_here_, _self_]``: Hydra merges the file onto
its dataclass, so an unknown key or a value of the wrong type (``trainer.epochs=abc``) fails at
compose time naming the key. Ranges and checks across keys are ``mdk.config.validate``'s.
``Any`` marks keys that take a word or a number (``cpu_threads: auto | 4``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from mdk import paths, stage_config


@dataclass
class EMAConf:
    enabled: bool = False
    decay: float = 0.9999
    tau: float = 2000.0
    dtype: str = "float32"


@dataclass
class TrainerConf:
    epochs: int = 40
    batch_size: int = 16
    limit_train_batches: Optional[int] = None
    limit_val_batches: Optional[int] = None
    num_workers: Any = None
    eval_every: int = 1
    checkpoint_every_iters: int = 0
    resume: bool = True
    amp: Any = "auto"  # true | false | auto (checked in mdk.config; mdk/engine/precision.py)
    amp_dtype: str = "auto"
    deterministic: bool = False
    tf32: bool = True
    activation_checkpointing: bool = False
    channels_last: Any = "auto"  # true | false | auto (checked in mdk.config)
    compile: bool = False
    grad_clip: Optional[float] = 10.0
    ema: EMAConf = field(default_factory=EMAConf)
    nan_skip_limit: int = 0
    progress: bool = True
    device: str = "auto"
    conf_thresh: float = 0.01
    nms_iou: float = 0.5


@dataclass
class DistConf:
    gpus: int = 1
    nodes: int = 1
    rank: int = 0
    dist_url: str = "auto"
    sync_bn: bool = False
    backend: str = "auto"
    timeout_s: float = 60.0
    exact_chunk: Optional[int] = None
    cpu_threads: Any = "auto"


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
    T_max: int = MISSING
    eta_min: float = 0.0


@dataclass
class CosineRestartsConf(SchedulerConf):
    T_0: int = 5
    T_mult: int = 1
    eta_min: float = 0.0


SCHEMAS: dict[str, dict[str, type]] = {
    "trainer": {"trainer": TrainerConf},
    "dist": {"dist": DistConf},
    "paths": paths.SCHEMAS,
    "step": stage_config.SCHEMAS,
    "scheduler": {"step": StepLRConf, "multistep": MultiStepLRConf, "cosine": CosineConf,
                  "cosine_restarts": CosineRestartsConf},
}


def schema_name(group: str, name: str) -> str:
    """The ConfigStore name of a schema: a top-level config (not a group, so ``--help`` does not
    list schemas as config groups), referenced as ``/_schema_<group>_<name>@_here_``."""
    return f"_schema_{group}_{name}"


def register_schemas() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent; must run before Hydra composes:
    run.py, mdk.compose and tests/conftest.py call it)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for group, items in SCHEMAS.items():
        for name, node in items.items():
            cs.store(name=schema_name(group, name), node=node)
