"""Warmup schedulers against an independent closed-form reference, torch's own schedulers, resume
in the middle of warmup, and validation errors.

Reference (written here independently of mdk.sched), for optimizer step ``it`` (0-based):
    w(it) = 1                                   if it >= W
          = s                                   if method == constant
          = s + (1 - s) * it / W                if method == linear
    t     = it // iters_per_epoch (interval epoch)  or  it (interval iter)   -- clock from it = 0
    step:            base * gamma ** floor(t / step_size)
    multistep:       base * gamma ** (number of milestones m with m <= t)
    cosine:          eta + (base - eta) * (1 + cos(pi * min(t, T_max) / T_max)) / 2
    cosine_restarts: n = floor(log_{T_mult}(t / T_0 * (T_mult - 1) + 1)) (T_mult > 1), else t // T_0;
                     T_i = T_0 * T_mult**n, T_cur = t - T_0 * (T_mult**n - 1) / (T_mult - 1);
                     eta + (base - eta) * (1 + cos(pi * T_cur / T_i)) / 2
    lr(it) = w(it) * main(t)
"""
from __future__ import annotations

import logging
import math

import pytest
import torch

from mdk.sched.schedules import (
    WarmupCosineAnnealingLR,
    WarmupCosineAnnealingWarmRestarts,
    WarmupMultiStepLR,
    WarmupStepLR,
)

IPE = 60  # iterations per epoch of the default short run
EPOCHS = 15
BASES = (0.1, 0.02)  # two param groups: every group gets its own base lr


def ref_warm(it: int, w: dict) -> float:
    if it >= w["iters"]:
        return 1.0
    if w["method"] == "constant":
        return w["start_factor"]
    return w["start_factor"] + (1 - w["start_factor"]) * it / w["iters"]


def ref_main(kind: str, p: dict, base: float, t: int) -> float:
    if kind == "step":
        return base * p["gamma"] ** math.floor(t / p["step_size"])
    if kind == "multistep":
        return base * p["gamma"] ** sum(1 for m in p["milestones"] if m <= t)
    eta = p["eta_min"]
    if kind == "cosine":
        return eta + (base - eta) * (1 + math.cos(math.pi * min(t, p["T_max"]) / p["T_max"])) / 2
    t0, tm = p["T_0"], p["T_mult"]
    if tm == 1:
        n, t_cur = t // t0, t % t0
    else:  # SGDR's log formula; +1e-9 guards float log at exact cycle boundaries
        n = int(math.floor(math.log(t / t0 * (tm - 1) + 1, tm) + 1e-9))
        t_cur = t - t0 * (tm**n - 1) // (tm - 1)
    return eta + (base - eta) * (1 + math.cos(math.pi * t_cur / (t0 * tm**n))) / 2


CLASSES = {
    "step": WarmupStepLR,
    "multistep": WarmupMultiStepLR,
    "cosine": WarmupCosineAnnealingLR,
    "cosine_restarts": WarmupCosineAnnealingWarmRestarts,
}
PARAMS = {  # main-schedule params in the unit of the interval
    ("step", "epoch"): {"step_size": 5, "gamma": 0.1},
    ("step", "iter"): {"step_size": 200, "gamma": 0.5},
    ("multistep", "epoch"): {"milestones": [8, 11], "gamma": 0.1},
    ("multistep", "iter"): {"milestones": [90, 300, 500], "gamma": 0.3},
    ("cosine", "epoch"): {"T_max": 12, "eta_min": 0.001},  # runs 3 epochs past T_max
    ("cosine", "iter"): {"T_max": 600, "eta_min": 0.0},
    ("cosine_restarts", "epoch"): {"T_0": 3, "T_mult": 2, "eta_min": 0.001},
    ("cosine_restarts", "iter"): {"T_0": 100, "T_mult": 1, "eta_min": 0.0},
}
WARMUPS = {
    "linear": {"iters": 100, "start_factor": 0.5, "method": "linear"},
    "constant": {"iters": 130, "start_factor": 0.25, "method": "constant"},
    "none": {"iters": 0, "start_factor": 0.5, "method": "linear"},
}


def make(kind: str, interval: str, warmup: dict, bases=BASES):
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in bases]
    opt = torch.optim.SGD([{"params": [p], "lr": b} for p, b in zip(params, bases)], lr=bases[0])
    sched = CLASSES[kind](opt, IPE, warmup, interval, **PARAMS[(kind, interval)])
    return opt, sched


def ref_lr(kind: str, interval: str, warmup: dict, it: int, base: float) -> float:
    t = it // IPE if interval == "epoch" else it
    return ref_warm(it, warmup) * ref_main(kind, PARAMS[(kind, interval)], base, t)


@pytest.mark.parametrize("warm", sorted(WARMUPS))
@pytest.mark.parametrize("interval", ["epoch", "iter"])
@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_every_iteration_matches_closed_form(kind: str, interval: str, warm: str) -> None:
    opt, sched = make(kind, interval, WARMUPS[warm])
    for it in range(EPOCHS * IPE):
        want = [ref_lr(kind, interval, WARMUPS[warm], it, b) for b in BASES]
        assert sched.get_last_lr() == pytest.approx(want, rel=1e-12, abs=1e-15), it
        assert [g["lr"] for g in opt.param_groups] == pytest.approx(want, rel=1e-12, abs=1e-15)
        opt.step()
        sched.step()


def test_linear_warmup_numbers_of_the_seed_run() -> None:
    """714 warmup iterations from 0.5x: 0.5 at it 0, 0.75 halfway, exactly 1.0 at the end."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.4)
    s = WarmupStepLR(opt, 1000, {"iters": 714, "start_factor": 0.5, "method": "linear"},
                     step_size=100)
    assert s.lr_at(0) == [pytest.approx(0.2)]
    assert s.lr_at(357) == [pytest.approx(0.3)]
    assert s.lr_at(713) == [pytest.approx(0.4 * (0.5 + 0.5 * 713 / 714))]
    assert s.lr_at(714) == [pytest.approx(0.4)]
    c = WarmupStepLR(opt, 1000, {"iters": 714, "start_factor": 0.5, "method": "constant"},
                     step_size=100)
    assert c.lr_at(0) == c.lr_at(713) == [pytest.approx(0.2)] and c.lr_at(714) == [pytest.approx(0.4)]


def test_warmup_iterations_count_toward_the_main_schedule() -> None:
    """The main clock starts at iteration 0: a decay inside warmup shows up, multiplied."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    s = WarmupStepLR(opt, 10, {"iters": 25, "start_factor": 0.5, "method": "linear"},
                     step_size=1, gamma=0.1)
    assert s.lr_at(5) == [pytest.approx(0.6)]  # epoch 0: 1.0 * (0.5 + 0.5 * 5/25)
    assert s.lr_at(15) == [pytest.approx(0.1 * 0.8)]  # epoch 1 already decayed once
    assert s.lr_at(25) == [pytest.approx(0.01)]  # warmup over, epoch 2
    # cosine past T_max stays at eta_min (torch's would rise again)
    c = WarmupCosineAnnealingLR(opt, 10, None, T_max=2, eta_min=0.05)
    assert c.lr_at(20) == c.lr_at(55) == [pytest.approx(0.05)]
    # SGDR with T_mult=1 at a huge iteration count is O(1) and periodic
    r = WarmupCosineAnnealingWarmRestarts(opt, 10, None, "iter", T_0=7, T_mult=1)
    assert r.lr_at(7 * 10**9 + 3) == pytest.approx(r.lr_at(3))


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_no_warmup_equals_torch_scheduler_stepped_per_epoch(kind: str) -> None:
    """Without warmup, interval=epoch is the torch scheduler of that name stepped once per epoch."""
    p = dict(PARAMS[(kind, "epoch")])
    opt, sched = make(kind, "epoch", WARMUPS["none"], bases=(0.1,))
    ref_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    ref = {
        "step": lambda: torch.optim.lr_scheduler.StepLR(ref_opt, **p),
        "multistep": lambda: torch.optim.lr_scheduler.MultiStepLR(ref_opt, **p),
        "cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(ref_opt, **p),
        "cosine_restarts": lambda: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(ref_opt, **p),
    }[kind]()
    epochs = p.get("T_max", EPOCHS)  # torch's cosine is periodic past T_max; ours holds eta_min
    for epoch in range(epochs + 1):
        for i in range(IPE):
            assert sched.get_last_lr() == pytest.approx(ref.get_last_lr(), rel=1e-9), (epoch, i)
            opt.step()
            sched.step()
        ref_opt.step()
        ref.step()


def _train(model, opt, sched, n: int, seed0: int) -> list[float]:
    lrs = []
    for k in range(n):
        g = torch.Generator().manual_seed(seed0 + k)
        x = torch.randn(4, 3, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


@pytest.mark.parametrize("kind", sorted(CLASSES))
@pytest.mark.parametrize("scheduler_first", [True, False])
def test_resume_in_the_middle_of_warmup_is_exact(kind, scheduler_first, tmp_path) -> None:
    warm = {"iters": 100, "start_factor": 0.5, "method": "linear"}

    def build():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return model, opt, CLASSES[kind](opt, IPE, warm, "epoch", **PARAMS[(kind, "epoch")])

    m0, o0, s0 = build()
    full = _train(m0, o0, s0, 400, 0)

    m1, o1, s1 = build()
    first = _train(m1, o1, s1, 37, 0)  # stop inside warmup (37 < 100)
    ckpt = tmp_path / "last.pth"
    torch.save({"model": m1.state_dict(), "opt": o1.state_dict(), "sched": s1.state_dict()}, ckpt)
    state = torch.load(ckpt, weights_only=True)  # plain python state: loads with weights_only

    m2, o2, s2 = build()
    m2.load_state_dict(state["model"])
    if scheduler_first:
        s2.load_state_dict(state["sched"])
        o2.load_state_dict(state["opt"])
    else:
        o2.load_state_dict(state["opt"])
        s2.load_state_dict(state["sched"])
    assert s2.last_epoch == 37 and s2.get_last_lr() == s1.get_last_lr()
    rest = _train(m2, o2, s2, 400 - 37, 37)
    assert first + rest == full  # bit-identical lr sequence
    for a, b in zip(m0.parameters(), m2.parameters()):
        assert torch.equal(a, b)


def _stepped_25() -> WarmupStepLR:
    """A step schedule (10 warm-up iterations, step_size 2) after 25 iterations."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = WarmupStepLR(opt, 10, None, step_size=2)
    for _ in range(25):
        opt.step()
        sched.step()
    return sched


def test_load_with_changed_config_warns_and_keeps_current(caplog) -> None:
    caplog.set_level(logging.INFO, logger="mdk.sched.base")
    a = _stepped_25()
    b = WarmupStepLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 10, None,
                     step_size=1)
    b.load_state_dict(a.state_dict())
    assert "differs from the checkpoint" in caplog.text
    assert b.get_last_lr() == [pytest.approx(0.01)]  # it 25 -> epoch 2 with step_size 1


def test_load_keeps_the_current_base_lr(caplog) -> None:
    """A resumed run with another optim.lr goes on with it from the saved iteration (the closed
    form at that iteration with the new base), not with the checkpoint's lr."""
    caplog.set_level(logging.INFO, logger="mdk.sched.base")
    a = _stepped_25()
    opt_b = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3.0)
    b = WarmupStepLR(opt_b, 10, None, step_size=2)
    b.load_state_dict(a.state_dict())
    assert "base lr [3.0] differs from the checkpoint's [1.0]" in caplog.text
    assert b.last_epoch == 25 and b.get_last_lr() == [pytest.approx(0.3)]  # epoch 2: 3.0 * 0.1
    assert opt_b.param_groups[0]["lr"] == pytest.approx(0.3)


GOOD_WARM = {"iters": 10, "start_factor": 0.5, "method": "linear"}


@pytest.mark.parametrize(
    "cls, kwargs, message",
    [
        (WarmupStepLR, {"warmup": {**GOOD_WARM, "start_factor": 0.0}}, "scheduler.warmup.start_factor=0.0 must be a number in (0, 1]"),
        (WarmupStepLR, {"warmup": {**GOOD_WARM, "start_factor": 1.5}}, "scheduler.warmup.start_factor=1.5 must be a number in (0, 1]"),
        (WarmupStepLR, {"warmup": {**GOOD_WARM, "method": "cosine"}}, "scheduler.warmup.method='cosine' must be linear or constant"),
        (WarmupStepLR, {"warmup": {**GOOD_WARM, "iters": -1}}, "scheduler.warmup.iters=-1 must be an integer >= 0"),
        (WarmupStepLR, {"warmup": {**GOOD_WARM, "iters": 1.5}}, "scheduler.warmup.iters=1.5 must be an integer"),
        (WarmupStepLR, {"warmup": {**GOOD_WARM, "itres": 3}}, "scheduler.warmup={'iters': 10, 'start_factor': 0.5, 'method': 'linear', 'itres': 3} has unknown keys ['itres']"),
        (WarmupStepLR, {"interval": "epochs"}, "scheduler.interval='epochs' must be epoch or iter"),
        (WarmupStepLR, {"iters_per_epoch": 0}, "scheduler.iters_per_epoch=0 must be an integer >= 1"),
        (WarmupStepLR, {"step_size": 0}, "scheduler.step_size=0 must be an integer >= 1"),
        (WarmupStepLR, {"gamma": 0}, "scheduler.gamma=0 must be a number > 0"),
        (WarmupMultiStepLR, {"milestones": [8, 8]}, "scheduler.milestones=[8, 8] must be strictly increasing"),
        (WarmupMultiStepLR, {"milestones": "8,11"}, "scheduler.milestones='8,11' must be a list"),
        (WarmupMultiStepLR, {"milestones": [8, "x"]}, "scheduler.milestones[1]='x' must be an integer"),
        (WarmupCosineAnnealingLR, {"T_max": 0}, "scheduler.T_max=0 must be an integer >= 1"),
        (WarmupCosineAnnealingLR, {"eta_min": -1e-3}, "scheduler.eta_min=-0.001 must be a number >= 0"),
        (WarmupCosineAnnealingWarmRestarts, {"T_mult": 0}, "scheduler.T_mult=0 must be an integer >= 1"),
        (WarmupCosineAnnealingWarmRestarts, {"T_0": 2.5}, "scheduler.T_0=2.5 must be an integer"),
    ],
)
def test_bad_values_name_the_key(cls, kwargs, message) -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    kw = {"iters_per_epoch": 10, "warmup": GOOD_WARM, **kwargs}
    with pytest.raises(ValueError) as err:
        cls(opt, **kw)
    assert str(err.value).startswith(message)  # key=value first, as every config check
