"""scheduler=onecycle: every step equals torch's OneCycleLR (cycle_momentum off), the stage's length
followed (trainer.time re-plans it), an exact resume, bad values in one line, a run that uses it."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from hydra.utils import instantiate
from torch.optim.lr_scheduler import OneCycleLR

from conftest import REPO, TINY, compose, run_cmd_env
from mdk.sched.base import stage_length
from mdk.sched.schedules import WarmupOneCycleLR

BASES = (0.1, 0.02)


def _opt() -> torch.optim.Optimizer:
    return torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": b} for b in BASES])


@pytest.mark.parametrize("total,pct,div,final", [(1500, 0.3, 25.0, 1e4), (7, 0.25, 10.0, 100.0),
                                                 (3, 0.5, 25.0, 1e4), (240, 0.1, 4.0, 1.0)])
def test_every_step_equals_torchs_one_cycle(total, pct, div, final):
    ref_opt = _opt()
    ref = OneCycleLR(ref_opt, max_lr=list(BASES), total_steps=total, pct_start=pct,
                     div_factor=div, final_div_factor=final, cycle_momentum=False)
    ours = WarmupOneCycleLR(_opt(), 100, None, "iter", total_steps=total, pct_start=pct,
                            div_factor=div, final_div_factor=final)
    for it in range(total):
        assert ours.lr_at(it) == [g["lr"] for g in ref_opt.param_groups], it
        ref_opt.step()
        ref.step()
    floor = [b / (div * final) for b in BASES]
    assert ours.lr_at(total + 50) == pytest.approx(floor, rel=1e-12)  # torch raises there; it stays


def test_a_rise_over_the_whole_cycle_ends_at_the_floor():
    s = WarmupOneCycleLR(_opt(), 10, None, "iter", total_steps=20, pct_start=1.0)
    assert s.lr_at(19) == pytest.approx(list(BASES))  # the peak is the last step
    assert s.lr_at(20) == pytest.approx([b / 25 / 1e4 for b in BASES])  # after it: the floor


def test_the_config_follows_the_stage_and_a_resume_is_exact():
    cfg = compose(["trainer.device=cpu", "scheduler=onecycle", "trainer.epochs=6"])
    assert cfg.scheduler.total_steps is None and cfg.scheduler.warmup.iters == 0
    s = instantiate(cfg.scheduler)(optimizer=_opt(), iters_per_epoch=10,
                                   **stage_length(cfg.scheduler, cfg.trainer.epochs))
    assert s.total_steps == 60 and s.interval == "iter"
    assert s.lr_at(0) == pytest.approx([b / 25 for b in BASES])
    assert s.lr_at(17) == pytest.approx(list(BASES))  # the peak: 0.3 * 60 - 1
    s.restage(9)  # trainer.time chose 9 epochs
    assert s.total_steps == 90 and s.lr_at(26) == pytest.approx(list(BASES))
    for _ in range(40):
        s.optimizer.step()
        s.step()
    again = instantiate(cfg.scheduler)(optimizer=_opt(), iters_per_epoch=10, stage_epochs=9)
    again.load_state_dict(s.state_dict())
    for _ in range(50):
        assert [g["lr"] for g in again.optimizer.param_groups] == [g["lr"] for g in s.optimizer.param_groups]
        for x in (s, again):
            x.optimizer.step()
            x.step()


@pytest.mark.parametrize("key,value,line", [
    ("pct_start", 0.0, r"scheduler\.pct_start=0\.0 must be a number in \(0, 1\]"),
    ("div_factor", -1.0, r"scheduler\.div_factor=-1\.0 must be a number"),
    ("total_steps", 1, r"scheduler\.total_steps=1 must be an integer >= 2")])
def test_bad_values_name_the_key(key, value, line):
    with pytest.raises(ValueError, match=line):
        WarmupOneCycleLR(_opt(), 10, None, "iter", **{"total_steps": 100, key: value})
    with pytest.raises(ValueError, match=r"scheduler\.total_steps=None"):
        WarmupOneCycleLR(_opt(), 10, None, "iter")


def test_the_default_run_and_the_recipes_anneal_a_cosine():
    # The one-cycle is an option: from its step1 the default chain ended lower (docs/experiments.md)
    for preset in ([], ["experiment=bccd", "dataset.root=/data/BCCD"], ["experiment=shapes_hard"],
                   ["debug=tiny"]):
        cfg = compose(["trainer.device=cpu", *preset])
        assert cfg.scheduler._target_.endswith("WarmupCosineAnnealingLR") and cfg.optim.lr == 0.002


def test_a_run_trains_with_it_to_the_end_of_its_cycle(tmp_path):
    ck = tmp_path / "ck"
    argv = [sys.executable, str(REPO / "run.py"), *TINY, "scheduler=onecycle", "optim.lr=4e-3",
            f"paths.data={tmp_path / 'data'}", f"paths.checkpoints={ck}",
            f"hydra.run.dir={tmp_path / 'run'}"]
    p = subprocess.run(argv, cwd=REPO, env=dict(run_cmd_env(), OMP_NUM_THREADS="1"),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    last = torch.load(ck / "step1" / "last.pth", weights_only=False)
    sched = last["scheduler"]
    assert sched["schedule"]["class"] == "WarmupOneCycleLR" and last["trainer"]["iter"] == 12
    assert sched["schedule"]["total_steps"] == 12  # 48 images / batch 8 x 2 epochs: the stage
    # after its last step the lr sits at the cycle's floor: 4e-3 / 25 / 1e4
    assert last["optimizer"]["param_groups"][0]["lr"] == pytest.approx(4e-3 / 25 / 1e4)


def test_a_time_budget_sizes_the_cycle_to_the_epochs_it_chose(tmp_path):
    ck = tmp_path / "ck"
    argv = [sys.executable, str(REPO / "run.py"), *TINY, "scheduler=onecycle", "trainer.time=4s",
            "trainer.epochs=500", f"paths.data={tmp_path / 'data'}", f"paths.checkpoints={ck}",
            f"hydra.run.dir={tmp_path / 'run'}"]
    p = subprocess.run(argv, cwd=REPO, env=dict(run_cmd_env(), OMP_NUM_THREADS="1"),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    chose = re.findall(r"the same schedule again: trainer\.epochs=(\d+)", p.stdout)
    assert chose, p.stdout[-3000:]
    last = torch.load(ck / "step1" / "last.pth", weights_only=False)
    # the cycle spans the epochs the budget chose (6 steps an epoch), not trainer.epochs=500
    assert last["scheduler"]["schedule"]["total_steps"] == 6 * int(chose[-1]) < 6 * 500
