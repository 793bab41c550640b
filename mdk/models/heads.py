"""Heads: how the last chip layer's output grid is read as boxes, and how boxes become its targets.

The chip runs the conv layers only, so a head is a plain host object (no weights): ``channels``
(the output conv's width), ``encode`` (one image's boxes -> its target ``[S, S, D]``) and
``decode`` (outputs -> detections). Model, loss, dataset and evaluation read the same head. The
layouts, the anchor assignment and why anchor sizes are log-coded: docs/pipeline.md (Heads).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np
import torch

from mdk.models import yolo_codec
from mdk.models.scores import prior_channel, read_scores, readings
from mdk.checks import BadValue, integer, number


class YoloV1Head:
    """GNetDet's YOLOv1 layout ``[x, y, w, h, conf] * B + C`` per cell (mdk.models.yolo_codec).
    ``conf_scores`` / ``class_scores``: how those channels are read (``linear``, the GTI MDK's, or
    ``logistic``: yolo_codec.read_scores); the loss trains what the head reads."""

    kind = "yolov1"
    # A logistic confidence starts at this probability (RetinaNet's prior: most cells are empty).
    CONF_PRIOR = 0.02

    def __init__(self, num_classes: int, boxes_per_cell: int = 1, conf_scores: str = "linear",
                 class_scores: str = "linear", score_gain: float = 10.0,
                 class_region: float = 0.0) -> None:
        self.num_classes = integer("head.num_classes", num_classes, 1)
        self.boxes_per_cell = integer("head.boxes_per_cell", boxes_per_cell, 1)
        # the middle of an object's box whose cells learn its class too (0: its centre cell)
        self.class_region = number("head.class_region", class_region, 0.0, 1.0)
        self.readings = readings("head", conf_scores, class_scores, score_gain)

    @property
    def channels(self) -> int:
        return 5 * self.boxes_per_cell + self.num_classes

    def encode(self, boxes: torch.Tensor, labels: torch.Tensor, grid: int,
               image_size: float) -> torch.Tensor:
        return yolo_codec.encode_target(boxes, labels, grid, self.boxes_per_cell,
                                        self.num_classes, image_size, self.class_region)

    def decode(self, pred: torch.Tensor, image_size: float, conf_thresh: float = 0.01,
               nms_iou: float = 0.5, max_det: int = 100) -> list[dict]:
        return yolo_codec.decode(pred, image_size, conf_thresh, nms_iou, max_det,
                                 boxes_per_cell=self.boxes_per_cell, **self.readings)

    def output_bias(self) -> Optional[torch.Tensor]:
        """The output conv's starting bias: logistic scores start at their priors (a confidence
        of CONF_PRIOR, each class 1 / C: training does not begin by unlearning a guess), box
        centres mid-cell; None (zeros) with linear readings, as the GTI MDK starts."""
        r = self.readings
        if r["conf_scores"] == "linear" and r["class_scores"] == "linear":
            return None
        at = lambda p: prior_channel(p, r["score_gain"])  # noqa: E731
        bias = torch.zeros(self.channels)
        for k in range(self.boxes_per_cell):
            bias[5 * k:5 * k + 2] = 0.5
            if r["conf_scores"] == "logistic":
                bias[5 * k + 4] = at(self.CONF_PRIOR)
        if r["class_scores"] == "logistic" and self.num_classes > 1:
            bias[5 * self.boxes_per_cell:] = at(1 / self.num_classes)
        return bias

    def config(self) -> dict[str, Any]:
        """What rebuilds this head (saved with an exported chip model)."""
        out = {"_target_": f"{__name__}.YoloV1Head", "num_classes": self.num_classes,
               "boxes_per_cell": self.boxes_per_cell}
        if self.readings["conf_scores"] != "linear" or self.readings["class_scores"] != "linear":
            out.update(self.readings)
        if self.class_region:
            out["class_region"] = self.class_region
        return out


class AnchorHead:
    """Box priors per cell; per prior ``[x, y, w, h, conf, class scores...]``, every value trained
    towards [0, 1] (one 5-bit cap for all channels from step3 on)."""

    kind = "anchors"

    def __init__(self, num_classes: int, anchors: Sequence[Sequence[float]],
                 size_range: float = 6.0, match_ratio: float = 4.0,
                 neighbours: bool = False, conf_scores: str = "linear",
                 class_scores: str = "linear", score_gain: float = 10.0) -> None:
        self.num_classes = integer("head.num_classes", num_classes, 1)
        self.readings = readings("head", conf_scores, class_scores, score_gain)
        try:
            a = np.asarray(anchors, dtype=np.float64)
        except (TypeError, ValueError):
            a = np.zeros((0,))
        if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] != 2 or not (
                np.isfinite(a).all() and (a > 0).all() and (a <= 1).all()):
            raise BadValue.of("head.anchors", anchors, "must be a list of [width, height] pairs, "
                           "fractions of the image in (0, 1], e.g. [[0.1,0.1],[0.3,0.3]]")
        for key, v in (("size_range", size_range), ("match_ratio", match_ratio)):
            number(f"head.{key}", v, 1.0, low_open=True)
        self.anchors = a
        self.size_range, self.match_ratio = float(size_range), float(match_ratio)
        self.neighbours = bool(neighbours)
        self.boxes_per_cell = int(a.shape[0])
        self._log_range = math.log(self.size_range)
        self._anchor_t: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    @property
    def channels(self) -> int:
        return self.boxes_per_cell * (5 + self.num_classes)

    def config(self) -> dict[str, Any]:
        out = {"_target_": f"{__name__}.AnchorHead", "num_classes": self.num_classes,
               "anchors": self.anchors.tolist(), "size_range": self.size_range,
               "match_ratio": self.match_ratio, "neighbours": self.neighbours}
        if self.readings["conf_scores"] != "linear" or self.readings["class_scores"] != "linear":
            out.update(self.readings)
        return out

    def output_bias(self) -> Optional[torch.Tensor]:
        """As YoloV1Head's: logistic scores at their priors, and every prior's box at the prior
        itself (mid-cell, log-size code 0.5); None with linear readings."""
        r = self.readings
        if r["conf_scores"] == "linear" and r["class_scores"] == "linear":
            return None
        bias = torch.zeros(self.boxes_per_cell, 5 + self.num_classes)
        bias[:, :4] = 0.5
        if r["conf_scores"] == "logistic":
            bias[:, 4] = prior_channel(YoloV1Head.CONF_PRIOR, r["score_gain"])
        if r["class_scores"] == "logistic" and self.num_classes > 1:
            bias[:, 5:] = prior_channel(1 / self.num_classes, r["score_gain"])
        return bias.flatten()

    # --- the grid's values <-> boxes -------------------------------------------------------
    def _offset(self, t: torch.Tensor) -> torch.Tensor:
        """Encoded x/y in [0, 1] -> offset from the cell's corner, in cells."""
        return t * 2 - 0.5 if self.neighbours else t

    def _anchors(self, like: torch.Tensor) -> torch.Tensor:
        key = (str(like.device), like.dtype)
        if key not in self._anchor_t:
            self._anchor_t[key] = torch.as_tensor(self.anchors, dtype=like.dtype, device=like.device)
        return self._anchor_t[key]

    def boxes(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` ``[N, S, S, B, >=4]`` (encoded x, y, w, h) -> normalised xyxy ``[N, S, S, B, 4]``."""
        s = t.shape[1]
        idx = torch.arange(s, dtype=t.dtype, device=t.device)
        cx = (idx.view(1, 1, s, 1) + self._offset(t[..., 0])) / s
        cy = (idx.view(1, s, 1, 1) + self._offset(t[..., 1])) / s
        a = self._anchors(t)
        w = a[:, 0] * torch.exp((t[..., 2] * 2 - 1) * self._log_range)
        h = a[:, 1] * torch.exp((t[..., 3] * 2 - 1) * self._log_range)
        return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)

    def per_prior(self, grid_out: torch.Tensor) -> torch.Tensor:
        """Model output ``[N, B*(5+C), S, S]`` -> ``[N, S, S, B, 5+C]``."""
        n, _, s, _ = grid_out.shape
        return grid_out.permute(0, 2, 3, 1).reshape(n, s, s, self.boxes_per_cell,
                                                    5 + self.num_classes)

    def encode(self, boxes: torch.Tensor, labels: torch.Tensor, grid: int,
               image_size: float) -> torch.Tensor:
        """One image's boxes ``[K, 4]`` xyxy (pixels of an ``image_size`` square; 1 for
        normalised) and labels -> target ``[S, S, B*(5+C)]``, assigned as docs/pipeline.md (Heads)
        says; claims are sorted, so annotation order does not matter."""
        s, nb, c = int(grid), self.boxes_per_cell, self.num_classes
        target = np.zeros((s, s, nb, 5 + c), dtype=np.float32)
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4) / float(image_size)
        lab = np.asarray(labels, dtype=np.int64).reshape(-1)
        if b.shape[0] != lab.shape[0]:
            raise ValueError(f"encode: {b.shape[0]} boxes but {lab.shape[0]} labels")
        if lab.size and (lab.min() < 0 or lab.max() >= c):
            raise ValueError(f"encode: labels {lab.tolist()} outside 0..{c - 1}")
        wh = np.clip(b[:, 2:] - b[:, :2], 1e-6, 1.0)
        centre = np.clip((b[:, :2] + b[:, 2:]) / 2, 0, 1 - 1e-6) * s
        # shape ratio of each object to each prior (1 = same shape), [K, B]
        r = wh[:, None, :] / self.anchors[None]
        ratio = np.maximum(r, 1 / r).max(-1)
        claims = []  # (priority..., k, row, col, prior)
        for k in range(b.shape[0]):
            priors = np.flatnonzero(ratio[k] < self.match_ratio)
            if priors.size == 0:
                priors = np.array([int(ratio[k].argmin())])
            col, row = int(centre[k, 0]), int(centre[k, 1])
            cells = [(row, col, 1)]
            if self.neighbours:
                fx, fy = centre[k, 0] - col, centre[k, 1] - row
                nx = col - 1 if fx < 0.5 else col + 1
                ny = row - 1 if fy < 0.5 else row + 1
                if 0 <= nx < s:
                    cells.append((row, nx, 0))
                if 0 <= ny < s:
                    cells.append((ny, col, 0))
            claims += [(centre_cell, -ratio[k, p], -k, k, rr, cc, p)
                       for rr, cc, centre_cell in cells for p in priors.tolist()]
        for centre_cell, _, _, k, rr, cc, p in sorted(claims):  # best claim written last
            ox, oy = centre[k, 0] - cc, centre[k, 1] - rr
            if self.neighbours:
                ox, oy = (ox + 0.5) / 2, (oy + 0.5) / 2
            tw, th = (np.log(wh[k] / self.anchors[p]) / self._log_range + 1) / 2
            cell = target[rr, cc, p]
            cell[:5] = (ox, oy, min(max(tw, 0.0), 1.0), min(max(th, 0.0), 1.0), 1.0)
            cell[5:] = 0
            cell[5 + lab[k]] = 1
        return torch.from_numpy(target.reshape(s, s, nb * (5 + c)))

    @torch.no_grad()
    def decode(self, pred: torch.Tensor, image_size: float, conf_thresh: float = 0.01,
               nms_iou: float = 0.5, max_det: int = 100) -> list[dict]:
        """Outputs ``[N, B*(5+C), S, S]`` -> per image ``{"boxes" [K, 4] xyxy pixels, "scores"
        [K], "labels" [K]}``, ``score = conf x best class score``, after per-class NMS."""
        n, ch, s, s2 = pred.shape
        if s != s2 or ch != self.channels:
            raise ValueError(f"decode: expected [N, {self.channels}, S, S] for {self.boxes_per_cell} "
                             f"priors and {self.num_classes} classes, got {list(pred.shape)}")
        p = self.per_prior(pred.float())
        xyxy = (self.boxes(p) * image_size).clamp(0, image_size).reshape(n, -1, 4)
        r = self.readings
        best, cls = p[..., 5:].max(-1)  # a monotone reading: the best stays best
        cls_score = read_scores(best, r["class_scores"], r["score_gain"])
        scores = (read_scores(p[..., 4], r["conf_scores"], r["score_gain"])
                  * cls_score).reshape(n, -1)
        return yolo_codec.nms(xyxy, scores, cls.reshape(n, -1), conf_thresh, nms_iou, max_det)
