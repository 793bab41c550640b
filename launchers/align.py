"""Prove that W processes train the same model as one: ``python -m launchers.align``.

    python -m launchers.align --worlds 2,4 --batch-size 8 --iters 20 [--dtype float64]
                              [--exact-chunk C | --allreduce] [k=v ...]

Trains world 1 and each W from the same initial weights with the real engine and compares every
tensor of the final states (mdk.tools.ckpt_diff); exit status 1 above ``--tol``. What is made
equal, the two modes (bit-identical exact chunks; DDP's all-reduce against a noise floor) and
why: docs/distributed.md, "Alignment" and "World-size-invariant gradients".
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from launchers.processes.spawn import run_ranks
from mdk.compose import compose
from mdk.config import validate
from mdk.dist_config import check_split
from mdk.engine import build
from mdk.models.build import build_model
from mdk.engine.align_rank import alignment_config, perturb, train_rank
from mdk.data.class_names import fill_class_names
from mdk.errors import ConfigError
from mdk.tools.ckpt_diff import diff_state_dicts, format_table
from mdk.world import World

log = logging.getLogger("launchers.align")


def validated_config(overrides: list[str]) -> DictConfig:
    """The real conf/ plus ``overrides``, validated and resolved."""
    cfg = compose(overrides)
    fill_class_names(cfg)  # a class list left out is read from the data, as a run reads it
    validate(cfg)
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))


def run_alignment(cfg: DictConfig, worlds: list[int], batch_size: int, iters: int,
                  dtype: str = "float32", out: Optional[Path] = None,
                  noise_floor: float = 0.0, exact_chunk: Optional[int] = None) -> dict[Any, list]:
    """Train world 1 and every W in ``worlds`` from the same weights; {W: [TensorDiff, ...]}.
    ``exact_chunk``: world-size-invariant gradients; None: DDP's all-reduce. ``noise_floor > 0``
    adds ``"floor"``: world 1 from weights times (1 + noise_floor * N(0, 1)), how far training
    carries a rounding-sized change (no split can end closer)."""
    for w in worlds:  # (--batch-size is trainer.batch_size, --exact-chunk dist.exact_chunk)
        try:
            check_split(batch_size, w, exact_chunk, "world")
        except ConfigError as e:
            raise SystemExit(f"align: {e}") from None
    out = Path(out or tempfile.mkdtemp(prefix="mdk-align-"))
    out.mkdir(parents=True, exist_ok=True)
    acfg = alignment_config(cfg, batch_size, iters, dtype, out, exact_chunk)
    build.seed_everything(acfg.seed)
    model = build_model(acfg)
    torch.save(model.state_dict(), out / "init.pth")
    if noise_floor > 0:
        torch.save(perturb(model.state_dict(), noise_floor), out / "init_floor.pth")
    build.build_data(acfg, model.grid, World())  # generate the built-in data once, before spawning
    runs: list[tuple[Any, dict]] = [(w, {"dist": {"gpus": w}}) for w in sorted(set([1, *worlds]))]
    if noise_floor > 0:  # world 1 again, from init_floor.pth
        runs.append(("floor", {"dist": {"gpus": 1}, "align": {"tag": "_floor"}}))
    states = {}
    for key, over in runs:
        res = run_ranks(OmegaConf.merge(acfg, over), out, train_rank)
        w = over["dist"]["gpus"]
        log.info("%s: world %d x batch %d, %d iterations, last loss %.6f", key, w, batch_size // w,
                 res["iters"], res["loss"])
        states[key] = torch.load(res["path"], weights_only=True)["model"]
    report = {}
    for w in [k for k, _ in runs if k != 1]:
        diffs, problems = diff_state_dicts(states[1], states[w])
        if problems:
            raise RuntimeError(f"world {w} state differs in structure: {problems[:5]}")
        report[w] = diffs
    return report


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launchers.align", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="2", help="world sizes to compare with world 1, e.g. 2,4")
    ap.add_argument("--batch-size", type=int, default=8, help="global batch size")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--tol", type=float, default=None,
                    help="max relative parameter difference (default 0 with world-size-invariant "
                         "gradients: bit-identical; with --allreduce 1e-6, float64: 1e-12)")
    ap.add_argument("--out", type=Path, default=None, help="where the states and logs go")
    ap.add_argument("--top", type=int, default=10, help="tensors listed per world (worst first)")
    red = ap.add_mutually_exclusive_group()
    red.add_argument("--exact-chunk", type=int, default=None, metavar="C",
                     help="world-size-invariant gradients in chunks of C images (dist.exact_chunk); "
                          "default in float32: batch-size / max(worlds)")
    red.add_argument("--allreduce", action="store_true",
                     help="check DDP's own all-reduce instead (the default in float64)")
    ap.add_argument("--noise-floor", type=float, default=None, metavar="REL",
                    help="also train world 1 from the initial weights perturbed by REL "
                         "(default 1e-7 with --allreduce in float32, else off) and print how far "
                         "that drifts: the float32 noise floor of this configuration")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model.image_size=96")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s] %(message)s")
    worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
    allreduce = args.allreduce or (args.dtype == "float64" and args.exact_chunk is None)
    chunk = None if allreduce else (args.exact_chunk or args.batch_size // max(worlds, default=1))
    tol = args.tol if args.tol is not None else (
        0.0 if chunk else 1e-12 if args.dtype == "float64" else 1e-6)
    floor = args.noise_floor if args.noise_floor is not None else (
        1e-7 if args.dtype == "float32" and allreduce else 0.0)
    how = (f"world-size-invariant gradients, chunks of {chunk} images, 1 CPU thread per process"
           if chunk else "DDP all-reduce")
    report = run_alignment(validated_config(args.overrides), worlds, args.batch_size, args.iters,
                           args.dtype, args.out, floor, chunk)
    ok = True
    floor_diffs = report.pop("floor", None)
    for w, diffs in report.items():
        worst = max(diffs, key=lambda d: d.max_rel)
        print(f"\n== world 1 x {args.batch_size} vs world {w} x {args.batch_size // w} "
              f"({args.iters} iterations, {args.dtype}, {how}) ==")
        print(format_table(diffs, args.top))
        same = sum(d.max_abs == 0 for d in diffs)
        print(f"largest relative difference {worst.max_rel:.3e} ({worst.name}); largest absolute "
              f"{max(d.max_abs for d in diffs):.3e}; bit-identical tensors {same}/{len(diffs)}")
        ok &= worst.max_rel <= tol
    if floor_diffs is not None:
        f = max(floor_diffs, key=lambda d: d.max_rel)
        print(f"\nnoise floor: world 1 from initial weights x (1 + {floor:g} N(0,1)) vs world 1 "
              f"after {args.iters} iterations: largest relative difference {f.max_rel:.3e} "
              f"({f.name}). A split cannot be expected to end closer than this; a DDP difference "
              "far above it points at a real bug (gradient averaging, batch split, seeding).")
    print("OK: all within" if ok else "FAIL: above", f"tol={tol:g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
