"""How well each cost model of the bit-width planner foresees the chain: rank correlation of its
predicted cost with the measured step4 mAP loss over random plans of about the same memory.

    python benchmarks/bench_plan_rank.py --plans 10                      # the built-in shapes
    python benchmarks/bench_plan_rank.py --plans 10 experiment=shapes_hard
    python benchmarks/bench_plan_rank.py --plans 10 experiment=bccd dataset.root=../shared/data/BCCD

1. step1 once (``python run.py``, the overrides' own schedule) into ``<out>/ck``; a folder that
   already holds it (``--out`` again) is reused.
2. Each cost model's table: ``python -m mdk.tools.plan_bits by=<model>`` (``--by``, default loss,
   map and fisher) on ``--images`` val images.
3. ``--plans`` random widths per major layer whose coefficient memory lies between ``--low`` and 1
   times that of today's widths, and today's widths, each trained from the same step1 through
   ``pipeline=[step2,cal,step3,step4] model.net.mask_bits=[...]`` (the stages' own lengths;
   ``+stages.<s>.epochs=N`` overrides shorten them), once per ``--seeds`` seed (the fine-tuning
   stages' seed; step1 is shared), ``--parallel`` at a time.
4. Per cost model: the Spearman and Kendall correlation between a plan's predicted summed cost
   and its step4 mAP loss against today's widths, both means over the seeds (higher: the cost
   ranks plans as the chain does). With several seeds also the seed-to-seed Spearman of the
   measured losses: how well the yardstick agrees with itself, the most a cost can show.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torchmetrics.functional import kendall_rank_corrcoef, spearman_corrcoef

import common

from mdk.tools import plan_bits

CHAIN = "pipeline=[step2,cal,step3,step4]"


def step4_map(record: dict) -> float:
    return next(s["best_map50"] for s in record["stages"] if s["stage"] == "step4")


def random_plans(table: dict, n: int, low: float, seed: int) -> list[tuple[int, ...]]:
    """``n`` different widths per major layer whose memory lies in [low, 1] x the budget's."""
    weights = [m["weights"] for m in table["major_layers"]]
    widths, budget = table["widths"], table["budget_bits"]
    rng, plans, tries = random.Random(seed), [], 0
    while len(plans) < n:
        tries += 1
        if tries > 100_000:
            raise SystemExit(f"found only {len(plans)} plans with memory in [{low}, 1] x today's: "
                             "lower --low or --plans")
        bits = tuple(rng.choice(widths) for _ in weights)
        if low * budget <= sum(w * b for w, b in zip(weights, bits)) <= budget and bits not in plans:
            plans.append(bits)
    return plans


def predicted(table: dict, bits: tuple[int, ...]) -> float:
    return sum(m["cost"][str(b)] for m, b in zip(table["major_layers"], bits))


def per_layer(table: dict, bits: tuple[int, ...]) -> list[int]:
    return [b for m, b in zip(table["major_layers"], bits) for _ in m["layers"]]


def correlation(fn, pred: torch.Tensor, measured: torch.Tensor) -> str:
    """``fn``'s rank correlation, or ``n/a`` where one side has no spread (all plans tied)."""
    if len(pred) < 2 or bool((pred == pred[0]).all()) or bool((measured == measured[0]).all()):
        return "n/a"
    return f"{float(fn(pred, measured)):+.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", type=int, default=10, help="random plans (K)")
    ap.add_argument("--by", nargs="+", default=["loss", "map", "fisher"], choices=plan_bits.BY)
    ap.add_argument("--images", type=int, default=200, help="val images the costs are taken on")
    ap.add_argument("--low", type=float, default=0.9,
                    help="a plan's memory is at least this fraction of today's widths' memory")
    ap.add_argument("--seed", type=int, default=0, help="the draw of the plans")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0],
                    help="seeds of each plan's chain; its loss is the mean over them")
    ap.add_argument("--parallel", type=int, default=1, help="chains trained at a time")
    ap.add_argument("--out", help="folder of the runs (default: a new one under outputs/)")
    common.add_smoke_flag(ap)
    args, overrides = ap.parse_known_args()
    # +stages.<s>.* shorten the fine-tuning stages: the chains' overrides, not step1's
    step1 = [o for o in overrides if not o.startswith("+stages.")]
    if args.smoke:
        # one plan beside today's widths, two seeds: four chains, every line printed (a
        # correlation over one plan is n/a); each chain is a whole run.py process
        args.plans, args.images, args.parallel, args.low, args.seeds = 1, 8, 2, 0.5, [0, 1]
        args.out = args.out or str(common.smoke_dir() / "rank")
        step1 = [*common.SMOKE, f"paths.data={common.smoke_dir()}/data", "trainer.epochs=1",
                 "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", *step1]
        overrides = [*step1, *[f"+stages.{s}.epochs=1" for s in ("step2", "step3", "step4")],
                     *overrides]
    out = Path(args.out or common.REPO / "outputs" / "bench_plan_rank" / time.strftime("%Y%m%d-%H%M%S"))
    ck = out / "ck"
    threads = max(1, (os.cpu_count() or 1) // max(1, args.parallel))
    print(common.machine())
    print(f"{args.plans} random plans x seeds {args.seeds}, costs by {', '.join(args.by)} on "
          f"{args.images} val images; runs in {out}", flush=True)
    t0 = time.perf_counter()
    if not (ck / "step1" / "best.pth").is_file():
        common.sweep_job([*step1, "pipeline=[step1]", f"paths.checkpoints={ck}"], out / "step1",
                         os.cpu_count() or 1)
    tables = {}
    for by in args.by:
        doc = out / f"costs_{by}.json"
        tool = ["budget=1", f"images={args.images}", f"by={by}", f"out={doc}", *step1,
                f"paths.checkpoints={ck}"]
        with open(out / f"costs_{by}.txt", "w") as text, contextlib.redirect_stdout(text):
            status = plan_bits.main(tool)  # its table and plan: in costs_<by>.txt
        if status != 0:
            raise SystemExit(f"plan_bits by={by} failed (its line above)")
        tables[by] = json.loads(doc.read_text())
    first = tables[args.by[0]]
    plans = random_plans(first, args.plans, args.low, args.seed)

    def chain(name: str, mask_bits: list[int] | None, seed: int) -> float:
        plan_ck = out / name / f"seed{seed}" / "ck"
        (plan_ck / "step1").mkdir(parents=True, exist_ok=True)
        for f in (ck / "step1").iterdir():  # the same step1 for every plan
            target = plan_ck / "step1" / f.name
            if f.is_file() and not target.exists():
                os.link(f, target)
        widths = [f"model.net.mask_bits=[{','.join(map(str, mask_bits))}]"] if mask_bits else []
        args = [*overrides, CHAIN, *widths, f"seed={seed}", f"paths.checkpoints={plan_ck}"]
        return step4_map(common.sweep_job(args, plan_ck.parent / "sweep", threads))

    names = ["today", *(f"plan{k}" for k in range(len(plans)))]
    widths = dict(zip(names, [None, *(per_layer(first, p) for p in plans)]))
    jobs = [(n, s) for s in args.seeds for n in names]
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        done = pool.map(lambda j: chain(j[0], widths[j[0]], j[1]), jobs)
        maps = torch.tensor(list(done), dtype=torch.float64).view(len(args.seeds), len(names))
    per_seed = maps[:, :1] - maps[:, 1:]  # [seeds, plans]: each plan's loss against today's widths
    loss, mean_map = per_seed.mean(0), maps.mean(0)
    seeds = f" (seeds {', '.join(f'{float(v):.4f}' for v in maps[:, 0])})"
    print(f"step4 mAP with today's widths: {float(mean_map[0]):.4f}"
          + (seeds if len(args.seeds) > 1 else ""))
    print("plan  memory  widths per major layer  step4 mAP  loss    " +
          "  ".join(f"{by:>9}" for by in args.by))
    for k, p in enumerate(plans):
        memory = sum(m["weights"] * b for m, b in zip(first["major_layers"], p)) / first["budget_bits"]
        print(f"{k:>4}  {memory:>6.3f}  {str(list(p)):<22}  {float(mean_map[k + 1]):>9.4f}  "
              f"{float(loss[k]):+.4f}  " + "  ".join(f"{predicted(tables[by], p):>+9.4f}"
                                                      for by in args.by))
    if len(args.seeds) > 1:
        pairs = [(a, b) for a in range(len(args.seeds)) for b in range(a + 1, len(args.seeds))]
        rho = [correlation(spearman_corrcoef, per_seed[a], per_seed[b]) for a, b in pairs]
        print("seed-to-seed Spearman of the measured losses (the most a cost can show): "
              + ", ".join(f"seeds {args.seeds[a]}/{args.seeds[b]} {r}"
                          for (a, b), r in zip(pairs, rho)))
    print("cost model  Spearman  Kendall   (rank correlation with the step4 mAP loss)")
    for by in args.by:
        pred = torch.tensor([predicted(tables[by], p) for p in plans], dtype=torch.float64)
        print(f"{by:<10}  {correlation(spearman_corrcoef, pred, loss):>8}  "
              f"{correlation(kendall_rank_corrcoef, pred, loss):>7}")
    print(f"total: {time.perf_counter() - t0:.1f} s wall ({common.load()})")


if __name__ == "__main__":
    main()
