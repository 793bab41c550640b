"""The ``step`` config group's schema and checks: what a stage record (``conf/step/<stage>.yaml``)
may hold. A leaf, so the schema registry can import it before anything is composed.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional

from hydra.core.hydra_config import HydraConfig
from omegaconf import MISSING, DictConfig, OmegaConf

from mdk.errors import ConfigError

KINDS = ("train", "calibrate")  # built-in kinds of work; any other kind is a dotted function
GTI_STEPS = (1, 2, 3, 4)  # step.init_gti_step: the GTI MDK's steps
CHANNEL_ORDERS = ("BGR", "RGB")  # step.init_channels: a GTI MDK model's image_format


@dataclass
class QuantMode:
    """The chip layers' mode (``step.quant``), as mdk/quant/modes.py ``apply_mode`` takes it."""
    fold_bn: bool = False
    weights: bool = False
    activations: bool = False
    fuse_gains: bool = False

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> "QuantMode":
        return cls(**{f.name: bool(m[f.name]) for f in fields(cls) if f.name in m})

    @property
    def is_float(self) -> bool:
        return not (self.fold_bn or self.weights or self.activations or self.fuse_gains)


@dataclass
class BarConf:
    """This stage's mAP@0.5 must stay >= ``reference``'s - ``tolerance`` (a fraction: 0.02 is
    2 points); on the means over seeds when a sweep has a seed axis."""
    reference: str = MISSING
    tolerance: float = MISSING


@dataclass
class StageConf:
    """A stage's record: the schema of ``conf/step/<stage>.yaml`` and the one type every part of
    mdk reads a stage as (``from_node``: a composed record, or one a checkpoint saved)."""
    name: str = MISSING
    kind: str = "train"               # train | calibrate | pkg.module.fn (a function of the context)
    init_from: Optional[str] = None   # the stage whose best.pth this one starts from
    init_required: bool = False       # that input must exist (else: random weights)
    pretrained: Optional[str] = None  # a folder under paths.checkpoints, when no init_from
    next: Optional[str] = None
    export: bool = False              # export the best checkpoint as a chip model afterwards
    quant: QuantMode = field(default_factory=QuantMode)
    eval_quant: Optional[QuantMode] = None  # the mode its checkpoint is evaluated in (None: quant)
    epochs: Optional[int] = None
    lr_scale: float = 1.0
    min_iters: Optional[int] = None   # train at least this many optimizer steps (more epochs)
    bar: Optional[BarConf] = None     # read by from_node as a plain mapping (results carry it)
    # A file of the user's to start from instead (docs/pipeline.md, "Start from weights"): an mdk
    # checkpoint, a GTI MDK checkpoint or a torchvision VGG file; and what a GTI file needs said
    init_weights: Optional[str] = None
    init_caps: Optional[str] = None        # its relu_cap.txt (null: beside it, or <root>/model/)
    init_gti_step: Optional[int] = None    # the GTI MDK step that wrote it, 1-4
    init_channels: Optional[str] = None    # its first layer's channel order: BGR | RGB

    @classmethod
    def from_node(cls, node: Mapping[str, Any] | DictConfig) -> "StageConf":
        """The record of a config node or a plain mapping (a checkpoint's): every field it
        holds, the rest at their defaults; keys of other nodes (a stage's ``calibration``) and of
        older records are left out, an older record's ``calibrate``/``work`` read as its kind."""
        d = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        known = {f.name for f in fields(cls)}
        out = {k: v for k, v in d.items() if k in known}
        out["kind"] = _kind(d)
        out["quant"] = QuantMode.from_mapping(d.get("quant") or {})
        out["eval_quant"] = QuantMode.from_mapping(d["eval_quant"]) if d.get("eval_quant") else None
        out["bar"] = dict(d["bar"]) if d.get("bar") else None  # plain: a result carries it
        return cls(**out)

    @property
    def trains(self) -> bool:
        return self.kind == "train"

    @property
    def folds_bn(self) -> bool:
        """Its checkpoints hold BN-folded weights."""
        return self.quant.fold_bn

    @property
    def eval_mode(self) -> QuantMode:
        """The chip layers' mode its checkpoint is evaluated in."""
        return self.eval_quant if self.eval_quant is not None else self.quant


def _kind(d: Mapping[str, Any]) -> str:
    """A record's kind; records in older checkpoints have ``calibrate`` / ``work`` instead."""
    if "kind" in d:
        return check_kind(d["kind"], str(d.get("name")))
    return d.get("work") or ("calibrate" if d.get("calibrate") else "train")


@dataclass
class CalibrationStageConf(StageConf):
    # The method: a _target_ node of conf/step/calibration/ (its class, in mdk/quant/calibrate.py
    # or the user's, owns and checks its keys; mdk/calibration_config.py reads and builds the node).
    calibration: Any = None


@dataclass
class ReportConf:
    """The quantization report's per-layer sensitivity runs on the first ``sensitivity_images``
    val images (the waterfall on all)."""
    sensitivity_images: int = 96


@dataclass
class ReportStageConf(StageConf):
    report: ReportConf = field(default_factory=ReportConf)


SCHEMAS: dict[str, type] = {"stage": StageConf, "calibration_stage": CalibrationStageConf,
                            "report_stage": ReportStageConf}


def check_kind(kind: Any, stage: str) -> str:
    kind = str(kind)
    if kind not in KINDS and "." not in kind:
        raise ConfigError(f"step.kind={kind!r} ({stage}) must be train, calibrate or a function "
                          "pkg.module.fn that does the stage's work")
    return kind


def check_init(stage_cfg: DictConfig | dict, stage: str) -> None:
    """The ``init_*`` keys of a stage's record (what its starting file is)."""
    step, order = stage_cfg.get("init_gti_step"), stage_cfg.get("init_channels")
    if step is not None and (isinstance(step, bool) or step not in GTI_STEPS):
        raise ConfigError(f"step.init_gti_step={step!r} ({stage}): the GTI MDK's steps are 1 "
                          "(float), 2 (quantized weights), 3 (5-bit activations), 4 (gain-fused), "
                          "or null (its folder checkpoint/step<N>/ says)")
    if order is not None and order not in CHANNEL_ORDERS:
        raise ConfigError(f"step.init_channels={order!r} ({stage}): BGR (the GTI MDK's default "
                          "image_format) or RGB; a model trained on YUV cannot be converted")


def check_schedule(stage_cfg: DictConfig | dict, stage: str) -> tuple[Optional[int], float]:
    """(epochs or None for trainer.epochs, lr factor) of a stage's record, checked."""
    epochs, scale = stage_cfg.get("epochs"), stage_cfg.get("lr_scale", 1.0)
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise ConfigError(f"step.epochs={epochs!r} ({stage}) must be an integer >= 1, or null for "
                          "trainer.epochs")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ConfigError(f"step.lr_scale={scale!r} ({stage}) must be a number > 0")
    least = stage_cfg.get("min_iters")
    if least is not None and (isinstance(least, bool) or not isinstance(least, int) or least < 0):
        raise ConfigError(f"step.min_iters={least!r} ({stage}) must be an integer >= 0, or null")
    return epochs, float(scale)


def running_stages(cfg: DictConfig) -> list[str]:
    """The stages this command runs: ``pipeline``, or the one named by ``step``."""
    return [str(s) for s in cfg.pipeline] or [str(cfg.step.name)]


def check_stages(cfg: DictConfig, declared: list[str]) -> None:
    """Pipeline entries and ``stages.*`` overrides name ``declared`` stages, and ``step`` is well
    formed."""
    check_kind(cfg.step.kind, str(cfg.step.name))
    check_schedule(cfg.step, str(cfg.step.name))
    check_init(cfg.step, str(cfg.step.name))
    running = running_stages(cfg)
    extra = list(cfg.get("stages") or {})
    for s in cfg.pipeline:
        if s not in declared:
            raise ConfigError(f"pipeline entry {s!r} is not a stage; use some of {declared}")
    typed = _typed_stages(cfg)
    for s in extra:
        if s not in declared:
            raise ConfigError(f"stages.{s} is not a stage; use one of {', '.join(declared)}")
        if s not in running and (typed is None or s in typed):
            raise ConfigError(f"stages.{s}.* is set but {s} does not run in this command "
                              f"(stages: {', '.join(running)}); add it to pipeline=[...] or "
                              "drop the override")


def _typed_stages(cfg: DictConfig) -> Optional[set[str]]:
    """The stages a command-line ``stages.*`` override names (None: not known). A recipe's
    ``stages:`` may set stages that do not run; a typed override for one is a slip, an error."""
    task = OmegaConf.select(cfg, "hydra.overrides.task")  # a sweep job's own config
    if task is None and HydraConfig.initialized():
        task = HydraConfig.get().overrides.task
    if task is None:
        return None
    keys = [o.split("=", 1)[0].lstrip("+~") for o in task]
    return None if "stages" in keys else {k.split(".")[1] for k in keys if k.startswith("stages.")}
