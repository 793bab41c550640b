"""The run state of a training stage: one mapping of named stateful parts, walked the same way to
save and to load (mdk/engine/run_state.py), and last.pth files of the earlier flat layout still
resume bit-identically."""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from mdk.checkpoint.files import atomic_save, load_checkpoint
from mdk.engine.hooks import CheckpointHook
from mdk.engine.loop import HookBase, Trainer
from mdk.engine.run_state import ConfiguredOptimizer, HookStates, RankRNG, RunState
from mdk.engine.runner import run_stage
from mdk.world import World


def _parts(lr: float = 0.1) -> tuple[torch.nn.Module, dict]:
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    trainer = Trainer(net, lambda p, y: {"total": p.sum()}, opt, [], torch.device("cpu"), 1, 1)
    ckpt = CheckpointHook(lambda done: {}, lambda *a: None, True)
    trainer.register_hooks([HookBase(), ckpt])
    return net, {"optimizer": opt, "scheduler": sched, "scaler": None, "trainer": trainer,
                 "hooks": HookStates(trainer.hooks), "rng": RankRNG(World())}


def test_save_and_load_walk_the_same_names():
    net, parts = _parts()
    net(torch.ones(4, 3)).sum().backward()
    parts["optimizer"].step()
    parts["scheduler"].step()
    parts["trainer"].iter = 7
    best = parts["hooks"].hooks["CheckpointHook"]
    best.best, best.best_epoch = 0.5, 2
    state = RunState(parts).state_dict()
    # a part that is None in this run (no fp16 scaler) is neither saved nor loaded; a hook
    # without state (HookBase) is not a part of the hooks' entry
    assert set(state) == {"optimizer", "scheduler", "trainer", "hooks", "rng"}
    assert state["trainer"] == {"epoch": 0, "iter": 7}
    assert state["hooks"] == {"CheckpointHook": {"best_metric": 0.5, "best_epoch": 2,
                                                 "best_metrics": {}}}
    expected_draw = torch.rand(3)  # the generator state was saved before this draw
    _, fresh = _parts(lr=0.01)
    RunState(fresh).load_state_dict(state)
    assert RunState(fresh).state_dict()["trainer"] == state["trainer"]
    assert fresh["optimizer"].state_dict()["param_groups"][0]["lr"] == \
        parts["optimizer"].state_dict()["param_groups"][0]["lr"]
    assert fresh["hooks"].hooks["CheckpointHook"].best == 0.5
    assert torch.equal(torch.rand(3), expected_draw)  # RNG restored


def test_a_saved_hook_this_run_lacks_is_a_warning_naming_it(caplog):
    _, parts = _parts()
    state = parts["hooks"].state_dict()
    state["NanGuardHook"] = {"skipped": 3}  # saved by a run that had this hook on
    _, fresh = _parts()
    with caplog.at_level(logging.WARNING, logger="mdk.engine.run_state"):
        fresh["hooks"].load_state_dict(state)
    assert [r.getMessage() for r in caplog.records] == [
        "the checkpoint holds the state of hooks this run does not have: NanGuardHook (left unused)"]
    assert fresh["hooks"].hooks["CheckpointHook"].best == parts["hooks"].hooks["CheckpointHook"].best



def test_the_optimizer_part_keeps_this_runs_hyper_parameters():
    """Resuming restores the optimizer's per-parameter state but not the checkpoint's lr,
    momentum or weight decay: a resumed stage goes on with the values it is run with."""
    net = torch.nn.Linear(3, 2)
    old = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    net(torch.ones(4, 3)).sum().backward()
    old.step()
    new = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.5, weight_decay=0.0)
    ConfiguredOptimizer(new).load_state_dict(ConfiguredOptimizer(old).state_dict())
    g = new.param_groups[0]
    assert (g["lr"], g["momentum"], g["weight_decay"]) == (0.5, 0.5, 0.0)
    for p in net.parameters():
        assert torch.equal(new.state[p]["momentum_buffer"], old.state[p]["momentum_buffer"])
    same = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    plain = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    ConfiguredOptimizer(same).load_state_dict(old.state_dict())
    plain.load_state_dict(old.state_dict())  # unchanged values: the same as torch's own load
    assert same.state_dict()["param_groups"] == plain.state_dict()["param_groups"]


def test_a_flat_format_1_last_pth_resumes_bit_identically(tiny_cfg, tmp_path):
    """A last.pth written before the run state had one entry per part (iter, epoch, best_* at
    the top) is upgraded when it is read, and the resumed run ends as an uninterrupted one."""
    cfg1 = tiny_cfg("trainer.limit_train_batches=2", "trainer.epochs=1")
    run_stage(cfg1, tmp_path)
    last = Path(cfg1.paths.checkpoints) / "step1" / "last.pth"
    ck = load_checkpoint(last)
    flat = {k: v for k, v in ck.items() if k not in ("format", "trainer", "hooks")}
    flat.update(iter=ck["trainer"]["iter"], epoch=ck["trainer"]["epoch"],
                **ck["hooks"]["CheckpointHook"])
    atomic_save(flat, last)
    out = run_stage(tiny_cfg("trainer.limit_train_batches=2", "trainer.epochs=2"), tmp_path)
    assert out.iterations == 4  # resumed at 2
    resumed = load_checkpoint(last)["model"]
    cfg2 = tiny_cfg("trainer.limit_train_batches=2", f"paths.checkpoints={tmp_path}/fresh")
    run_stage(cfg2, tmp_path)
    fresh = load_checkpoint(Path(cfg2.paths.checkpoints) / "step1" / "last.pth")["model"]
    assert all(torch.equal(resumed[k], fresh[k]) for k in fresh)
