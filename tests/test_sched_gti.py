"""scheduler.warmup.mode=gti (the GTI MDK's warmup: the main schedule starts after warmup) against
independent references: torch's own LinearLR -> main scheduler chained with SequentialLR, and the
GTI MDK's documented per-epoch values; plus epochs-mode warmup, defaults unchanged, errors, resume.
"""
from __future__ import annotations

import math

import pytest
import torch
from hydra.utils import instantiate
from torch.optim.lr_scheduler import (ConstantLR, CosineAnnealingLR, CosineAnnealingWarmRestarts,
                                      LinearLR, MultiStepLR, SequentialLR, StepLR)

from conftest import TINY, compose
from mdk.sched.base import stage_length
from mdk.sched.schedules import (WarmupCosineAnnealingLR, WarmupCosineAnnealingWarmRestarts,
                                 WarmupMultiStepLR, WarmupStepLR)

IPE = 7
BASES = (0.1, 0.02)
MAIN = {  # mdk class, torch class, params (in the unit of the interval)
    "step": (WarmupStepLR, StepLR, {"step_size": 3, "gamma": 0.5}),
    "multistep": (WarmupMultiStepLR, MultiStepLR, {"milestones": [2, 5], "gamma": 0.1}),
    "cosine": (WarmupCosineAnnealingLR, CosineAnnealingLR, {"T_max": 9, "eta_min": 0.001}),
    "cosine_restarts": (WarmupCosineAnnealingWarmRestarts, CosineAnnealingWarmRestarts,
                        {"T_0": 2, "T_mult": 2, "eta_min": 0.001}),
}


def _opt() -> torch.optim.Optimizer:
    return torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": b} for b in BASES])


def torch_reference(kind: str, warm_steps: int, start: float, method: str, steps: int) -> list:
    """lr of steps 0..steps-1 from torch: warmup scheduler for ``warm_steps`` steps, then the main
    scheduler from its own step 0 (SequentialLR), stepped once per step."""
    opt = _opt()
    warm = (LinearLR(opt, start_factor=start, end_factor=1.0, total_iters=warm_steps)
            if method == "linear" else ConstantLR(opt, factor=start, total_iters=warm_steps))
    main = MAIN[kind][1](opt, **MAIN[kind][2])
    seq = SequentialLR(opt, [warm, main], milestones=[warm_steps])
    out = []
    for _ in range(steps):
        out.append([g["lr"] for g in opt.param_groups])
        opt.step()
        seq.step()
    return out


@pytest.mark.parametrize("kind", sorted(MAIN))
@pytest.mark.parametrize("method", ["linear", "constant"])
def test_gti_epochs_warmup_equals_torch_sequential_per_epoch(kind, method):
    """interval epoch, warmup 3 epochs: every iteration of epoch e has torch's per-epoch lr."""
    epochs = 8 if kind == "cosine" else 12  # cosine: torch's cosine is periodic past T_max
    ref = torch_reference(kind, 3, 0.2, method, epochs)
    s = MAIN[kind][0](_opt(), IPE, {"iters": 0, "epochs": 3, "start_factor": 0.2,
                                    "method": method, "mode": "gti"}, "epoch", **MAIN[kind][2])
    for it in range(epochs * IPE):
        assert s.lr_at(it) == pytest.approx(ref[it // IPE], rel=1e-12, abs=1e-15), (it, kind)


@pytest.mark.parametrize("kind", sorted(MAIN))
def test_gti_iters_warmup_equals_torch_sequential_per_iteration(kind):
    """interval iter, warmup 5 iterations: the main schedule's iteration 0 is iteration 5."""
    params = dict(MAIN[kind][2])
    ref = torch_reference(kind, 5, 0.3, "linear", 14 if kind == "cosine" else 30)
    s = MAIN[kind][0](_opt(), IPE, {"iters": 5, "start_factor": 0.3, "method": "linear",
                                    "mode": "gti"}, "iter", **params)
    for it, want in enumerate(ref):
        assert s.lr_at(it) == pytest.approx(want, rel=1e-12, abs=1e-15), (it, kind)


def test_gti_iters_warmup_with_epoch_interval_closed_form():
    """Warmup of 10 iterations (not a whole number of epochs of 7): the main clock is
    (it - 10) // 7 from iteration 10. StepLR(step 2, gamma .5) by hand:
    it 0..9: 0.1 * (0.5 + 0.5 * it / 10); it 10..23: 0.1; it 24..37: 0.05; it 38: 0.025."""
    s = WarmupStepLR(_opt(), IPE, {"iters": 10, "start_factor": 0.5, "mode": "gti"}, "epoch",
                     step_size=2, gamma=0.5)
    for it in range(10):
        assert s.lr_at(it)[0] == pytest.approx(0.1 * (0.5 + 0.05 * it), rel=1e-15)
    assert [s.lr_at(it)[0] for it in (10, 23, 24, 37, 38)] == \
        pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025], rel=1e-15)


def test_gti_mdk_defaults_reproduce_its_lr_table():
    """The GTI MDK's configs: lr 1e-3, StepLR(step_size 20, gamma 0.75), warmup_epochs 2 from
    min_lr 1e-10, stepped per epoch: epoch 0 -> 1e-10, epoch 1 -> 1e-10 + (1e-3 - 1e-10)/2,
    epoch 2 -> 1e-3 (main epoch 0), epoch 21 -> 1e-3 (main 19), epoch 22 -> 7.5e-4 (main 20)."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)
    s = WarmupStepLR(opt, 50, {"iters": 0, "epochs": 2, "start_factor": 1e-10 / 1e-3,
                               "mode": "gti"}, "epoch", step_size=20, gamma=0.75)
    want = {0: 1e-10, 1: 1e-10 + (1e-3 - 1e-10) / 2, 2: 1e-3, 21: 1e-3, 22: 7.5e-4, 42: 5.625e-4}
    for epoch, lr in want.items():
        for j in (0, 49):
            assert s.lr_at(epoch * 50 + j)[0] == pytest.approx(lr, rel=1e-12)


def test_mdk_mode_with_epochs_steps_the_factor_per_epoch():
    """mode mdk, warmup 2 epochs from 0.5: factor 0.5 in epoch 0, 0.75 in epoch 1, then 1; the
    main clock still starts at iteration 0 (cosine over 4 epochs)."""
    s = WarmupCosineAnnealingLR(_opt(), IPE, {"iters": 0, "epochs": 2, "start_factor": 0.5},
                                "epoch", T_max=4)
    cos = lambda t: (1 + math.cos(math.pi * t / 4)) / 2  # noqa: E731
    for it in range(5 * IPE):
        e = it // IPE
        w = 0.5 + 0.25 * e if e < 2 else 1.0
        assert s.lr_at(it)[0] == pytest.approx(0.1 * w * cos(min(e, 4)), rel=1e-14)


@pytest.mark.parametrize("kind", sorted(MAIN))
def test_default_mode_is_todays_schedule_bit_for_bit(kind):
    cls, _, params = MAIN[kind]
    old = {"iters": 11, "start_factor": 0.4, "method": "linear"}
    a = cls(_opt(), IPE, old, "epoch", **params)
    b = cls(_opt(), IPE, {**old, "mode": "mdk", "epochs": 0}, "epoch", **params)
    assert all(a.lr_at(it) == b.lr_at(it) for it in range(80))
    # the saved schedule carries no new keys, so older checkpoints resume without a warning
    assert b.state_dict()["schedule"] == a.state_dict()["schedule"]
    assert set(b.state_dict()["schedule"]["warmup"]) == {"iters", "start_factor", "method"}


def test_errors_name_the_key():
    with pytest.raises(ValueError, match=r"^scheduler\.warmup\.mode='GTI' must be mdk or gti$"):
        WarmupStepLR(_opt(), IPE, {"mode": "GTI"})
    with pytest.raises(ValueError, match=r"^scheduler\.warmup\.epochs=2 and scheduler\.warmup\.iters=50 "
                                         r"are both set.*scheduler\.warmup\.iters=0"):
        WarmupStepLR(_opt(), IPE, {"iters": 50, "epochs": 2})
    with pytest.raises(ValueError, match=r"^scheduler\.warmup\.epochs=-1 must be an integer >= 0"):
        WarmupStepLR(_opt(), IPE, {"epochs": -1})


def test_resume_inside_gti_warmup_is_exact():
    w = {"iters": 0, "epochs": 2, "start_factor": 0.1, "mode": "gti"}
    a = WarmupMultiStepLR(_opt(), IPE, w, "epoch", milestones=[1, 3], gamma=0.5)
    for _ in range(10):
        a.optimizer.step()
        a.step()
    b = WarmupMultiStepLR(_opt(), IPE, w, "epoch", milestones=[1, 3], gamma=0.5)
    b.load_state_dict(a.state_dict())
    for _ in range(30):
        assert [g["lr"] for g in a.optimizer.param_groups] == [g["lr"] for g in b.optimizer.param_groups]
        for s in (a, b):
            s.optimizer.step()
            s.step()
    assert a.state_dict()["schedule"]["warmup"]["mode"] == "gti"


@pytest.mark.parametrize("name", ["step", "multistep", "cosine", "cosine_restarts"])
def test_config_keys_exist_and_select_gti(name):
    cfg = compose([*TINY, "trainer.device=cpu", f"scheduler={name}", "scheduler.warmup.mode=gti",
                   "scheduler.warmup.iters=0", "scheduler.warmup.epochs=1"])
    # the engine hands a cosine over the whole stage (T_max: null) the stage's length
    s = instantiate(cfg.scheduler)(optimizer=_opt(), iters_per_epoch=IPE,
                                   **stage_length(cfg.scheduler, cfg.trainer.epochs))
    assert s.warmup_mode == "gti" and s.warmup_iters == IPE
    dflt = compose([*TINY, "trainer.device=cpu", f"scheduler={name}"])
    assert dflt.scheduler.warmup.mode == "mdk" and dflt.scheduler.warmup.epochs == 0
