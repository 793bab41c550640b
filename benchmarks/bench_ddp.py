"""Training throughput on CPU: 2 gloo processes vs 1 process, one thread per process.

    python benchmarks/bench_ddp.py [--iters 30] [--batch-size 16] [--world 2] [--exact-chunk C]
                                   [k=v overrides]

Both runs use the real engine (GlobalBatchSampler, DDP, the training loop) on the same global
batch; the ratio of images/s is printed (the goal on an idle 2-core machine is >= 1.8x).
``--exact-chunk C`` also times the W-process run with world-size-invariant gradients
(dist.exact_chunk=C) and prints what that mode costs against DDP's all-reduce. Timing
starts after warm-up iterations and is taken on rank 0 between two barriers. Not a test: numbers
depend on what else runs on the machine, so the load average is printed next to them.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (puts the repo on sys.path)
import torch  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from mdk.world import World  # noqa: E402

# The default model (gnetdet_small) on a smaller generated split. Data is loaded in each
# training process (num_workers=0): with one thread per process the comparison is about
# processes, and a loader worker would hand the 1-process run a second core for free.
# `model.image_size=96 dataset.generate.image_size=96` shows the small-step case (gloo's
# per-step all-reduce then weighs more). CPU processes (gloo) also where CUDA exists.
DEFAULTS = ["dataset.generate.num_train=512", "dataset.generate.num_val=16", "logger=none",
            "trainer.progress=false", "trainer.amp=false", "dataset.num_workers=0",
            "trainer.device=cpu"]


def bench_rank(cfg: DictConfig, run_dir: Path, world: World) -> dict:
    """Train warm-up + timed iterations on this rank; rank 0 returns images/s."""
    from mdk import dist
    from mdk.engine import build
    from mdk.models.build import build_model
    from mdk.engine.loop import HookBase, Trainer
    from mdk.engine.build import build_loss

    torch.set_num_threads(1)  # one thread per process: the comparison is processes, not threads
    warm, iters = int(cfg.bench.warmup), int(cfg.bench.iters)
    build.seed_everything(cfg.seed)
    model = build_model(cfg)
    net = model
    if world.distributed:
        net = torch.nn.parallel.DistributedDataParallel(model)
    train_ds, _ = build.build_data(cfg, model.grid, world)
    loader, sampler = build.build_train_loader(cfg, train_ds, world)
    optimizer, _ = build.build_optim_sched(cfg, model, sampler.num_batches)
    trainer = Trainer(net, build_loss(cfg),
                      optimizer, loader, torch.device("cpu"), 10**6, sampler.num_batches,
                      exact_chunk=cfg.dist.get("exact_chunk"), world_size=world.size)
    marks: dict[str, float] = {}

    class Clock(HookBase):
        def before_step(self) -> None:
            if self.trainer.iter == warm:
                dist.barrier()
                marks["t0"] = time.perf_counter()

        def after_step(self) -> None:
            if self.trainer.iter == warm + iters:
                dist.barrier()
                marks["t1"] = time.perf_counter()
                self.trainer.stop = True

    class Epoch(HookBase):
        def before_epoch(self) -> None:
            sampler.set_epoch(self.trainer.epoch)
            train_ds.set_epoch(self.trainer.epoch)

    trainer.register_hooks([Epoch(), Clock()])
    trainer.train()
    secs = marks["t1"] - marks["t0"]
    return {"images_per_s": iters * cfg.trainer.batch_size / secs, "seconds": secs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16, help="global batch")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--exact-chunk", type=int, default=None, metavar="C",
                    help="also time dist.exact_chunk=C on W processes")
    common.add_smoke_flag(ap)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.smoke:
        args.iters, args.warmup, args.batch_size, args.exact_chunk = 2, 1, 8, 2
        # exact_chunk splits the batch: a model without training-mode BatchNorm (as documented)
        args.overrides = [*common.SMOKE, "model.net.batch_norm=false", *args.overrides]
    with tempfile.TemporaryDirectory(prefix="mdk-bench-ddp-") as out:
        compare(args, Path(out))


def compare(args: argparse.Namespace, out: Path) -> None:
    """Time each world on the same global batch, data generated under ``out``; print the ratios."""
    from launchers.processes.spawn import run_ranks
    from launchers.align import validated_config

    base = validated_config([*DEFAULTS, f"paths.data={out}/data", *args.overrides])
    cfg = OmegaConf.merge(base, {"trainer": {"batch_size": args.batch_size},
                                 "bench": {"iters": args.iters, "warmup": args.warmup}})
    runs = {"1": (1, args.batch_size), "W": (args.world, args.batch_size),
            "1 small": (1, args.batch_size // args.world)}
    if args.exact_chunk:
        runs["W exact"] = (args.world, args.batch_size)
    res = {}
    for key, (w, b) in runs.items():
        chunk = args.exact_chunk if key == "W exact" else None
        c = OmegaConf.merge(cfg, {"dist": {"gpus": w, "exact_chunk": chunk},
                                  "trainer": {"batch_size": b}})
        res[key] = run_ranks(c, out, bench_rank)
        print(f"world {w}, global batch {b}{f', exact_chunk={chunk}' if chunk else ''}: "
              f"{res[key]['images_per_s']:.1f} images/s "
              f"({args.iters} iterations in {res[key]['seconds']:.1f}s, 1 thread per process)",
              flush=True)
    load = "load average %.1f / %.1f / %.1f" % os.getloadavg()
    same_global = res["W"]["images_per_s"] / res["1"]["images_per_s"]
    same_local = res["W"]["images_per_s"] / res["1 small"]["images_per_s"]
    print(f"speed-up {args.world} processes vs 1 at the same global batch {args.batch_size}: "
          f"{same_global:.2f}x (goal >= 1.8x on an idle machine); cores {os.cpu_count()}, {load}")
    # A smaller per-process batch can itself be faster per image (caches), which flatters the
    # first ratio; this one compares processes doing identical per-process work.
    print(f"speed-up at the same per-process batch {args.batch_size // args.world}: "
          f"{same_local:.2f}x (scaling efficiency {100 * same_local / args.world:.0f} %)")
    if args.exact_chunk:
        r = res["W exact"]["images_per_s"] / res["W"]["images_per_s"]
        print(f"dist.exact_chunk={args.exact_chunk} on {args.world} processes runs at {r:.2f}x the "
              "speed of DDP's all-reduce (world-size-invariant gradients cost "
              f"{100 * (1 - r):.0f} %)")

if __name__ == "__main__":
    main()
