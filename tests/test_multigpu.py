"""Two or more GPUs with NCCL: the ordered sum, exact-mode alignment, exact distributed evaluation
and SyncBN on CUDA. Marked ``multigpu``: skipped with the reason on machines with fewer than 2
GPUs (the CPU/gloo versions of the same checks run everywhere: test_ddp.py, test_exact_grad.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from mdk.world import World
from helpers.ddp import ORDER_SENSITIVE, TINY, eval_rank, ordered_sum_rank, tiny_cfg

pytestmark = [pytest.mark.multigpu, pytest.mark.gpu]
CUDA = ("trainer.device=cuda", "trainer.deterministic=true")


def test_ordered_sum_over_nccl_adds_in_global_order(tmp_path: Path):
    from launchers.processes.spawn import run_ranks

    (tmp_path / "run").mkdir()
    res = run_ranks(tiny_cfg(tmp_path, "dist.gpus=2", *CUDA), tmp_path / "run", ordered_sum_rank)
    one = torch.tensor([ORDER_SENSITIVE[0]], dtype=torch.float32)
    for v in ORDER_SENSITIVE[1:]:
        one += v
    assert res["ordered"] == [one.item()] * 2


def test_exact_mode_alignment_on_two_gpus_is_bit_identical(tmp_path: Path):
    from launchers.align import validated_config, run_alignment

    cfg = validated_config([*TINY, "dataset.generate.num_val=8", "dataset.generate.num_train=48",
                          f"paths.data={tmp_path}/data", *CUDA])
    report = run_alignment(cfg, [2], batch_size=8, iters=6, out=tmp_path / "al", exact_chunk=4)
    assert all(d.max_abs == 0.0 for d in report[2]), [d for d in report[2] if d.max_abs]


def test_distributed_eval_on_two_gpus_equals_one(tmp_path: Path):
    from launchers.processes.spawn import run_ranks

    single = eval_rank(tiny_cfg(tmp_path, *CUDA, num_val=23), tmp_path, World())
    (tmp_path / "run").mkdir()
    multi = run_ranks(tiny_cfg(tmp_path, "dist.gpus=2", *CUDA, num_val=23), tmp_path / "run",
                      eval_rank)
    assert multi["world"] == 2 and multi["metrics"]["images"] == 23
    assert multi["dets"] == json.loads(json.dumps(single["dets"]))
    assert multi["metrics"] == single["metrics"]


def sync_bn_rank(cfg: DictConfig, run_dir: Path, world: World) -> dict:
    """torch's SyncBatchNorm (the CUDA path of dist.sync_bn) on this rank's half of a batch."""
    from mdk import dist

    g = torch.Generator().manual_seed(3)
    x = 3 + 2 * torch.randn(8, 4, 5, 5, generator=g, dtype=torch.float64)
    k = 8 // world.size
    bn = torch.nn.SyncBatchNorm(4).double().to(world.device)
    xs = x[world.rank * k:(world.rank + 1) * k].to(world.device).requires_grad_(True)
    y = bn(xs)
    y.square().sum().backward()
    return {"y": [t.tolist() for t in dist.all_gather_object(y.detach().cpu())],
            "mean": bn.running_mean.cpu().tolist(), "var": bn.running_var.cpu().tolist()}


def test_sync_bn_on_cuda_normalises_over_the_global_batch(tmp_path: Path):
    from launchers.processes.spawn import run_ranks

    (tmp_path / "run").mkdir()
    res = run_ranks(tiny_cfg(tmp_path, "dist.gpus=2", *CUDA), tmp_path / "run", sync_bn_rank)
    g = torch.Generator().manual_seed(3)
    x = 3 + 2 * torch.randn(8, 4, 5, 5, generator=g, dtype=torch.float64)
    bn = torch.nn.BatchNorm2d(4).double()
    want = bn(x)
    got = torch.cat([torch.tensor(t, dtype=torch.float64) for t in res["y"]])
    assert (got - want.detach()).abs().max() <= 1e-10
    assert torch.allclose(torch.tensor(res["mean"], dtype=torch.float64), bn.running_mean)
    assert torch.allclose(torch.tensor(res["var"], dtype=torch.float64), bn.running_var)
