"""Evaluate a model on a dataset split, exact under DDP: each rank predicts its no-padding shard and
the metric is computed once over the gathered union (docs/pipeline.md, Evaluation)."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch.utils.data import DataLoader

from mdk import dist
from mdk.data.samplers import ShardSampler
from mdk.eval.metrics import evaluate_dataset
from mdk.progress import progress_bar
from mdk.world import World


@torch.no_grad()
def predict(model: torch.nn.Module, dataset: Any, batch_size: int, device: torch.device,
            conf_thresh: float, nms_iou: float, limit_batches: int | None = None,
            loss_fn: Any = None, progress: Any = False, world: Optional[World] = None
            ) -> tuple[dict[int, dict], float, int]:
    """Detections of this rank's shard: ({index: det}, summed loss, number of images).
    ``progress``: trainer.progress; ``world``: this process's place in the run (None: alone)."""
    world = world or World()
    limit = limit_batches * batch_size * world.size if limit_batches else None
    sampler = ShardSampler(len(dataset), world.rank, world.size, limit)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    was_training = model.training
    model.eval()
    out: dict[int, dict] = {}
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    bar = progress_bar(loader, setting=progress, is_main=world.is_main, desc="eval")
    for images, targets, idx in bar:
        pred = model(images.to(device, non_blocking=True))
        if loss_fn is not None:  # summed on the device, read once at the end
            loss_sum += loss_fn(pred, targets.to(device))["total"].detach().double() * len(idx)
        count += len(idx)
        dets = dataset.head.decode(pred.cpu(), dataset.image_size, conf_thresh, nms_iou)
        out.update(zip(idx.tolist(), dets))
    model.train(was_training)
    return out, float(loss_sum), count


def evaluate(model: torch.nn.Module, dataset: Any, batch_size: int, device: torch.device,
             conf_thresh: float = 0.01, nms_iou: float = 0.5, limit_batches: int | None = None,
             loss_fn: Any = None, progress: Any = False, metric: str = "voc07",
             keep: Optional[list] = None, world: Optional[World] = None,
             box_rule: str = "devkit") -> dict[str, Any]:
    """``map50`` (mAP@0.5 of ``metric``), ``metric`` (its name), per-class ``ap``, ``images`` and,
    with ``loss_fn``, the mean ``loss``; identical on every rank. ``keep``: a list that receives
    the full evaluator result and the merged detections (model-input frame), so reports need not
    recompute them. ``world``: this process's place in the run (None: alone, with no collective,
    so one rank can score one model while its peers score others)."""
    world = world or World()
    if world.distributed:
        for m in model.modules():  # rank 0's BN statistics on every rank (each rank's drift apart)
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
                dist.broadcast(m.running_mean, src=0)
                dist.broadcast(m.running_var, src=0)
    local, loss_sum, count = predict(model, dataset, batch_size, device, conf_thresh, nms_iou,
                                     limit_batches, loss_fn, progress, world)
    part = (local, loss_sum, count)
    parts = dist.all_gather_object(part) if world.distributed else [part]
    merged = {i: det for p in parts for i, det in p[0].items()}
    total_count = sum(p[2] for p in parts)
    result = evaluate_dataset(merged, dataset, metric, box_rule)
    coco = metric == "coco"
    res: dict[str, Any] = {"map50": float(result["map50" if coco else "map"]),
                           "metric": "COCO mAP@0.5" if coco else result["name"],
                           "ap": [float(a) for a in result["ap50" if coco else "ap"]],
                           "images": len(merged)}
    if coco:
        res["map_coco"] = float(result["map"])  # AP@[.5:.95], COCO's headline
    if loss_fn is not None and total_count:
        res["loss"] = sum(p[1] for p in parts) / total_count
    if keep is not None:
        keep[:] = [result, merged]
    return res
