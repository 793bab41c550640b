"""Rank function for test_loss_gti's 2-process check (importable by spawned workers; it imports
only torch and the loss, so a worker starts fast). No tests here."""
from __future__ import annotations

import torch
import torch.distributed as tdist

from mdk.models.gti_loss import GtiLoss


def rank_main(rank: int, world: int, store: str, out: str) -> None:
    """One process of a world: a 4-image global batch split evenly; 3 training calls."""
    tdist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.save(three_steps(rank, world), f"{out}.{rank}")
    finally:
        tdist.destroy_process_group()


def three_steps(rank: int, world: int) -> list:
    g = torch.Generator().manual_seed(0)
    f = GtiLoss(1, 2)
    out = []
    for step in range(3):
        pred = torch.rand(4, 11, 2, 2, generator=g, dtype=torch.float64)
        target = torch.zeros(4, 2, 2, 11)
        # 1, 0, 3 and 2 objects in the four images: an uneven split of objects over ranks
        for i, cells in enumerate([[(0, 1)], [], [(0, 0), (1, 0), (1, 1)], [(0, 1), (1, 1)]]):
            for r, c in cells:
                target[i, r, c] = torch.tensor([0.5, 0.4, 0.3 + step / 10, 0.2, 1] * 2 + [1])
        n = 4 // world
        p = pred[rank * n:(rank + 1) * n].clone().requires_grad_()
        f(p, target[rank * n:(rank + 1) * n])["total"].backward()
        out.append((p.grad, f.nu.clone()))
    return out
