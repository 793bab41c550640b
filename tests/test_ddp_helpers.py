"""Rank functions for the DDP tests (importable by spawned workers, which unpickle them by name).

No tests here; pytest collects nothing from this file."""
from __future__ import annotations

import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

REPO = Path(__file__).resolve().parents[1]
TINY = ["model.image_size=64", "model.net.channels=[8,M,8,M,8,M,8,M,8,M,8]",
        "model.net.mask_bits=[3,3,3,3,3,3,8]", "dataset.generate.image_size=64",
        "dataset.generate.num_train=64", "trainer.epochs=1", "trainer.limit_train_batches=3",
        "logger=none", "trainer.progress=false"]


def tiny_cfg(tmp: Path, *extra: str, num_val: int = 24) -> DictConfig:
    """The real conf/ with the tiny CPU overrides, resolved (as the parent hands it to ranks)."""
    from mdk.config import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*TINY, f"dataset.generate.num_val={num_val}",
                                           f"paths.data={tmp}/data", f"paths.checkpoints={tmp}/ck",
                                           *extra])
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))


def raise_on_rank1(cfg: DictConfig, run_dir: Path) -> dict:
    """Rank 1 fails after 0.5 s; rank 0 meanwhile waits in a collective it would never leave."""
    from mdk import dist

    if dist.get_rank() == 1:
        time.sleep(0.5)
        raise ValueError("boom from rank 1")
    dist.barrier()  # never satisfied: only the parent's SIGTERM ends this
    return {"stage": "x"}


def eval_rank(cfg: DictConfig, run_dir: Path) -> dict:
    """Evaluate a seeded tiny model on this rank's shard; return metrics and all detections."""
    from mdk import dist
    from mdk.engine import build
    from mdk.evaluation import evaluate, predict

    torch.manual_seed(0)
    model = build.build_model(cfg)
    _, val_ds = build.build_data(cfg, model.grid)
    bs = 4  # per rank, as in training
    res = evaluate(model, val_ds, bs, torch.device("cpu"), conf_thresh=0.0, nms_iou=0.5)
    dets, _, _ = predict(model, val_ds, bs, torch.device("cpu"), 0.0, 0.5)
    merged: dict = {}
    for part in dist.all_gather_object(dets):
        for k, d in part.items():
            assert k not in merged, f"image {k} predicted by two ranks"
            merged[k] = {n: t.tolist() for n, t in d.items()}
    return {"metrics": res, "dets": {str(k): merged[k] for k in sorted(merged)},
            "world": dist.world_size()}
