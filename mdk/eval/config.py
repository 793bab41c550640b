"""The ``eval`` node's metric names and key checks; a leaf: config checks import it first."""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from mdk.checks import check_min, one_of

METRICS = ("voc07", "voc12", "coco")  # eval.metric: VOC2007 11-point, VOC2012 area, COCO rules
VOC_METRICS = METRICS[:2]             # the ones of the VOC devkit's rules (mdk/eval/voc_ap.py)
BOX_RULES = ("devkit", "continuous")  # eval.box_rule of voc07/voc12 (docs/pipeline.md, Evaluation)


def check_metric(metric: Any, allowed: tuple[str, ...] = METRICS) -> str:
    return one_of("eval.metric", metric, allowed)


def check_box_rule(rule: Any) -> str:
    return one_of("eval.box_rule", rule, BOX_RULES)


def check_eval(cfg: DictConfig) -> None:
    check_metric(cfg.eval.metric)
    check_box_rule(cfg.eval.box_rule)
    check_min(cfg, "eval.grid_images", 0)
