"""EMA in the engine: the hook in the training loop (skipped steps, a DDP-wrapped model), buffers
synced across ranks, and an EMA run's checkpoint (the EMA weights stored once). The EMA itself
(closed-form updates, resume, swap): tests/test_ema.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import TINY, compose
from helpers.tiny_net import tiny_net
from mdk.engine.ema import EMAHook, ModelEMA, unwrap
from mdk.engine.loop import HookBase, Trainer


class SkipEvery3(HookBase):
    """Vetoes every third optimizer step, like the NaN guard does."""

    def after_backward(self) -> None:
        self.trainer.skip_step = (self.trainer.iter + 1) % 3 == 0


def _loop(model: nn.Module, steps: int, hooks: list) -> Trainer:
    g = torch.Generator().manual_seed(2)
    data = [(torch.randn(4, 3, 6, 6, generator=g), torch.randn(4, 2, generator=g))
            for _ in range(steps)]

    def loss_fn(pred, target):
        return {"total": (pred - target).square().mean()}

    t = Trainer(model, loss_fn, torch.optim.SGD(unwrap(model).parameters(), lr=0.05), data,
                torch.device("cpu"), epochs=1, iters_per_epoch=steps, grad_clip=None)
    t.register_hooks(hooks)
    t.train()
    return t


def test_hook_updates_after_each_step_not_skipped_ones():
    net = tiny_net()
    ema = ModelEMA(net, decay=0.9, tau=0.0)
    _loop(net, 9, [SkipEvery3(), EMAHook(ema)])
    assert ema.updates == 6


def test_hook_unwraps_ddp(tmp_path):
    import torch.distributed as tdist

    tdist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                             world_size=1)
    try:
        net = tiny_net()
        ema = ModelEMA(net, decay=0.5, tau=0.0)
        ddp = nn.parallel.DistributedDataParallel(net)
        hook = EMAHook(ema)
        _loop(ddp, 3, [hook])
        assert ema.updates == 3 and set(ema.shadow) == set(net.state_dict())
        assert ema.state_dict()["updates"] == 3
    finally:
        tdist.destroy_process_group()


def ema_ddp_rank(cfg, run_dir: Path, world) -> dict:
    """Each rank trains the DDP-wrapped BN net on its own data with an EMAHook."""
    import torch.distributed as tdist

    from mdk import dist

    r = world.rank
    net = tiny_net()
    ema = ModelEMA(net, decay=0.8, tau=0.0)
    ddp = nn.parallel.DistributedDataParallel(net)
    g = torch.Generator().manual_seed(10 + r)           # different data per rank
    data = [(torch.randn(4, 3, 6, 6, generator=g), torch.randn(4, 2, generator=g))
            for _ in range(4)]
    t = Trainer(ddp, lambda p, y: {"total": (p - y).square().mean()},
                torch.optim.SGD(net.parameters(), lr=0.05), data, torch.device("cpu"), epochs=1,
                iters_per_epoch=4, grad_clip=None)

    class Snapshot(HookBase):  # the EMA after the last update, before the epoch-end sync
        def after_step(self) -> None:
            self.before = {k: v.clone() for k, v in ema.shadow.items()}

    snap = Snapshot()
    t.register_hooks([EMAHook(ema, world.distributed), snap])  # snap sees each update; after_epoch syncs
    t.train()
    tdist.barrier()
    def plain(sd: dict) -> dict:  # results come back through JSON
        return {k: v.tolist() for k, v in sd.items()}

    return {"before": dist.all_gather_object(plain(snap.before)),
            "after": dist.all_gather_object(plain(ema.shadow))}


@pytest.mark.ddp
def test_ranks_agree_on_parameters_and_buffers_follow_rank0(tmp_path):
    from launchers.processes.spawn import run_ranks

    cfg = compose([*TINY, "dist.gpus=2", "trainer.device=cpu", f"paths.data={tmp_path}/d"])
    (tmp_path / "run").mkdir()
    res = run_ranks(cfg, tmp_path / "run", ema_ddp_rank)
    before, after = res["before"], res["after"]
    params = [k for k in before[0] if "running" not in k and "num_batches" not in k]
    buffers = ["1.running_mean", "1.running_var"]
    # Parameters: identical on both ranks with no collective in the update (exact floats).
    assert all(before[0][k] == before[1][k] for k in params)
    # BN statistics saw each rank's own batch: apart before the sync, rank 0's after it.
    assert before[0][buffers[0]] != before[1][buffers[0]]
    for k in buffers:
        assert after[1][k] == before[0][k] and after[0][k] == before[0][k]


def test_an_ema_checkpoint_holds_the_ema_once_and_every_loader_reads_it(tmp_path, shared_data):
    """The EMA weights are the run state's ``ema`` only (no second copy as before 2026-11-28);
    what best.pth was chosen by is what the evaluate tool and the next stage load."""
    from mdk.checkpoint.files import load_checkpoint
    from mdk.checkpoint.sources import weights_of
    from mdk.engine.runner import run_stage
    from mdk.stage import config_for_stage
    from mdk.tools.evaluate import evaluate_path

    common = [*TINY, f"paths.data={shared_data}", f"paths.checkpoints={tmp_path}/ck",
              "trainer.ema.enabled=true", "trainer.ema.tau=0", "trainer.ema.decay=0.5"]
    run_stage(config_for_stage(compose(common), "step1"), tmp_path / "run")
    ck = load_checkpoint(tmp_path / "ck" / "step1" / "best.pth")
    assert "model_ema" not in ck and ck["ema"]["updates"] > 0
    ema = weights_of(ck)
    assert ema.keys() == ck["model"].keys() and not all(
        torch.equal(ema[k], ck["model"][k]) for k in ema)
    res = evaluate_path(tmp_path / "ck" / "step1" / "best.pth", common)
    assert (res["map50"], res["loss"]) == (ck["metric"]["map50"], ck["metric"]["loss"])
    # a file of the old layout keeps its second copy and reads the same
    assert all(torch.equal(weights_of({**ck, "model_ema": ema})[k], ema[k]) for k in ema)
