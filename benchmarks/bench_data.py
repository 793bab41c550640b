"""Data pipeline: dataset build time at startup, and the share of step time spent waiting for data.

    python benchmarks/bench_data.py                          # default config (shapes, step1)
    python benchmarks/bench_data.py --workers 0 1 2 --iters 30 --threads 1

1. Startup: ``build_data`` (generate-if-missing, meta files, decoding the image cache) timed as
   the runner calls it, wall and process CPU time, per split.
2. Wait share: the real training loader (``build_train_loader``: default sampler, workers,
   pinning) feeds a plain training step on the configured model; for each ``--workers`` setting
   the time blocked in ``next(loader)`` is summed against the whole iteration (wall time: worker
   processes are invisible to this process's CPU clock). Goal <= 5 % with the defaults.
   With 0 workers the same share is also given in process CPU time, which other jobs on a shared
   machine disturb far less.
3. Index check: a VOC-layout folder of ``--index-images`` annotations (default 16000, the size of
   VOC07+12 trainval: XMLs of ~1 KB with VOC's source/owner fields, one split list; the images
   are empty files, which the index does not read) is indexed once, then the staleness check of
   the unchanged folder (``mdk.data.index.is_stale``: the content key of the split list and every
   XML) is timed, median of 3, with the files in the page cache. Goal < 1 s.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def _timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def wait_share(cfg, train_ds, model, world, iters: int, workers: int) -> dict:
    import torch
    from omegaconf import OmegaConf

    from mdk.engine import build
    from mdk.engine.build import build_loss

    c = OmegaConf.merge(cfg, {"trainer": {"num_workers": workers}, "dataset": {"num_workers": workers}})
    loader, _ = build.build_train_loader(c, train_ds, world)  # pinned memory on CUDA, as a run
    device = next(model.parameters()).device
    loss_fn = build_loss(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    it = iter(loader)
    next(it)  # worker start-up (once per run with persistent workers) is not a per-step cost
    wait_w = wait_c = total_w = total_c = 0.0
    for _ in range(iters):
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            images, targets = next(it)[:2]
        except StopIteration:
            it = iter(loader)
            images, targets = next(it)[:2]
        w1, c1 = time.perf_counter(), time.process_time()
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss_fn(model(images), targets)["total"].backward()
        opt.step()
        common.sync()
        wait_w, wait_c = wait_w + w1 - w0, wait_c + c1 - c0
        total_w += time.perf_counter() - w0
        total_c += time.process_time() - c0
    del it, loader
    return {"wait_wall": wait_w / total_w, "wait_cpu": wait_c / total_c,
            "step_wall": total_w / iters, "batch_wall": wait_w / iters, "batch_cpu": wait_c / iters}


def index_check(n: int) -> None:
    import statistics
    import tempfile

    import numpy as np

    from mdk.data.generated import voc_xml
    from mdk.data.index import ensure_meta, is_stale
    from mdk.data.shapes import SHAPE_CLASSES
    from mdk.data.voc import VOCReader

    source = (b"\t<source>\n\t\t<database>The VOC2007 Database</database>\n\t\t<annotation>PASCAL "
              b"VOC2007</annotation>\n\t\t<image>flickr</image>\n\t</source>\n\t<owner>\n\t\t"
              b"<flickrid>someone</flickrid>\n\t\t<name>?</name>\n\t</owner>\n")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="mdk-bench-index-") as tmp:
        root = Path(tmp) / "VOC"
        for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
            (root / sub).mkdir(parents=True)
        ids = [f"{i:06d}" for i in range(n)]
        for i in ids:
            objects = []
            for _ in range(int(rng.integers(1, 4))):
                x, y = sorted(rng.integers(1, 500, 2)), sorted(rng.integers(1, 375, 2))
                name = SHAPE_CLASSES[int(rng.integers(5))]
                objects.append((name, [x[0], y[0], x[1] + 1, y[1] + 1]))
            xml = voc_xml(f"{i}.jpg", 500, objects).replace(b"<annotation>\n",
                                                            b"<annotation>\n" + source, 1)
            (root / "Annotations" / f"{i}.xml").write_bytes(xml)
            (root / "JPEGImages" / f"{i}.jpg").touch()
        (root / "ImageSets/Main/trainval.txt").write_text("".join(f"{i}\n" for i in ids))
        reader, meta = VOCReader(root, SHAPE_CLASSES), Path(tmp) / "meta" / "trainval.txt"
        _, build_s, _ = _timed(lambda: ensure_meta(reader, "trainval", meta))
        times = []
        for _ in range(3):
            stale, wall, _ = _timed(lambda: is_stale(reader, "trainval", meta))
            assert not stale
            times.append(wall)
        kb = sum(p.stat().st_size for p in (root / "Annotations").iterdir()) / n / 1024
        print(f"index check of an unchanged {n}-image VOC folder: {statistics.median(times):.2f} s "
              f"(median of 3, max {max(times):.2f} s; goal < 1 s; XMLs of {kb:.1f} KB; first "
              f"build {build_s:.1f} s)  {common.load()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--workers", type=int, nargs="*", default=None,
                    help="num_workers settings to compare (default: the config's only)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch default)")
    ap.add_argument("--index-images", type=int, default=16000,
                    help="annotations of the index-check folder (VOC07+12 trainval: ~16.5k)")
    common.add_smoke_flag(ap)
    ap.add_argument("overrides", nargs="*", help="config overrides")
    a = ap.parse_args()
    if a.smoke:
        a.iters, a.threads, a.index_images = 2, common.SMOKE_THREADS, 200
        a.overrides = [*common.smoke_overrides(), *a.overrides]

    from mdk.data.build import build_datasets  # noqa: F401  (imported before timing)
    from mdk.engine import build
    from mdk.models.build import build_model
    from mdk.stage import apply_stage
    from mdk.world import single_process

    common.set_threads(a.threads)
    cfg = common.compose(["step=step1", *a.overrides])
    world = single_process(cfg.trainer.device)
    default_workers = build.loader_workers(cfg, world)  # 'auto' resolved as a run resolves it
    print(f"# bench_data: dataset={cfg.dataset.name} cache_images={cfg.dataset.get('cache_images')} "
          f"model={cfg.model.name} batch={cfg.trainer.batch_size} default num_workers={default_workers}")
    print(f"# {common.machine()}")
    build.seed_everything(cfg.seed)
    model = build_model(cfg)
    apply_stage(model, "step1")
    model.to(world.device).train()
    (train_ds, val_ds), wall, cpu = _timed(lambda: build.build_data(cfg, model.grid))
    print(f"build_data (train {len(train_ds)} + val {len(val_ds)} images): {wall:.1f} s wall, "
          f"{cpu:.1f} s CPU  {common.load()}")
    for ds in (train_ds, val_ds):
        _, w, c = _timed(lambda ds=ds: [ds._read(i) for i in range(min(200, len(ds)))])
        n = min(200, len(ds))
        print(f"  decode {ds.split}: {1e3 * w / n:.2f} ms/image wall, {1e3 * c / n:.2f} ms CPU "
              f"-> {len(ds) * c / n:.1f} s CPU for the split's image cache")
    for nw in (a.workers if a.workers is not None else [default_workers]):
        r = wait_share(cfg, train_ds, model, world, a.iters, nw)
        extra = f", CPU-time share {100 * r['wait_cpu']:.1f} %" if nw == 0 else ""
        print(f"num_workers={nw}{' (default)' if nw == default_workers else ''}: waiting for data "
              f"{100 * r['wait_wall']:.1f} % of step time (wall{extra}; goal <= 5 %)  "
              f"step {1e3 * r['step_wall']:.0f} ms, wait {1e3 * r['batch_wall']:.1f} ms/batch  "
              f"{common.load()}")
    index_check(a.index_images)


if __name__ == "__main__":
    main()
