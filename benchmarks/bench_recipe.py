"""A recipe (conf/experiment/) on a dataset folder, over seeds: per-stage and per-class mAP, wall time.

    python benchmarks/bench_recipe.py --recipe none --seeds 0 1 2   # python run.py: time to 0.90
    python benchmarks/bench_recipe.py --recipe bccd --root ../shared/data/BCCD --seeds 0 1 2
    python benchmarks/bench_recipe.py --recipe bccd --root /data/MyVOC \\
        'dataset.class_names=[a,b]' dataset.num_classes=2          # any VOC folder
    python benchmarks/bench_recipe.py --recipe bccd --root /data/coco dataset=coco ...  # COCO

Each seed is one ``python run.py -m experiment=<recipe> dataset.root=<root> seed=<s>`` (its own
sweep folder under ``--out``: result.json per stage, checkpoints, logs), ``--parallel`` of them at
a time with the cores shared out (``dist.cpu_threads``); extra arguments are overrides of every
run. The table gives each stage's mean +- std over seeds of the evaluation metric (the recipe's
``eval.metric``, VOC07 11-point mAP@0.5 by default), each class's mean AP, and the mean wall time
of the stage. ``--recipe none``: the defaults of ``python run.py`` (the built-in data, no
``--root``). ``--time-to MAP`` (default 0.90): per seed, the time from the command's start to
the first evaluation at or above MAP (the log's epoch lines), the first result a user waits for;
add ``trainer.eval_every=1`` to see it to the epoch (the evaluations then count in the time).
``--smoke`` runs the bccd recipe's whole chain on a tiny generated VOC folder.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import common


EVAL_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\].*epoch (\d+)/\d+  val mAP@0\.5 "
                       r"([0-9.]+)")


def run_seed(recipe: str, root: Optional[str], seed: int, out: Path, threads: int,
             overrides: list[str]) -> dict:
    """One seed's run of the recipe; its result.json (the sweep job's record), with ``started``:
    the command's start (local time, as the log's)."""
    args = ([] if recipe == "none" else [f"experiment={recipe}"]) + \
        ([f"dataset.root={root}"] if root else [])
    started = datetime.datetime.now()
    rec = common.sweep_job([*args, f"seed={seed}", *overrides], out / f"seed{seed}", threads)
    return {**rec, "started": started, "log": out / f"seed{seed}" / "bench.log"}


def time_to(rec: dict, target: float) -> str:
    """When a seed's evaluations first reached ``target`` (from its log's epoch lines)."""
    seen = None
    for line in Path(rec["log"]).read_text().splitlines():
        m = EVAL_LINE.match(line)
        if not m:
            continue
        at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
        seen = (at, int(m.group(2)), float(m.group(3)))
        if seen[2] >= target:
            secs = (at - rec["started"]).total_seconds()
            return (f"{target:g} reached at epoch {seen[1]}, {secs // 60:.0f} min {secs % 60:02.0f} s "
                    f"after the command")
    return f"{target:g} not reached (last evaluation: epoch {seen[1]}, {seen[2]:.4f})" if seen \
        else "no evaluation in the log"


def _mean_std(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.fmean(xs):.4f} ± {sd:.4f}"


def table(records: list[dict], class_names: list[str]) -> list[str]:
    """One line per stage: mean +- std of its best metric, the classes' mean AP, the wall time."""
    stages: dict[str, list[dict]] = {}
    for rec in records:
        for st in rec.get("stages") or []:
            stages.setdefault(st["stage"], []).append(st)
    width = max([len(c) for c in class_names] + [6])
    head = f"{'stage':<8} {'mAP mean ± std':<17} " + " ".join(f"{c:>{width}}" for c in class_names)
    lines = [head + "   wall s"]
    for name, runs in stages.items():
        maps = [r["best_map50"] for r in runs if r.get("best_map50") is not None]
        if not maps:
            continue
        aps = [r["ap"] for r in runs if r.get("ap")]
        per_class = [statistics.fmean(a[k] for a in aps) if aps else float("nan")
                     for k in range(len(class_names))]
        wall = statistics.fmean(r.get("time_s") or 0.0 for r in runs)
        lines.append(f"{name:<8} {_mean_std(maps):<17} "
                     + " ".join(f"{v:>{width}.4f}" for v in per_class) + f"   {wall:.1f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="bccd", help="a conf/experiment/ name, or none")
    ap.add_argument("--time-to", type=float, default=0.90, metavar="MAP",
                    help="each seed's time to its first evaluation at or above MAP (0.90)")
    ap.add_argument("--root", help="the dataset folder (dataset.root)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--parallel", type=int, default=1,
                    help="seeds run at a time (the cores are shared out between them)")
    ap.add_argument("--out", help="folder of the runs (default: a new one under outputs/)")
    common.add_smoke_flag(ap)
    args, overrides = ap.parse_known_args()
    if args.smoke:
        from mdk.data.shapes import SHAPE_CLASSES, ensure_shapes_dataset

        root = ensure_shapes_dataset(common.smoke_dir() / "voc", num_train=32, num_val=8,
                                     image_size=64, seed=0)
        args.root, args.seeds, args.out = str(root), [0], str(common.smoke_dir() / "runs")
        args.time_to = 0.0  # the line, whatever the mAP
        names = list(SHAPE_CLASSES)
        overrides = [f"dataset.class_names=[{','.join(names)}]", f"dataset.num_classes={len(names)}",
                     "debug=tiny_model", "trainer.epochs=1", "trainer.limit_train_batches=2",
                     "trainer.limit_val_batches=1", f"paths.data={common.smoke_dir()}/data",
                     *overrides]
    if not args.root and args.recipe != "none":
        ap.error("--root is required (the dataset folder the recipe runs on)")
    out = Path(args.out or common.REPO / "outputs" / "bench_recipe" / time.strftime("%Y%m%d-%H%M%S"))
    threads = max(1, (os.cpu_count() or 1) // max(1, args.parallel))
    print(common.machine())
    print(f"recipe {args.recipe} on {args.root}, seeds {args.seeds}, {args.parallel} at a time "
          f"with {threads} thread(s) each; runs in {out}", flush=True)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        records = list(pool.map(lambda s: run_seed(args.recipe, args.root, s, out, threads,
                                                   overrides), args.seeds))
    total = time.perf_counter() - t0
    cfg = common.compose(([] if args.recipe == "none" else [f"experiment={args.recipe}"])
                         + ([f"dataset.root={args.root}"] if args.root else []) + overrides)
    from mdk.data.class_names import fill_class_names  # after compose: mdk imports the config

    fill_class_names(cfg)  # a class list left out is read from the data, as the runs read it
    metric = records[0]["stages"][0].get("metric") or str(cfg.eval.metric)
    print(f"{metric} on the val split, {len(records)} seed(s):")
    for line in table(records, list(cfg.dataset.class_names)):
        print(line)
    if args.time_to is not None:
        for seed, rec in zip(args.seeds, records):
            print(f"seed {seed}: {time_to(rec, args.time_to)}")
    print(f"all seeds: {total:.1f} s wall ({common.load()})")


if __name__ == "__main__":
    main()
