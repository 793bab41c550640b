"""Rank functions for the DDP tests (importable by spawned workers, which unpickle them by name)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from mdk.world import World

REPO = Path(__file__).resolve().parents[2]
TINY = ["debug=tiny", "dataset.generate.num_train=64", "trainer.epochs=1",
        "trainer.limit_train_batches=3"]


def tiny_cfg(tmp: Path, *extra: str, num_val: int = 24) -> DictConfig:
    """The real conf/ with the tiny CPU overrides, resolved (as the parent hands it to ranks)."""
    from mdk.compose import compose

    cfg = compose([*TINY, f"dataset.generate.num_val={num_val}", f"paths.data={tmp}/data",
                   f"paths.checkpoints={tmp}/ck", *extra])
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))


def raise_on_rank1(cfg: DictConfig, run_dir: Path, world: World) -> dict:
    """Rank 1 fails after 0.5 s; rank 0 meanwhile waits in a collective it would never leave."""
    from mdk import dist

    if world.rank == 1:
        time.sleep(0.5)
        raise ValueError("boom from rank 1")
    dist.barrier()  # never satisfied: only the parent's SIGTERM ends this
    return {"stage": "x"}


def env_rank(cfg: DictConfig, run_dir: Path, world: World) -> dict:
    """What a rank sees of how it was started: a variable of the launcher's environment, its
    rank variables and its parent."""
    return {"var": os.environ.get("MDK_TEST_RANK_ENV"), "gone": "MDK_TEST_GONE" in os.environ,
            "rank": os.environ["RANK"], "world": world.size, "parent": os.getppid()}


def eval_rank(cfg: DictConfig, run_dir: Path, world: World) -> dict:
    """Evaluate a seeded tiny model on this rank's shard; return metrics and all detections."""
    from mdk import dist
    from mdk.engine import build
    from mdk.models.build import build_model
    from mdk.eval.distributed import evaluate, predict

    torch.manual_seed(0)
    model = build_model(cfg)
    _, val_ds = build.build_data(cfg, model.grid, world)
    bs = 4  # per rank, as in training
    res = evaluate(model, val_ds, bs, torch.device("cpu"), conf_thresh=0.0, nms_iou=0.5,
                   world=world)
    dets, _, _ = predict(model, val_ds, bs, torch.device("cpu"), 0.0, 0.5, world=world)
    merged: dict = {}
    for part in dist.all_gather_object(dets):
        for k, d in part.items():
            assert k not in merged, f"image {k} predicted by two ranks"
            merged[k] = {n: t.tolist() for n, t in d.items()}
    oracle = evaluate(Oracle(val_ds), val_ds, bs, torch.device("cpu"), 0.01, 0.5, world=world)
    return {"metrics": res, "dets": {str(k): merged[k] for k in sorted(merged)},
            "oracle": oracle, "world": len(dist.all_gather_object(None))}


class Oracle(torch.nn.Module):
    """Predicts each image's encoded ground truth, jittered per image: a 'model' with
    0 < mAP < 1 whose output depends only on the image, so the metric itself is compared."""

    def __init__(self, ds) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.table = {}
        for i in range(len(ds)):
            img, tgt, _ = ds[i]
            noisy = tgt.clone().float()
            for b in range(ds.boxes_per_cell):
                noisy[..., 5 * b: 5 * b + 4] += 0.05 * torch.randn(noisy.shape[:-1] + (4,), generator=g)
                noisy[..., 5 * b + 4] = noisy[..., 5 * b + 4] * 0.5 + 0.5 * torch.rand(
                    noisy.shape[:-1], generator=g)
            self.table[img.numpy().tobytes()] = noisy.permute(2, 0, 1).contiguous()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.table[im.numpy().tobytes()] for im in images])



# float32 values whose sum depends on the order of addition: left to right gives 1,
# (1e8 + 1) + (-1e8 + 1) gives 0 (1e8 + 1 rounds to 1e8).
ORDER_SENSITIVE = [1e8, 1.0, -1e8, 1.0]


def ordered_sum_rank(cfg: DictConfig, run_dir: Path, world: World) -> dict:
    """This rank's contiguous share of ORDER_SENSITIVE summed with dist.ordered_sum, and the same
    share's local sum all-reduced, on every rank."""
    from mdk import dist

    r, w = world.rank, world.size
    k = len(ORDER_SENSITIVE) // w
    parts = [torch.tensor([v], dtype=torch.float32) for v in ORDER_SENSITIVE[r * k:(r + 1) * k]]
    ordered = dist.ordered_sum(parts)
    local = parts[0].clone()
    for p in parts[1:]:
        local += p
    reduced = dist.all_reduce_sum(local)
    return {"ordered": dist.all_gather_object(ordered.item()),
            "allreduce": dist.all_gather_object(reduced.item())}


def bn_batch(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded global batch (8 x 4 channels x 5 x 5, shifted so mean and scale matter) and a
    fixed upstream gradient for it."""
    g = torch.Generator().manual_seed(3)
    x = 3 + 2 * torch.randn(8, 4, 5, 5, generator=g, dtype=dtype)
    return x, torch.randn(8, 4, 5, 5, generator=g, dtype=dtype)


def global_bn_rank(cfg: DictConfig, run_dir: Path, world: World) -> dict:
    """GlobalBatchNorm2d on this rank's contiguous share of bn_batch(): two training steps;
    returns outputs, input gradients, the (summed) weight/bias gradients and running stats."""
    from mdk import dist
    from mdk.sync_bn import GlobalBatchNorm2d

    r, w = world.rank, world.size
    x, dy = bn_batch()
    k = x.shape[0] // w
    bn = GlobalBatchNorm2d(4).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 0.5, 2.0, -1.0]))
        bn.bias.copy_(torch.tensor([0.0, 0.1, -0.2, 0.3]))
    out = {}
    for step in range(2):
        xs = (x[r * k:(r + 1) * k] * (1 + step)).clone().requires_grad_(True)
        y = bn(xs)
        (y * dy[r * k:(r + 1) * k]).sum().backward()
        out[f"y{step}"] = dist.all_gather_object(y.detach())
        out[f"dx{step}"] = dist.all_gather_object(xs.grad)
    out["dw"] = dist.all_reduce_sum(bn.weight.grad.clone())
    out["db"] = dist.all_reduce_sum(bn.bias.grad.clone())
    out["running"] = dist.all_gather_object((bn.running_mean, bn.running_var,
                                             int(bn.num_batches_tracked)))
    return {k: _plain(v) for k, v in out.items()}  # through the JSON result file


def _plain(x: object) -> object:
    """Tensors (also inside lists/tuples) as nested lists."""
    if torch.is_tensor(x):
        return x.tolist()
    return [_plain(v) for v in x] if isinstance(x, (list, tuple)) else x


def release_rank(cfg: DictConfig, run_dir: Path, world: World) -> dict:
    """A net whose first layer is frozen for one epoch (model.freeze_epochs' hook), trained under
    DDP on different data per rank: every parameter, gathered from each rank at the end."""
    from torch import nn

    from mdk import dist
    from mdk.engine.freeze import ReleaseFrozenHook
    from mdk.engine.loop import Trainer

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    start = [p.detach().clone().tolist() for p in net[0].parameters()]
    for p in net[0].parameters():
        p.requires_grad_(False)
    wrap = lambda: nn.parallel.DistributedDataParallel(net)  # noqa: E731
    g = torch.Generator().manual_seed(10 + world.rank)  # different data per rank
    data = [(torch.randn(4, 3, generator=g), torch.randn(4, 2, generator=g)) for _ in range(3)]
    t = Trainer(wrap(), lambda p, y: {"total": (p - y).square().mean()},
                torch.optim.SGD(net.parameters(), lr=0.1), data, torch.device("cpu"), epochs=2,
                iters_per_epoch=3)
    t.register_hooks([ReleaseFrozenHook(net, ["0.*"], 1, wrap, world.is_main)])
    t.train()
    return {"start": start,
            "params": dist.all_gather_object([p.detach().tolist() for p in net.parameters()])}
