"""conf/scheduler/* compose and instantiate as the engine will call them; the LR plot tool."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mdk.compose import CONF_DIR
from mdk.sched.base import WarmupScheduler, stage_length
from mdk.tools import plot_lr
from mdk.sched.curve import lr_curve, plot_lr_curve, plot_lr_curves
from mdk.tools.plot_lr import (
    compose_run,
    expand_sweep,
    sweep_curves,
)

NAMES = {
    "step": "WarmupStepLR",
    "multistep": "WarmupMultiStepLR",
    "cosine": "WarmupCosineAnnealingLR",
    "cosine_restarts": "WarmupCosineAnnealingWarmRestarts",
}
ONECYCLE = {"onecycle": "WarmupOneCycleLR"}  # its rise is its warmup: tests/test_sched_onecycle.py
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_every_scheduler_option_exists() -> None:
    assert sorted(p.stem for p in (CONF_DIR / "scheduler").glob("*.yaml")) == sorted(NAMES | ONECYCLE)


@pytest.mark.parametrize("name", sorted(NAMES))
def test_config_instantiates_as_the_engine_calls_it(name: str) -> None:
    cfg = compose_run([f"scheduler={name}"], epochs=13, config_dir=CONF_DIR)
    node = cfg.scheduler
    assert node._partial_ is True
    # mode and epochs were added by issue #16 (GTI warmup); their defaults keep the old behaviour
    assert set(node.warmup) == {"iters", "start_factor", "method", "mode", "epochs"}
    assert node.warmup.start_factor == 0.5 and node.warmup.method == "linear"
    assert node.warmup.mode == "mdk" and node.warmup.epochs == 0
    assert node.interval == "epoch"
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = instantiate(node)(optimizer=opt, iters_per_epoch=60,
                              **stage_length(node, int(cfg.trainer.epochs)))
    assert type(sched).__name__ == NAMES[name] and isinstance(sched, WarmupScheduler)
    assert sched.get_last_lr() == [pytest.approx(0.05)]  # starts at start_factor x base
    # short default run: warmup ends well inside the first epochs of a ~13 x 60 iteration run
    assert 0 < sched.warmup_iters <= 60
    if name == "cosine":
        assert node.T_max is None and sched.T_max == 13  # null: the stage's length


def test_override_reaches_the_scheduler_and_bad_value_names_key() -> None:
    cfg = compose_run(["scheduler=multistep", "scheduler.interval=iter",
                       "scheduler.milestones=[300,500]", "scheduler.warmup.iters=0"],
                      epochs=12, config_dir=CONF_DIR)
    lrs = lr_curve(cfg.scheduler, iters_per_epoch=60, epochs=12, base_lr=1.0)
    assert len(lrs) == 720
    assert lrs[299] == pytest.approx(1.0) and lrs[300] == pytest.approx(0.1)
    assert lrs[500] == pytest.approx(0.01)
    bad = compose_run(["scheduler=step", "scheduler.warmup.start_factor=1.5"], 12, CONF_DIR)
    with pytest.raises(ValueError, match=r"^scheduler\.warmup\.start_factor=1\.5 must be a number in \(0, 1\]$"):
        lr_curve(bad.scheduler, 60, 12)


def test_expand_sweep_is_the_cartesian_product_and_keeps_lists() -> None:
    points = expand_sweep(["scheduler=step,cosine", "scheduler.warmup.iters=0,200",
                           "scheduler.milestones=[4,8]"])
    assert points == [
        ["scheduler=step", "scheduler.warmup.iters=0", "scheduler.milestones=[4,8]"],
        ["scheduler=step", "scheduler.warmup.iters=200", "scheduler.milestones=[4,8]"],
        ["scheduler=cosine", "scheduler.warmup.iters=0", "scheduler.milestones=[4,8]"],
        ["scheduler=cosine", "scheduler.warmup.iters=200", "scheduler.milestones=[4,8]"],
    ]


def test_plot_lr_curve_one_run(tmp_path: Path) -> None:
    cfg = compose_run(["scheduler=cosine"], epochs=10, config_dir=CONF_DIR)
    out = tmp_path / "run" / "lr.png"
    fig = plot_lr_curve(cfg.scheduler, iters_per_epoch=20, epochs=10, path=out, base_lr=0.01)
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    (line,) = fig.axes[0].get_lines()
    y = line.get_ydata()
    assert len(y) == 200 and y[0] == pytest.approx(0.005)  # 0.5 x 0.01 at iteration 0
    assert line.get_xdata()[20] == pytest.approx(1.0)  # x axis in epochs


def test_plot_takes_a_plain_factory(tmp_path: Path) -> None:
    def factory(optimizer, iters_per_epoch):
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=iters_per_epoch, gamma=0.5)

    fig = plot_lr_curve(factory, iters_per_epoch=5, epochs=3, path=tmp_path / "f.png")
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == [1.0] * 5 + [0.5] * 5 + [0.25] * 5


def test_sweep_draws_one_curve_per_point(tmp_path: Path) -> None:
    curves = sweep_curves(["scheduler=step,cosine", "scheduler.warmup.iters=0,200"],
                          iters_per_epoch=60, epochs=12, base_lr=1.0)
    assert list(curves) == ["scheduler=step warmup.iters=0", "scheduler=step warmup.iters=200",
                            "scheduler=cosine warmup.iters=0", "scheduler=cosine warmup.iters=200"]
    assert all(len(v) == 720 for v in curves.values())
    # step default: 0.1x at epoch 5, warmup 200 from 0.5 linear
    assert curves["scheduler=step warmup.iters=0"][299:301] == pytest.approx([1.0, 0.1])
    assert curves["scheduler=step warmup.iters=200"][100] == pytest.approx(0.75)
    fig = plot_lr_curves(curves, 60, tmp_path / "sweep.png")
    assert len(fig.axes[0].get_lines()) == 4
    assert len(fig.axes[0].get_legend().get_texts()) == 4
    assert (tmp_path / "sweep.png").read_bytes().startswith(PNG_MAGIC)


def test_cli(tmp_path: Path, capsys) -> None:
    out = tmp_path / "lr.png"
    rc = plot_lr.main(["scheduler=step,multistep,cosine,cosine_restarts",
                       "scheduler.warmup.iters=0,200", "--epochs", "12",
                       "--iters-per-epoch", "60", "--out", str(out)])
    assert rc == 0 and out.read_bytes().startswith(PNG_MAGIC)
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("scheduler=")]
    assert len(rows) == 8 and all(r.endswith(" 720") for r in rows)
    rc = plot_lr.main(["scheduler=step", "scheduler.warmup.method=cosine", "--out", str(out)])
    assert rc == 2
    assert "scheduler.warmup.method='cosine' must be linear or constant" in capsys.readouterr().err


def test_scheduler_group_alone_without_root_config(tmp_path: Path) -> None:
    """Before/without conf/config.yaml the tool composes the scheduler group alone."""
    conf = tmp_path / "conf"
    (conf / "scheduler").mkdir(parents=True)
    for p in (CONF_DIR / "scheduler").glob("*.yaml"):
        (conf / "scheduler" / p.name).write_text(p.read_text())
    cfg = compose_run(["scheduler=cosine"], epochs=7, config_dir=conf)
    assert OmegaConf.to_container(cfg, resolve=True)["scheduler"]["T_max"] is None
    lrs = lr_curve(cfg.scheduler, 10, int(cfg.trainer.epochs), 1.0)  # annealed over the 7 epochs
    assert lrs[0] > lrs[-1] > 0 and lrs[-10] == lrs[-1]
    with pytest.raises(ValueError, match="pass scheduler=<name>"):
        compose_run([], epochs=7, config_dir=conf)
