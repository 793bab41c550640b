"""The ``trainer`` and ``optim`` config groups: their schemas, words and checks. Torch-free: the
schemas load before Hydra composes, so ``run.py --help`` does not pay for importing torch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from mdk.checks import check_min, check_one_of, check_positive, get, one_of
from mdk.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")
_DURATION = re.compile(r"(?:(\d+(?:\.\d*)?)h)?(?:(\d+(?:\.\d*)?)m)?(?:(\d+(?:\.\d*)?)s?)?")  # trainer.device (mdk/world.py resolves auto)
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
    # a float stage's resolution schedule: [[size, share of the epochs], ...], ending at
    # model.image_size (null: every epoch at model.image_size); image_sizes() reads it
    image_sizes: Optional[list[Any]] = None
    time: Any = None  # a stage's time budget: 5m, 300s, 1h30m (null: trainer.epochs); seconds()


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
    seconds(cfg.trainer.get("time"))
    if "image_sizes" in cfg.trainer:
        image_sizes(cfg)


def seconds(value: Any, key: str = "trainer.time") -> Optional[float]:
    """A duration as seconds: ``5m``, ``300s``, ``1h30m``, ``2.5m`` or a number of seconds
    (null: none); anything else, zero or negative is one line naming ``key`` and the forms."""
    if value is None:
        return None
    forms = "a duration such as 5m, 300s, 1h30m or 2.5m (or a number of seconds), above zero"
    if isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} must be {forms}")
    if isinstance(value, (int, float)):
        total = float(value)
    else:
        text = str(value).strip().lower().replace(" ", "")
        parts = _DURATION.fullmatch(text) if text else None
        if parts is None or not any(parts.groups()):
            raise ConfigError(f"{key}={value!r} must be {forms}")
        h, m, sec = (float(g) if g else 0.0 for g in parts.groups())
        total = 3600 * h + 60 * m + sec
    if not total > 0 or total == float("inf"):
        raise ConfigError(f"{key}={value!r} must be {forms}")
    return total


def image_sizes(cfg: DictConfig) -> Optional[list[tuple[int, float]]]:
    """``trainer.image_sizes`` as ``[(size, share), ...]`` (None: not set), checked: sizes the
    model's pools divide, shares that sum to 1, the last at ``model.image_size``."""
    phases = get(cfg, "trainer.image_sizes")
    if phases is None:
        return None
    final = int(get(cfg, "model.image_size"))
    pools = list(OmegaConf.select(cfg, "model.net.channels", default=None) or []).count("M")
    stride = 2 ** pools
    example = f"e.g. [[{max(stride, final * 5 // 7 // stride * stride)},0.75],[{final},0.25]]"
    out: list[tuple[int, float]] = []
    for i, ph in enumerate(phases):
        ok = (OmegaConf.is_list(ph) or isinstance(ph, (list, tuple))) and len(ph) == 2
        size, share = (ph[0], ph[1]) if ok else (None, None)
        if not ok or isinstance(size, bool) or not isinstance(size, int) or size < stride \
                or size % stride or isinstance(share, bool) \
                or not isinstance(share, (int, float)) or not share > 0:
            raise ConfigError(f"trainer.image_sizes[{i}]={_plain(ph)!r} must be [size, share]: a "
                              f"size the model's {pools} pools divide (a multiple of {stride}) and "
                              f"a share of the stage's epochs above 0; {example}")
        out.append((size, float(share)))
    if not out or abs(sum(s for _, s in out) - 1) > 1e-6:
        raise ConfigError(f"trainer.image_sizes={_plain(phases)} must have shares that sum to 1; "
                          f"{example}")
    if out[-1][0] != final:
        raise ConfigError(f"trainer.image_sizes={_plain(phases)} must end at model.image_size="
                          f"{final} (the size evaluation and the chip use); {example}")
    return out


def epoch_sizes(phases: list[tuple[int, float]], epochs: int) -> list[int]:
    """The input size of each epoch of a stage of ``epochs``: phase ``i`` covers the epochs from
    round(its start share x epochs) on; the last epoch is always the last phase's."""
    sizes, start = [], 0.0
    for size, share in phases:
        start += share
        sizes += [size] * (int(round(start * epochs)) - len(sizes))
    sizes = (sizes + [phases[-1][0]] * epochs)[:epochs]
    sizes[-1] = phases[-1][0]
    return sizes


def _plain(v: Any) -> Any:
    return OmegaConf.to_container(v) if OmegaConf.is_config(v) else v


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
