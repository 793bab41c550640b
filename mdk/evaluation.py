"""mAP@0.5 on a dataset split, exact under DDP.

Each rank predicts its no-padding shard (ShardSampler); detections are gathered to every rank,
keyed by image index, and the metric is computed once over the union — so W processes report
exactly the single-process number whatever the split size.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from torch.utils.data import DataLoader

from mdk import dist
from mdk.data.samplers import ShardSampler
from mdk.models.yolo_codec import decode

log = logging.getLogger(__name__)


@torch.no_grad()
def predict(model: torch.nn.Module, dataset: Any, batch_size: int, device: torch.device,
            conf_thresh: float, nms_iou: float, limit_batches: int | None = None,
            num_workers: int = 0, loss_fn: Any = None, progress: bool = False
            ) -> tuple[dict[int, dict], float, int]:
    """Detections of this rank's shard: ({index: det}, summed loss, number of images)."""
    limit = limit_batches * batch_size * dist.world_size() if limit_batches else None
    sampler = ShardSampler(len(dataset), dist.get_rank(), dist.world_size(), limit)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers)
    was_training = model.training
    model.eval()
    out: dict[int, dict] = {}
    loss_sum, count = 0.0, 0
    bar = loader
    if progress and dist.is_main_process():
        from tqdm import tqdm
        bar = tqdm(loader, desc="eval", leave=False, dynamic_ncols=True)
    for images, targets, idx in bar:
        pred = model(images.to(device, non_blocking=True))
        if loss_fn is not None:
            loss_sum += float(loss_fn(pred, targets.to(device))["total"]) * len(idx)
        count += len(idx)
        dets = decode(pred.cpu(), dataset.image_size, conf_thresh, nms_iou,
                      boxes_per_cell=dataset.boxes_per_cell)
        for i, d in zip(idx.tolist(), dets):
            out[i] = d
    model.train(was_training)
    return out, loss_sum, count


def map50(dataset: Any, detections: dict[int, dict]) -> dict[str, float]:
    # Imported here: torchmetrics' detection module costs ~2 s of startup (it pulls in scipy).
    from torchmetrics.detection import MeanAveragePrecision

    metric = MeanAveragePrecision(iou_type="bbox", iou_thresholds=[0.5], class_metrics=False)
    preds, gts = [], []
    for i in sorted(detections):
        boxes, labels, difficult = dataset.gt(i)
        preds.append(detections[i])
        # VOC 'difficult' objects neither count as misses nor as false positives: COCO's crowd flag.
        gts.append({"boxes": boxes.float(), "labels": labels.long(), "iscrowd": difficult.long()})
    metric.update(preds, gts)
    r = metric.compute()
    return {"map50": float(r["map_50"]), "images": len(detections)}


def evaluate(model: torch.nn.Module, dataset: Any, batch_size: int, device: torch.device,
             conf_thresh: float = 0.01, nms_iou: float = 0.5, limit_batches: int | None = None,
             num_workers: int = 0, loss_fn: Any = None, progress: bool = False) -> dict[str, float]:
    """mAP@0.5 (and mean loss if ``loss_fn``) over the split; identical on every rank."""
    local, loss_sum, count = predict(model, dataset, batch_size, device, conf_thresh, nms_iou,
                                     limit_batches, num_workers, loss_fn, progress)
    parts = dist.all_gather_object((local, loss_sum, count))
    merged: dict[int, dict] = {}
    for part in parts:
        merged.update(part[0])
    total_loss = sum(p[1] for p in parts)
    total_count = sum(p[2] for p in parts)
    res = map50(dataset, merged)
    if loss_fn is not None and total_count:
        res["loss"] = total_loss / total_count
    return res
