"""The loss of ``head=anchors`` (mdk.models.heads.AnchorHead): ``loss=anchors``; its terms:
docs/pipeline.md (Heads). Each is summed within an image and averaged over the images of the
batch (split-invariant under DDP, like mdk.models.loss).

The box term is smooth-L1 on the encoded box (offsets and log-sizes in [0, 1]): scale-free, so a
small box counts as much as a large one (``1 - GIoU`` learnt far slower, docs/experiments.md).
Confidences and class scores are regressed with smooth-L1 towards 0/1 (linear readings), or
trained by binary cross-entropy on ``gain * (x - 0.5)`` (logistic readings, mdk.models.scores):
the chip's output is linear, then 5-bit, so the sigmoid is applied on the host.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import box_iou

from mdk.models.heads import AnchorHead
from mdk.models.config import check_beta, check_ignore_iou, check_weights
from mdk.models.scores import readings, score_loss


class AnchorLoss(nn.Module):
    head_kind = "anchors"

    def __init__(self, head: AnchorHead, lambda_box: float = 5.0, lambda_obj: float = 1.0,
                 lambda_noobj: float = 0.5, lambda_cls: float = 1.0, beta: float = 1.0,
                 ignore_iou: Optional[float] = 0.5, conf_scores: str = "linear",
                 class_scores: str = "linear", score_gain: float = 10.0) -> None:
        super().__init__()
        if not isinstance(head, AnchorHead):
            raise ValueError(f"loss.head: loss=anchors reads the box priors of head=anchors, but "
                             f"the head is {getattr(head, 'kind', type(head).__name__)}; use "
                             "head=anchors (it selects loss=anchors), or loss=default with "
                             "head=yolov1")
        check_weights(lambda_box=lambda_box, lambda_obj=lambda_obj, lambda_noobj=lambda_noobj,
                      lambda_cls=lambda_cls)
        check_beta(beta)
        self.head = head
        self.lambda_box, self.lambda_obj = lambda_box, lambda_obj
        self.lambda_noobj, self.lambda_cls, self.beta = lambda_noobj, lambda_cls, beta
        self.ignore_iou = check_ignore_iou(ignore_iou)
        # how the confidence and class channels are trained (mdk.models.scores); the head reads
        # them the same way (check_loss refuses a head that reads them otherwise)
        self.readings = readings("loss", conf_scores, class_scores, score_gain)

    def _score(self, x: torch.Tensor, target: torch.Tensor, which: str) -> torch.Tensor:
        r = self.readings
        return score_loss(x, target, r[which], r["score_gain"], self.beta)

    def _ignored(self, pbox: torch.Tensor, tbox: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """[N, S, S, B] True where a prior's box overlaps one of its image's objects by more
        than ignore_iou."""
        out = torch.zeros_like(pos)
        for i in range(pos.shape[0]):
            objects = tbox[i][pos[i]]
            if objects.numel():
                best = box_iou(pbox[i].reshape(-1, 4), objects).max(1).values
                out[i] = (best > self.ignore_iou).view(pos.shape[1:])
        return out

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """pred ``[N, B*(5+C), S, S]``; target ``[N, S, S, B*(5+C)]`` -> loss terms and 'total'."""
        dt = torch.float64 if pred.dtype == torch.float64 else torch.float32
        p = self.head.per_prior(pred.to(dt))
        t = target.to(dt).reshape(p.shape)
        pos = t[..., 4] > 0
        sl1 = lambda a, b: F.smooth_l1_loss(a, b, reduction="none", beta=self.beta)  # noqa: E731
        box = (sl1(p[..., :4], t[..., :4]).sum(-1) * pos).sum((1, 2, 3))
        conf = p[..., 4]
        conf_obj = (self._score(conf, torch.ones_like(conf), "conf_scores") * pos).sum((1, 2, 3))
        noobj = ~pos
        if self.ignore_iou is not None:
            with torch.no_grad():
                noobj = noobj & ~self._ignored(self.head.boxes(p), self.head.boxes(t), pos)
        conf_noobj = (self._score(conf, torch.zeros_like(conf), "conf_scores")
                      * noobj).sum((1, 2, 3))
        cls = (self._score(p[..., 5:], t[..., 5:], "class_scores").sum(-1) * pos).sum((1, 2, 3))
        terms = {"box": self.lambda_box * box.mean(),
                 "conf_obj": self.lambda_obj * conf_obj.mean(),
                 "conf_noobj": self.lambda_noobj * conf_noobj.mean(),
                 "cls": self.lambda_cls * cls.mean()}
        terms["total"] = sum(terms.values())
        return terms
