"""A learning-rate schedule as a curve and a PNG (``lr_<stage>.png``, ``mdk.tools.plot_lr``).

The curve steps the real scheduler on a throw-away optimizer, so it is exactly what a run gets
(any LRScheduler factory works).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch.optim.lr_scheduler import LRScheduler

from mdk.sched.base import stage_length
from mdk.targets import build

log = logging.getLogger(__name__)

SchedulerSource = Union[Callable[..., LRScheduler], Mapping[str, Any]]


def lr_curve(source: SchedulerSource, iters_per_epoch: int, epochs: int,
             base_lr: float = 1.0) -> list[float]:
    """LR of param group 0 used by each optimizer step ``0 .. epochs*iters_per_epoch - 1``;
    ``source``: a config node with ``_target_`` (``_partial_: true``) or a scheduler factory."""
    param = torch.nn.Parameter(torch.zeros(1))
    # grad stays None: optimizer.step() changes nothing but satisfies torch's step-order check.
    opt = torch.optim.SGD([param], lr=base_lr)
    if isinstance(source, Mapping):
        sched = build(source, "scheduler", optimizer=opt, iters_per_epoch=iters_per_epoch,
                      **stage_length(source, epochs))
    else:
        sched = source(optimizer=opt, iters_per_epoch=iters_per_epoch)
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
    dashes = ["-", "--", ":", "-."]
    for label, lrs in curves.items():
        head, _, rest = label.partition(" ")
        colour = colours.setdefault(head, f"C{len(colours) % 10}")  # matplotlib's 10 colours
        style = styles.setdefault(rest, dashes[len(styles) % len(dashes)])
        ax.plot([i / iters_per_epoch for i in range(len(lrs))], lrs, label=label,
                color=colour, linestyle=style, linewidth=1.5)
    ax.set_xlabel(f"epoch ({iters_per_epoch} iterations each)")
    ax.set_ylabel("learning rate")
    if log_y:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    if len(curves) > 1:  # a sweep's: the legend beside the axes, laid out around it
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
    else:
        # A run's own curve (every stage draws one): fixed margins that fit the tick labels.
        # tight_layout would draw the figure once more only to measure them (half the time).
        fig.subplots_adjust(left=0.09, right=0.98, bottom=0.11, top=0.93)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    log.info("saved LR curve(s) to %s", path)
    return fig


def plot_lr_curve(source: SchedulerSource, iters_per_epoch: int, epochs: int,
                  path: str | Path, base_lr: float = 1.0) -> Figure:
    """Save the PNG of one run's LR schedule."""
    lrs = lr_curve(source, iters_per_epoch, epochs, base_lr)
    target = source.get("_target_", "") if isinstance(source, Mapping) else ""
    return plot_lr_curves({"lr": lrs}, iters_per_epoch, path, title=str(target))
