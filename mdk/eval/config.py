"""The ``eval`` node (conf/config.yaml): the metric names and the checks of its keys. A leaf:
the config checks read it before anything else is imported."""
from __future__ import annotations

from omegaconf import DictConfig

from mdk.checks import check_min, check_one_of

METRICS = ("voc07", "voc12", "coco")  # eval.metric: VOC2007 11-point, VOC2012 area, COCO rules


def check_eval(cfg: DictConfig) -> None:
    check_one_of(cfg, "eval.metric", METRICS)
    check_min(cfg, "eval.grid_images", 0)
