"""The ``trainer`` and ``optim`` config groups: their schemas, words and checks. Torch-free: the
schemas load before Hydra composes, so ``run.py --help`` does not pay for importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig

from mdk.checks import check_min, check_one_of, check_positive, get, one_of
from mdk.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")  # trainer.device (mdk/world.py resolves auto)
AMP_DTYPES = ("auto", "float16", "bfloat16")
EMA_DTYPES = ("float32", "float64")


@dataclass
class EMAConf:
    enabled: bool = False
    decay: float = 0.9999
    tau: float = 2000.0
    dtype: str = "float32"


@dataclass
class TrainerConf:
    epochs: int = 40
    finetune_min_iters: Optional[int] = None  # step2-step4's min_iters (conf/step/)
    batch_size: int = 16
    limit_train_batches: Optional[int] = None
    limit_val_batches: Optional[int] = None
    num_workers: Any = None
    eval_every: int = 1
    checkpoint_every_iters: int = 0
    resume: bool = True
    amp: Any = "auto"  # true | false | auto (mdk/engine/precision.py resolves auto)
    amp_dtype: str = "auto"
    deterministic: bool = False
    tf32: bool = True
    activation_checkpointing: bool = False
    channels_last: Any = "auto"  # true | false | auto
    compile: bool = False
    grad_clip: Optional[float] = 10.0
    ema: EMAConf = field(default_factory=EMAConf)
    nan_skip_limit: int = 0
    progress: Any = "auto"  # auto | true | false (mdk/progress.py)
    device: str = "auto"
    conf_thresh: float = 0.01
    nms_iou: float = 0.5
    # {name: {_target_: pkg.module.Class, options...}}, built for every training stage
    hooks: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimConf:
    _target_: str = MISSING
    _partial_: bool = True
    lr: Any = MISSING           # Any keeps the value as typed; check_optim checks it
    weight_decay: float = 0.0


@dataclass
class SGDConf(OptimConf):
    momentum: float = 0.0


# Other optimizer arguments keep torch's defaults; to set them, add a YAML without this schema
# in conf/optim/.
TRAINER_SCHEMAS: dict[str, type] = {"trainer": TrainerConf}
OPTIM_SCHEMAS: dict[str, type] = {"adamw": OptimConf, "sgd": SGDConf}


def _true_false_auto(cfg: DictConfig, key: str, auto_means: str) -> None:
    """A switch whose ``auto`` is resolved where it is used."""
    v = get(cfg, key)
    if v not in (True, False, "auto"):
        raise ConfigError(f"{key}={v!r} must be true, false or auto (auto: {auto_means})")


def check_trainer(cfg: DictConfig) -> None:
    """``trainer.*`` and the run's ``seed``."""
    check_min(cfg, "seed", 0)
    for key, lo in (("epochs", 1), ("batch_size", 1), ("eval_every", 1),
                    ("checkpoint_every_iters", 0), ("nan_skip_limit", 0)):
        check_min(cfg, f"trainer.{key}", lo)
    for key in ("limit_train_batches", "limit_val_batches"):
        check_min(cfg, f"trainer.{key}", 1, optional=True)
    check_min(cfg, "trainer.finetune_min_iters", 0, optional=True)
    if get(cfg, "trainer.num_workers") != "auto":
        check_min(cfg, "trainer.num_workers", 0, optional=True)
    check_positive(cfg, "trainer.grad_clip", optional=True)
    check_device(cfg.trainer.device)
    check_one_of(cfg, "trainer.amp_dtype", AMP_DTYPES)
    _true_false_auto(cfg, "trainer.amp", "bfloat16 autocast for float stages trained on the CPU")
    _true_false_auto(cfg, "trainer.channels_last", "on the CPU, and on CUDA with trainer.amp")
    _true_false_auto(cfg, "trainer.progress", "progress bars only when stderr is a terminal, "
                     "none in a log file")
    if cfg.trainer.get("compile") and cfg.trainer.activation_checkpointing:
        raise ConfigError("trainer.compile=true with trainer.activation_checkpointing=true is not "
                          "supported (the checkpointed slices do not compile); choose one")
    ema = cfg.trainer.get("ema")
    if ema is not None and ema.enabled:
        check_ema(ema.decay, ema.tau, ema.dtype)


def check_device(device: Any) -> str:
    return one_of("trainer.device", device, DEVICES)


def check_ema(decay: Any, tau: Any, dtype: Any) -> None:
    """``trainer.ema``'s values: one check for the config and mdk/engine/ema.py."""
    if not 0 < float(decay) < 1:
        raise ConfigError(f"trainer.ema.decay={decay} must be in (0, 1), e.g. 0.9999")
    if float(tau) < 0:
        raise ConfigError(f"trainer.ema.tau={tau} must be >= 0 (0: constant decay)")
    if str(dtype) not in EMA_DTYPES:
        raise ConfigError(f"trainer.ema.dtype={dtype!r} must be one of {', '.join(EMA_DTYPES)}")


def check_optim(cfg: DictConfig) -> None:
    check_positive(cfg, "optim.lr")
