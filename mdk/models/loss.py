"""YOLOv1-style GNetDet loss with smooth-L1 terms (``loss=default``; ``loss=gti`` is
:mod:`mdk.models.gti_loss`); terms and weights: docs/gti-compat.md (10. Loss).

Every term is summed within an image and averaged over the local batch; DDP averages over ranks,
so with equal per-rank batches the gradient does not depend on the split. ``ignore_iou`` (YOLOv3's
ignore rule): without it two slots predicting the same box are told "1" and "0" by turns and
their confidences can settle at ~0.5.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mdk.checks import integer, number
from mdk.models.config import check_beta, check_ignore_iou, check_weights
from mdk.models.scores import readings, score_loss
from mdk.models.yolo_codec import cell_xyxy


def slot_iou(pb: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """IoU of each box slot ``pb`` [N, S, S, B, >=4] with its cell's target box ``t[..., :4]``
    -> [N, S, S, B] (box_iou's diagonal without N^2 memory)."""
    a, b = cell_xyxy(pb), cell_xyxy(t[..., None, :4])
    lt = torch.maximum(a[..., :2], b[..., :2])
    rb = torch.minimum(a[..., 2:], b[..., 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = lambda x: (x[..., 2:] - x[..., :2]).clamp(min=0).prod(-1)  # noqa: E731
    return inter / (area(a) + area(b) - inter).clamp(min=1e-9)


class YoloLoss(nn.Module):
    """Terms ``coord`` (x, y, w, h of the responsible box), ``conf_obj`` (its confidence -> 1),
    ``conf_noobj`` (every other box slot -> 0), ``cls`` (class scores of object cells), ``total``."""

    head_kind = "yolov1"  # reads mdk.models.heads.YoloV1Head's layout

    def __init__(self, num_classes: int, boxes_per_cell: int = 2, lambda_coord: float = 5.0,
                 lambda_noobj: float = 0.5, beta: float = 1.0, lambda_obj: float = 1.0,
                 lambda_cls: float = 1.0, ignore_iou: float | None = 0.5,
                 conf_scores: str = "linear", class_scores: str = "linear",
                 score_gain: float = 10.0, label_smoothing: float = 0.0) -> None:
        super().__init__()
        integer("loss.num_classes", num_classes, 1)
        integer("loss.boxes_per_cell", boxes_per_cell, 1)
        check_weights(lambda_coord=lambda_coord, lambda_noobj=lambda_noobj, lambda_obj=lambda_obj,
                      lambda_cls=lambda_cls)
        check_beta(beta)
        self.ignore_iou = check_ignore_iou(ignore_iou)
        self.C, self.B = num_classes, boxes_per_cell
        self.lambda_coord, self.lambda_noobj, self.beta = lambda_coord, lambda_noobj, beta
        self.lambda_obj, self.lambda_cls = lambda_obj, lambda_cls
        # How the head reads the confidence and class channels (mdk.models.yolo_codec.read_scores):
        # linear ones regress to 0/1 with smooth-L1, logistic ones by binary cross-entropy on
        # gain * (x - 0.5), whose gradient does not fade while a class is still a guess.
        self.readings = readings("loss", conf_scores, class_scores, score_gain)
        self.gain = float(score_gain)
        # class targets 1 - eps/2 and eps/2 (YOLOv5's smooth_BCE): no class is driven to certainty
        self.eps = number("loss.label_smoothing", label_smoothing, 0.0, 1.0, low_open=False)

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """pred [N, 5B+C, S, S]; target [N, S, S, 5B+C] -> dict of loss terms and 'total'."""
        N, S = pred.shape[0], pred.shape[-1]
        # float32 at least (AMP), float64 kept: casting down would make splits differ
        dt = torch.float64 if pred.dtype == torch.float64 else torch.float32
        p = pred.permute(0, 2, 3, 1).to(dt)
        t = target.to(dt)
        B = self.B
        pb = p[..., : 5 * B].reshape(N, S, S, B, 5)
        tb = t[..., :5].unsqueeze(3)  # the target box is replicated in every slot; take slot 0
        obj = t[..., 4] > 0  # [N, S, S]

        # Which predicted box is responsible: highest IoU with the target (no gradient through it).
        with torch.no_grad():
            iou = slot_iou(pb, t)
            best = iou.argmax(-1, keepdim=True)
            resp = torch.zeros_like(iou, dtype=torch.bool).scatter_(-1, best, True) & obj.unsqueeze(-1)

        sl1 = lambda a, b: F.smooth_l1_loss(a, b, reduction="none", beta=self.beta)  # noqa: E731
        coord = (sl1(pb[..., :4], tb[..., :4].expand_as(pb[..., :4])).sum(-1) * resp).sum((1, 2, 3))
        # Responsible boxes regress confidence to 1 (not to the IoU, as YOLOv1 does): early IoUs
        # are ~0, and an IoU target then teaches "no object" everywhere for many epochs.
        noobj = ~resp
        if self.ignore_iou is not None:  # a good box beside the responsible one: no target
            noobj = noobj & ~((iou > self.ignore_iou) & obj.unsqueeze(-1))
        conf_obj = (self._score_loss(pb[..., 4], torch.ones_like(iou), "conf_scores")
                    * resp).sum((1, 2, 3))
        conf_noobj = (self._score_loss(pb[..., 4], torch.zeros_like(iou), "conf_scores")
                      * noobj).sum((1, 2, 3))
        tc = t[..., 5 * B:]
        if self.eps:
            tc = tc * (1 - self.eps) + self.eps / 2
        # the cells with a class target: the objects' (and with head.class_region, their middles')
        has_cls = t[..., 5 * B:].amax(-1) > 0
        cls = (self._score_loss(p[..., 5 * B:], tc, "class_scores").sum(-1) * has_cls).sum((1, 2))
        terms = {
            "coord": self.lambda_coord * coord.mean(),
            "conf_obj": self.lambda_obj * conf_obj.mean(),
            "conf_noobj": self.lambda_noobj * conf_noobj.mean(),
            "cls": self.lambda_cls * cls.mean(),
        }
        terms["total"] = sum(terms.values())
        return terms

    def _score_loss(self, x: torch.Tensor, target: torch.Tensor, which: str) -> torch.Tensor:
        return score_loss(x, target, self.readings[which], self.gain, self.beta)
