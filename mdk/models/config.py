"""The ``model`` and ``loss`` config groups: their schemas and checks. Torch-free: the schemas
load before Hydra composes; the checks import torch when they run.

A model or loss of your own is a YAML in conf/model/ or conf/loss/ naming its class; it may use
these schemas (``defaults: [/_schema_model_gnetdet@_here_, _self_]``) or none.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig

from mdk.checks import check_min, number
from mdk.targets import build
from mdk.errors import ConfigError, UserError


@dataclass
class GNetDetConf:
    _target_: str = "mdk.models.gnetdet.GNetDet"
    num_classes: int = MISSING
    image_size: int = MISSING
    channels: list[Any] = MISSING      # conv widths, and M for a 2x2 max-pool
    mask_bits: list[int] = MISSING     # one chip mask width per conv layer
    boxes_per_cell: int = 2
    batch_norm: bool = False
    head: Any = None                   # how the output grid is read: ${head} (conf/head/)


@dataclass
class ModelConf:
    name: str = MISSING
    image_size: int = MISSING
    freeze: list[str] = field(default_factory=list)  # fnmatch patterns of frozen parameters
    freeze_epochs: Optional[int] = None  # they train from this epoch of a stage on (null: never)
    net: GNetDetConf = field(default_factory=GNetDetConf)


@dataclass
class YoloLossConf:
    _target_: str = "mdk.models.loss.YoloLoss"
    num_classes: int = MISSING
    boxes_per_cell: int = MISSING
    lambda_coord: float = 5.0
    lambda_obj: float = 1.0
    lambda_noobj: float = 0.5
    lambda_cls: float = 1.0
    beta: float = 1.0
    ignore_iou: Optional[float] = 0.5
    conf_scores: str = "linear"        # linear (smooth-L1 to 0/1) | logistic (binary cross-entropy)
    class_scores: str = "linear"
    score_gain: float = 10.0
    label_smoothing: float = 0.0       # class targets 1 - eps/2 and eps/2


@dataclass
class GtiLossConf:
    _target_: str = "mdk.models.gti_loss.GtiLoss"
    num_classes: int = MISSING
    boxes_per_cell: int = MISSING
    lambda_coord: float = 5.0
    lambda_contain: float = 2.0
    lambda_not_contain: float = 1.0
    lambda_noobj: float = 0.005
    lambda_cls: float = 1.0
    beta: float = 1.0
    iou_target_grad: bool = True
    normalizer: str = "running"
    normalizer_init: float = 6.25
    normalizer_momentum: float = 0.9


@dataclass
class AnchorLossConf:
    _target_: str = "mdk.models.anchor_loss.AnchorLoss"
    head: Any = MISSING                # ${head}: the box priors the loss decodes with
    lambda_box: float = 5.0
    lambda_obj: float = 1.0
    lambda_noobj: float = 0.5
    lambda_cls: float = 1.0
    beta: float = 1.0
    ignore_iou: Optional[float] = 0.5
    conf_scores: str = "linear"
    class_scores: str = "linear"
    score_gain: float = 10.0


@dataclass
class YoloV1HeadConf:
    _target_: str = "mdk.models.heads.YoloV1Head"
    num_classes: int = MISSING
    boxes_per_cell: int = MISSING
    conf_scores: str = "linear"        # what the loss trains: ${oc.select:loss.conf_scores,linear}
    class_scores: str = "linear"
    score_gain: float = 10.0
    class_region: float = 0.0          # the middle of a box whose cells learn its class too


@dataclass
class AnchorHeadConf:
    _target_: str = "mdk.models.heads.AnchorHead"
    num_classes: int = MISSING
    anchors: list[list[float]] = MISSING   # [width, height] per prior, fractions of the image
    size_range: float = 6.0
    match_ratio: float = 4.0
    neighbours: bool = False
    conf_scores: str = "linear"            # what the loss trains (${oc.select:loss.conf_scores})
    class_scores: str = "linear"
    score_gain: float = 10.0


def check_weights(**weights: float) -> None:
    """The loss classes' term weights: each ``loss.<key>`` a finite number >= 0."""
    for key, v in weights.items():
        number(f"loss.{key}", v, 0.0, what="a finite number")


def check_beta(beta: float) -> None:
    number("loss.beta", beta, 0.0, low_open=True, more=" (the smooth-L1 threshold)")


def check_ignore_iou(ignore_iou: float | None) -> float | None:
    if ignore_iou is None:
        return None
    return number("loss.ignore_iou", ignore_iou, 0.0, 1.0, what="an IoU", more=" or null")


MODEL_SCHEMAS: dict[str, type] = {"gnetdet": ModelConf}
LOSS_SCHEMAS: dict[str, type] = {"yolo": YoloLossConf, "gti": GtiLossConf,
                                 "anchors": AnchorLossConf}
HEAD_SCHEMAS: dict[str, type] = {"yolov1": YoloV1HeadConf, "anchors": AnchorHeadConf}


def check_model(cfg: DictConfig) -> None:
    """Build the model on the meta device, so a value its class refuses is one line before any
    stage."""
    check_min(cfg, "model.image_size", 32)
    n = cfg.model.get("freeze_epochs")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"model.freeze_epochs={n!r} must be an integer >= 1 (the epochs the "
                              "layers of model.freeze stay frozen), or null (frozen throughout)")
        if not cfg.model.get("freeze"):
            raise ConfigError(f"model.freeze_epochs={n} but model.freeze is empty: name the "
                              "layers to freeze first, e.g. 'model.freeze=[layers.0.*,layers.1.*]'")
    import torch  # here: this module must load torch-free

    try:
        with torch.device("meta"):
            build(cfg.model.net, "model.net")
    except Exception as e:  # not a bad value (e.g. a model that cannot be built on the meta
        if isinstance(e, UserError):  # device): the run's build_model raises it with its traceback
            raise


def check_loss(cfg: DictConfig) -> None:
    """Build the loss before any data, so a bad weight is one config line, not a Hydra error."""
    if cfg.get("loss") is None:
        return
    loss = build(cfg.loss, "loss")  # a few floats and a buffer: no data, no device
    head = cfg.model.net.get("head")
    wants = getattr(loss, "head_kind", None)
    if head is not None and wants is not None:
        built = build(head, "head")
        has = getattr(built, "kind", None)
        if has is not None and has != wants:
            raise ConfigError(f"loss={cfg.loss._target_.rsplit('.', 1)[-1]} reads the {wants} "
                              f"head's output but head is {has}; choose head={wants}, or a loss "
                              f"of the {has} head (head=anchors: loss=anchors)")
        trained, read = getattr(loss, "readings", None), getattr(built, "readings", None)
        if trained is not None and read is not None:
            logistic = "logistic" in (trained["conf_scores"], trained["class_scores"])
            for key in [k for k in trained if trained[k] != read.get(k)
                        and (logistic or k != "score_gain")]:
                fix = (f"set loss.{key} (the head follows it)" if key in cfg.loss else
                       f"leave head.{key} at its default (it follows the loss)")
                raise ConfigError(f"head.{key}={read.get(key)!r} but the loss trains "
                                  f"{trained[key]!r} scores; {fix}")
