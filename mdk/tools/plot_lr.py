"""See a learning-rate schedule before spending compute on it: one curve per point of the planned
sweep (Hydra's comma syntax; docs/schedulers.md, "Seeing the curve"). The curves come from really
stepping the scheduler with a throw-away optimizer, so the plot shows exactly what a run gets.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from mdk.compose import CONF_DIR, compose
from mdk.sched.curve import lr_curve, plot_lr_curves


def expand_sweep(overrides: Sequence[str]) -> list[list[str]]:
    """Hydra sweep syntax -> the cartesian product of plain overrides, as ``-m`` would run it
    (Hydra's own parser: ``a=1,2`` sweeps, ``a=[1,2]`` stays one list value)."""
    axes = []
    for ov in OverridesParser.create().parse_overrides(list(overrides)):
        key = ov.get_key_element()
        if ov.is_sweep_override():
            axes.append([f"{key}={v}" for v in ov.sweep_string_iterator()])
        else:
            axes.append([f"{key}={ov.get_value_element_as_str()}"])
    return [list(p) for p in itertools.product(*axes)]


def compose_run(overrides: Sequence[str], epochs: int | None, config_dir: Path) -> DictConfig:
    """Compose ``config_dir`` for one sweep point; without a root ``config.yaml`` the scheduler
    group alone, with ``trainer.epochs`` from ``--epochs`` (default 12)."""
    has_root = (config_dir / "config.yaml").is_file()
    if has_root:
        ovs = ([f"trainer.epochs={epochs}"] if epochs is not None else []) + list(overrides)
    else:
        ovs = [f"+trainer.epochs={epochs if epochs is not None else 12}"]
        ovs += [f"+{o}" if o.startswith("scheduler=") else o for o in overrides]
        if not any(o.startswith("scheduler=") for o in overrides):
            raise ValueError(f"{config_dir}/config.yaml does not exist, so pass scheduler=<name> "
                             f"(one of {sorted(p.stem for p in (config_dir / 'scheduler').glob('*.yaml'))})")
    return compose(ovs, config_name="config" if has_root else None, config_dir=config_dir)


def sweep_curves(overrides: Sequence[str], iters_per_epoch: int, epochs: int | None = None,
                 base_lr: float | None = None,
                 config_dir: Path = CONF_DIR) -> dict[str, list[float]]:
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
    ap.add_argument("--config-dir", type=Path, default=CONF_DIR)
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
