"""The ``eval`` node's metric names and key checks; a leaf: config checks import it first."""
from __future__ import annotations

from omegaconf import DictConfig

from mdk.checks import check_min, check_one_of

METRICS = ("voc07", "voc12", "coco")  # eval.metric: VOC2007 11-point, VOC2012 area, COCO rules
# eval.box_rule, for voc07/voc12: devkit = each image's original pixels with the devkit's +1 on
# widths and heights (the published VOC numbers); continuous = the model-input frame, no +1.
BOX_RULES = ("devkit", "continuous")


def check_eval(cfg: DictConfig) -> None:
    check_one_of(cfg, "eval.metric", METRICS)
    check_one_of(cfg, "eval.box_rule", BOX_RULES)
    check_min(cfg, "eval.grid_images", 0)
