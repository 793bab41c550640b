"""Scoring one model on a fixed set of images in this process alone: (mAP, loss).

No collective, so each rank scores its own models and a number does not depend on how the work
was split (the same model and batches give the same bits on any rank).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from mdk.engine.build import build_loss
from mdk.eval.distributed import evaluate


@dataclass(frozen=True)
class Score:
    """mAP@0.5 of the run's ``eval.metric`` and the mean training loss, on one image set."""
    map: float
    loss: float
    metric: str = field(default="", compare=False)  # the metric's name, e.g. VOC07 11-point

    def numbers(self) -> dict[str, float]:
        return {"map": self.map, "loss": self.loss}


class FirstImages:
    """The first ``n`` images of ``dataset`` (other attributes read through to it)."""

    def __init__(self, dataset: Any, n: int) -> None:
        self.dataset, self.n = dataset, min(int(n), len(dataset))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.dataset[i]

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not set yet (a copy being unpickled): no endless lookup
            raise AttributeError(name)
        return getattr(self.dataset, name)


@dataclass
class EvalSet:
    """Images and how to score a model on them, as the run's config says."""
    dataset: Any
    batch_size: int
    device: torch.device
    loss_fn: nn.Module
    conf_thresh: float = 0.01
    nms_iou: float = 0.5
    metric: str = "voc07"
    box_rule: str = "devkit"

    @classmethod
    def from_config(cls, cfg: DictConfig, dataset: Any, device: torch.device,
                    images: int | None = None) -> "EvalSet":
        """``dataset`` (its first ``images`` images when given) scored as ``cfg`` says."""
        ds = FirstImages(dataset, images) if images is not None else dataset
        return cls(ds, int(cfg.trainer.batch_size), device, build_loss(cfg).to(device),
                   float(cfg.trainer.conf_thresh), float(cfg.trainer.nms_iou),
                   str(cfg.eval.metric), str(cfg.eval.box_rule))

    @property
    def images(self) -> int:
        return len(self.dataset)


@torch.no_grad()
def score(model: nn.Module, data: EvalSet) -> Score:
    """``model`` (in whatever mode its layers are) on ``data``, in this process alone."""
    res = evaluate(model, data.dataset, data.batch_size, data.device, data.conf_thresh,
                   data.nms_iou, loss_fn=data.loss_fn, metric=data.metric, box_rule=data.box_rule)
    return Score(float(res["map50"]), float(res.get("loss", float("nan"))), str(res["metric"]))
