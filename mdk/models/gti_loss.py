"""The GTI GNetDet MDK's detection loss (``loss=gti``), with mdk's split-invariant normalisation.

Terms and weights as the GTI MDK's ``GNetDetLoss`` computes them (smooth-L1, summed): ``loc`` (x,
y, ``sqrt(w), sqrt(h)`` of the responsible box), ``contain`` (its confidence -> its IoU, with
gradient), ``not_contain`` (the other slots of object cells -> 0), ``noobj`` (cells without an
object -> 0), ``cls``. Every term is divided by ``nu``, a running count of objects per image over
the global batch. How ``nu`` maps GTI's running count of objects per batch, where it is
split-invariant, and the signed ``sqrt``: docs/gti-compat.md (10. Loss).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mdk import dist
from mdk.checks import integer, number, one_of
from mdk.models.config import check_beta, check_weights
from mdk.models.loss import slot_iou

NORMALIZERS = ("running", "fixed")
PRED_EPS = 1e-8  # added to every prediction, as the GTI MDK does


def signed_sqrt(v: torch.Tensor, eps: float = PRED_EPS) -> torch.Tensor:
    """``sqrt(v + eps)`` for v >= 0 (the GTI form), ``-sqrt(|v| + eps)`` below, so a negative
    width still gets a finite gradient."""
    pos = v >= 0
    # where, not abs: at v == 0 the slope is GTI's 1 / (2 sqrt(eps)), not abs's 0
    return torch.sqrt(torch.where(pos, v, -v) + eps) * torch.where(pos, 1.0, -1.0).to(v.dtype)


class GtiLoss(nn.Module):
    """GTI GNetDetLoss terms and weights; returns ``loc, contain, not_contain, noobj, cls, total``."""

    head_kind = "yolov1"  # reads mdk.models.heads.YoloV1Head's layout
    # ... with the GTI MDK's linear confidence and class scores (mdk.models.yolo_codec.read_scores)
    readings = {"conf_scores": "linear", "class_scores": "linear", "score_gain": 10.0}

    def __init__(self, num_classes: int, boxes_per_cell: int = 2, lambda_coord: float = 5.0,
                 lambda_contain: float = 2.0, lambda_not_contain: float = 1.0,
                 lambda_noobj: float = 0.005, lambda_cls: float = 1.0, beta: float = 1.0,
                 iou_target_grad: bool = True, normalizer: str = "running",
                 normalizer_init: float = 6.25, normalizer_momentum: float = 0.9) -> None:
        super().__init__()
        integer("loss.num_classes", num_classes, 1)
        integer("loss.boxes_per_cell", boxes_per_cell, 1)
        check_weights(lambda_coord=lambda_coord, lambda_contain=lambda_contain,
                      lambda_not_contain=lambda_not_contain, lambda_noobj=lambda_noobj,
                      lambda_cls=lambda_cls)
        check_beta(beta)
        one_of("loss.normalizer", normalizer, tuple(NORMALIZERS))
        number("loss.normalizer_init", normalizer_init, 0.0, low_open=True,
               more=" (objects per image)")
        number("loss.normalizer_momentum", normalizer_momentum, 0.0, 1.0)
        self.C, self.B = num_classes, boxes_per_cell
        self.lambda_coord, self.lambda_contain = float(lambda_coord), float(lambda_contain)
        self.lambda_not_contain, self.lambda_noobj = float(lambda_not_contain), float(lambda_noobj)
        self.lambda_cls, self.beta = float(lambda_cls), float(beta)
        self.iou_target_grad = bool(iou_target_grad)
        self.normalizer, self.momentum = normalizer, float(normalizer_momentum)
        # float64: the average of a count, like the GTI MDK's Python float.
        self.register_buffer("nu", torch.tensor(float(normalizer_init), dtype=torch.float64))

    def _update_nu(self, obj: torch.Tensor) -> torch.Tensor:
        if self.nu.device != obj.device:
            self.nu = self.nu.to(obj.device)
        if self.normalizer == "running" and torch.is_grad_enabled():
            with torch.no_grad():
                counts = torch.stack([obj.sum(dtype=torch.float64),
                                      torch.full((), float(obj.shape[0]), dtype=torch.float64,
                                                 device=obj.device)])
                dist.all_reduce_sum(counts)  # the global batch's objects and images
                per_image = counts[0].clamp(min=1) / counts[1]
                self.nu.mul_(self.momentum).add_((1 - self.momentum) * per_image)
        return self.nu

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """pred [N, 5B+C, S, S]; target [N, S, S, 5B+C] -> dict of loss terms and 'total'."""
        N, S, B = pred.shape[0], pred.shape[-1], self.B
        dt = torch.float64 if pred.dtype == torch.float64 else torch.float32
        p = pred.permute(0, 2, 3, 1).to(dt) + PRED_EPS
        t = target.to(dt)
        pb = p[..., : 5 * B].reshape(N, S, S, B, 5)
        tb = t[..., :5]  # the target box is replicated in every slot; take slot 0
        obj = t[..., 4] > 0  # [N, S, S]

        # IoU of each predicted box with its cell's target (with gradient, as in the GTI MDK).
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.iou_target_grad):
            iou = slot_iou(pb, t)
        best = iou.detach().max(-1, keepdim=True).indices  # ties: the first slot, as torch.max
        resp = torch.zeros(iou.shape, dtype=torch.bool, device=iou.device).scatter_(-1, best, True)
        resp &= obj.unsqueeze(-1)
        other = obj.unsqueeze(-1) & ~resp
        empty = ~obj.unsqueeze(-1).expand_as(resp)

        sl1 = lambda a, b: F.smooth_l1_loss(a, b, reduction="none", beta=self.beta)  # noqa: E731
        conf = pb[..., 4]
        to_zero = sl1(conf, torch.zeros_like(conf))
        per_image = {  # weight, per-slot values
            "loc": (self.lambda_coord,
                    (sl1(pb[..., :2], tb[..., None, :2].expand_as(pb[..., :2])).sum(-1)
                     + sl1(signed_sqrt(pb[..., 2:4]),
                           tb[..., None, 2:4].sqrt().expand_as(pb[..., 2:4])).sum(-1)) * resp),
            "contain": (self.lambda_contain, sl1(conf, iou) * resp),
            "not_contain": (self.lambda_not_contain, to_zero * other),
            "noobj": (self.lambda_noobj, to_zero * empty),
            "cls": (self.lambda_cls,
                    sl1(p[..., 5 * B:], t[..., 5 * B:]).sum(-1, keepdim=True) * obj.unsqueeze(-1)),
        }
        nu = self._update_nu(obj).to(dt)
        terms = {k: w * v.sum((1, 2, 3)).mean() / nu for k, (w, v) in per_image.items()}
        terms["total"] = sum(terms.values())
        return terms
