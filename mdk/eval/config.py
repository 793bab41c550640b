"""The ``eval`` node's metric names and key checks; a leaf: config checks import it first."""
from __future__ import annotations

from omegaconf import DictConfig

from mdk.checks import check_min, check_one_of

METRICS = ("voc07", "voc12", "coco")  # eval.metric: VOC2007 11-point, VOC2012 area, COCO rules
BOX_RULES = ("devkit", "continuous")  # eval.box_rule of voc07/voc12 (docs/pipeline.md, Evaluation)


def check_eval(cfg: DictConfig) -> None:
    check_one_of(cfg, "eval.metric", METRICS)
    check_one_of(cfg, "eval.box_rule", BOX_RULES)
    check_min(cfg, "eval.grid_images", 0)
