"""See a learning-rate schedule before spending compute on it.

Library use (the engine, once per run, rank 0)::

    plot_lr_curve(cfg.scheduler, iters_per_epoch=len(loader), epochs=cfg.trainer.epochs,
                  path=run_dir / "lr.png", base_lr=cfg.optim.lr)

Command line (one curve per point of the planned sweep, Hydra's comma syntax)::

    python -m mdk.tools.plot_lr scheduler=step,cosine scheduler.warmup.iters=0,200 \
        --epochs 12 --iters-per-epoch 60 --out lr.png

The curves are obtained by really stepping the scheduler with a throw-away optimizer, so the plot
shows exactly what a run gets (any LRScheduler factory works, not only :mod:`mdk.sched`).
"""
from __future__ import annotations

import argparse
import itertools
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import torch
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from omegaconf import DictConfig
from torch.optim.lr_scheduler import LRScheduler

log = logging.getLogger(__name__)

SchedulerSource = Union[Callable[..., LRScheduler], Mapping[str, Any]]
DEFAULT_CONFIG_DIR = Path(__file__).resolve().parents[2] / "conf"


def build_scheduler(source: SchedulerSource, optimizer: torch.optim.Optimizer,
                    iters_per_epoch: int) -> LRScheduler:
    """A config node with ``_target_`` (``_partial_: true``) or a factory -> a scheduler."""
    factory = instantiate(source) if isinstance(source, Mapping) else source
    return factory(optimizer=optimizer, iters_per_epoch=iters_per_epoch)


def lr_curve(source: SchedulerSource, iters_per_epoch: int, epochs: int,
             base_lr: float = 1.0) -> list[float]:
    """LR of param group 0 used by each optimizer step ``0 .. epochs*iters_per_epoch - 1``."""
    param = torch.nn.Parameter(torch.zeros(1))
    # grad stays None, so optimizer.step() changes nothing, yet it keeps torch's
    # "scheduler.step() before optimizer.step()" check satisfied.
    opt = torch.optim.SGD([param], lr=base_lr)
    sched = build_scheduler(source, opt, iters_per_epoch)
    lrs = []
    for _ in range(epochs * iters_per_epoch):
        lrs.append(float(opt.param_groups[0]["lr"]))
        opt.step()
        sched.step()
    return lrs


def plot_lr_curves(curves: Mapping[str, Sequence[float]], iters_per_epoch: int,
                   path: str | Path, title: str = "", log_y: bool = False) -> Figure:
    """Draw already-computed curves (label -> lr per iteration) into one PNG at ``path``."""
    # Figure + Agg canvas instead of pyplot: no global backend switch, safe in a training process.
    fig = Figure(figsize=(11, 5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    # A sweep reads best with one colour per value of the first swept key and one line style per
    # combination of the others (labels are "k1=v1 k2=v2 ...").
    colours: dict[str, str] = {}
    styles: dict[str, str] = {}
    palette = [f"C{i}" for i in range(10)]
    dashes = ["-", "--", ":", "-."]
    for label, lrs in curves.items():
        head, _, rest = label.partition(" ")
        colour = colours.setdefault(head, palette[len(colours) % len(palette)])
        style = styles.setdefault(rest, dashes[len(styles) % len(dashes)])
        ax.plot([i / iters_per_epoch for i in range(len(lrs))], lrs, label=label,
                color=colour, linestyle=style, linewidth=1.5)
    ax.set_xlabel("epoch")
    ax.set_ylabel("learning rate")
    if log_y:
        ax.set_yscale("log")
    top = ax.secondary_xaxis(
        "top", functions=(lambda e: e * iters_per_epoch, lambda i: i / iters_per_epoch))
    top.set_xlabel(f"iteration ({iters_per_epoch} per epoch)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    log.info("saved LR curve(s) to %s", path)
    return fig


def plot_lr_curve(scheduler_factory_or_cfg: SchedulerSource, iters_per_epoch: int, epochs: int,
                  path: str | Path, base_lr: float = 1.0, label: str = "lr") -> Figure:
    """Save the PNG of one run's LR schedule (what the engine calls once per run)."""
    lrs = lr_curve(scheduler_factory_or_cfg, iters_per_epoch, epochs, base_lr)
    target = (scheduler_factory_or_cfg.get("_target_", "")
              if isinstance(scheduler_factory_or_cfg, Mapping) else "")
    return plot_lr_curves({label: lrs}, iters_per_epoch, path, title=str(target))


def expand_sweep(overrides: Sequence[str]) -> list[list[str]]:
    """Hydra sweep syntax -> the cartesian product of plain overrides, as ``-m`` would run it.

    Uses Hydra's own override parser, so ``a=1,2`` sweeps while ``a=[1,2]`` stays one list value.
    """
    axes = []
    for ov in OverridesParser.create().parse_overrides(list(overrides)):
        key = ov.get_key_element()
        if ov.is_sweep_override():
            axes.append([f"{key}={v}" for v in ov.sweep_string_iterator()])
        else:
            axes.append([f"{key}={ov.get_value_element_as_str()}"])
    return [list(p) for p in itertools.product(*axes)]


def compose_run(overrides: Sequence[str], epochs: int | None, config_dir: Path) -> DictConfig:
    """Compose the real ``conf/`` for one sweep point.

    With a root ``config.yaml`` the whole config is composed (so ``${trainer.epochs}`` and
    ``optim.lr`` come from it); without one, the scheduler group is composed alone with an explicit
    ``trainer.epochs`` (``--epochs``, default 12).
    """
    has_root = (config_dir / "config.yaml").is_file()
    ovs: list[str] = []
    if has_root:
        ovs += [f"trainer.epochs={epochs}"] if epochs is not None else []
        ovs += list(overrides)
    else:
        ovs.append(f"+trainer.epochs={epochs if epochs is not None else 12}")
        ovs += [f"+{o}" if o.startswith("scheduler=") else o for o in overrides]
        if not any(o.startswith("scheduler=") for o in overrides):
            raise ValueError(f"{config_dir}/config.yaml does not exist, so pass scheduler=<name> "
                             f"(one of {sorted(p.stem for p in (config_dir / 'scheduler').glob('*.yaml'))})")
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return compose(config_name="config" if has_root else None, overrides=ovs)


def sweep_curves(overrides: Sequence[str], iters_per_epoch: int, epochs: int | None = None,
                 base_lr: float | None = None,
                 config_dir: Path = DEFAULT_CONFIG_DIR) -> dict[str, list[float]]:
    """One LR curve per sweep point, labelled by the overrides that vary across the sweep."""
    points = expand_sweep(overrides)
    varying = [i for i in range(len(points[0])) if len({p[i] for p in points}) > 1] if points else []
    curves: dict[str, list[float]] = {}
    for point in points:
        cfg = compose_run(point, epochs, config_dir)
        lr0 = base_lr if base_lr is not None else float(cfg.get("optim", {}).get("lr", 1.0))
        label = " ".join(point[i].removeprefix("scheduler.") for i in varying) or "lr"
        curves[label] = lr_curve(cfg.scheduler, iters_per_epoch, int(cfg.trainer.epochs), lr0)
    return curves


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mdk.tools.plot_lr",
        description="Draw the LR curves of scheduler configs (Hydra overrides, comma = sweep).")
    ap.add_argument("overrides", nargs="*", help="e.g. scheduler=step,cosine scheduler.warmup.iters=0,200")
    ap.add_argument("--epochs", type=int, default=None, help="trainer.epochs (default: the config's, or 12)")
    ap.add_argument("--iters-per-epoch", type=int, default=60)
    ap.add_argument("--base-lr", type=float, default=None, help="default: optim.lr of the config, else 1.0")
    ap.add_argument("--out", default="lr.png")
    ap.add_argument("--log-y", action="store_true")
    ap.add_argument("--config-dir", type=Path, default=DEFAULT_CONFIG_DIR)
    args = ap.parse_args(argv)
    if args.iters_per_epoch < 1:
        ap.error(f"--iters-per-epoch must be >= 1, got {args.iters_per_epoch}")
    try:
        curves = sweep_curves(args.overrides, args.iters_per_epoch, args.epochs, args.base_lr,
                              args.config_dir.resolve())
    except Exception as e:  # noqa: BLE001 - a CLI: show the config error, not a traceback
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    points = expand_sweep(args.overrides)
    fixed = [o for o in points[0] if all(o in p for p in points)]
    title = f"{len(curves)} schedule(s)" + (f" | {' '.join(fixed)}" if fixed else "")
    plot_lr_curves(curves, args.iters_per_epoch, args.out, title=title, log_y=args.log_y)
    print(f"{'curve':<48} {'lr[0]':>10} {'max':>10} {'last':>10} iters")
    for label, lrs in curves.items():
        print(f"{label:<48} {lrs[0]:>10.4g} {max(lrs):>10.4g} {lrs[-1]:>10.4g} {len(lrs)}")
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
