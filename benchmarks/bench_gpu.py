"""GPU training speed of GNetDet (issue 13): ceilings, stage models, engine and run.py, as ratios
measured in one run.

    python benchmarks/bench_gpu.py                      # model=gnetdet, batch 32, on CUDA
    python benchmarks/bench_gpu.py --device cpu --model gnetdet_small --batch 8 --quick
    python benchmarks/bench_gpu.py --device cpu --model gnetdet_small --batch 16 \
        --settings fp32,fp32+cl --e2e fp32,fp32+cl           # the CPU layout: NCHW vs NHWC

1. Bare-loop ceilings: a plain PyTorch loop (forward, YOLO loss, backward, grad clip, AdamW) on
   a batch that already lives on the device, per precision / layout / compile setting.
2. Stage models: the step3 fake-quant training iteration / the float one, and the cal pass
   (forward + percentile observers) / the eval pass (forward), eager fp32 and at the fastest
   setting.
3. Engine / raw: mdk's Trainer with the per-step hooks of a real run vs the bare loop.
4. run.py end to end: ``python run.py model=<model> trainer.batch_size=<batch> <setting>`` on the
   built-in dataset with the default data path; its last epoch's "train img/s" (logged by the
   engine) / the bare-loop ceiling at the same setting.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import common  # noqa: F401  (puts the repo on sys.path)
import torch

SETTINGS = {  # name: (amp dtype or None, channels_last, compile)
    "fp32": (None, False, False),
    "fp32+cl": (None, True, False),
    "fp16": ("float16", False, False),
    "bf16": ("bfloat16", False, False),
    "bf16+cl": ("bfloat16", True, False),
    "bf16+cl+compile": ("bfloat16", True, True),
}
OVERRIDES = {None: ["trainer.amp=false"], "float16": ["trainer.amp=true", "trainer.amp_dtype=float16"],
             "bfloat16": ["trainer.amp=true", "trainer.amp_dtype=bfloat16"]}


def _overrides(setting: str) -> list[str]:
    dtype, cl, comp = SETTINGS[setting]
    return [*OVERRIDES[dtype], f"trainer.channels_last={str(cl).lower()}",
            f"trainer.compile={str(comp).lower()}"]


def _model(cfg: Any, stage: str, device: torch.device, cl: bool) -> torch.nn.Module:
    from mdk.engine.build import seed_everything
    from mdk.models.build import build_model
    from mdk.quant.bn_fold import chip_layers
    from mdk.stage import apply_stage

    seed_everything(0)
    model = build_model(cfg)
    if stage in ("step3", "cal"):
        for layer in chip_layers(model):
            layer.cap.fill_(4.0)  # calibrated-looking caps (no calibration needed for timing)
    apply_stage(model, stage, str(cfg.chip))
    model.to(device)
    return model.to(memory_format=torch.channels_last) if cl else model


def _batch(cfg: Any, model: torch.nn.Module, batch: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    n = cfg.model.image_size
    images = torch.randint(0, 256, (batch, 3, n, n), dtype=torch.uint8, generator=g)
    s, b = model.grid, cfg.model.net.boxes_per_cell
    targets = torch.zeros(batch, s, s, 5 * b + cfg.dataset.num_classes)
    targets[:, s // 2, s // 2, :4], targets[:, s // 2, s // 2, 4] = 0.5, 1.0
    targets[:, s // 2, s // 2, 5 * b] = 1.0  # class 0 (the classes follow the B box slots)
    return images.to(device), targets.to(device)


def _rate(step: Callable[[], None], iters: int, warmup: int, batch: int) -> float:
    for _ in range(warmup):
        step()
    common.sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    common.sync()
    return iters * batch / (time.perf_counter() - t0)


def bare_loop(cfg: Any, stage: str, setting: str, a: argparse.Namespace,
              device: torch.device) -> float:
    """images/s of the plain loop."""
    from mdk.engine.build import build_loss

    dtype, cl, comp = SETTINGS[setting]
    model = _model(cfg, stage, device, cl)
    images, targets = _batch(cfg, model, a.batch, device)
    if cl:
        images = images.contiguous(memory_format=torch.channels_last)
    net = torch.compile(model) if comp else model
    loss_fn, opt = build_loss(cfg), torch.optim.AdamW(model.parameters(), lr=1e-4)
    amp = getattr(torch, dtype) if dtype else None
    scaler = torch.amp.GradScaler(device.type) if amp == torch.float16 else None
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            pred = net(images)
        loss = loss_fn(pred, targets)["total"]
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()

    return _rate(step, a.iters, a.warmup + (a.compile_warmup if comp else 0), a.batch)


def engine_loop(cfg: Any, setting: str, a: argparse.Namespace, device: torch.device) -> float:
    """images/s of mdk's Trainer with the hooks a run has on every step (no data loading)."""
    from mdk.engine.build import build_loss
    from mdk.engine.hooks import LRSchedulerHook, MetricsHook
    from mdk.engine.nan_guard import NanGuardHook
    from mdk.engine.loop import Trainer
    from mdk.engine.stop_hook import StopOnRequestHook
    from mdk.sched.schedules import WarmupCosineAnnealingLR
    from mdk.sinks.base import NullSink

    dtype, cl, comp = SETTINGS[setting]
    model = _model(cfg, "step1", device, cl)
    images, targets = _batch(cfg, model, a.batch, device)
    net = torch.compile(model) if comp else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    n = a.iters + a.warmup + (a.compile_warmup if comp else 0)
    sched = WarmupCosineAnnealingLR(opt, iters_per_epoch=n, T_max=1, warmup={"iters": 5})
    trainer = Trainer(net, build_loss(cfg), opt, [(images, targets, torch.arange(a.batch))] * n,
                      device, 1, n, grad_clip=10.0, channels_last=cl,
                      amp_dtype=getattr(torch, dtype) if dtype else None)
    marks: list[float] = []

    class Clock(NanGuardHook):  # the guard's own per-step work, plus a timestamp at the start
        def before_step(self) -> None:
            if self.trainer.iter == n - a.iters:
                common.sync()
                marks.append(time.perf_counter())

    trainer.register_hooks([Clock(0, 10), MetricsHook(NullSink(), 10), LRSchedulerHook(sched),
                            StopOnRequestHook(lambda: None)])
    trainer.train()
    common.sync()
    return a.iters * a.batch / (time.perf_counter() - marks[0])


def forward_pass(cfg: Any, stage: str, setting: str, a: argparse.Namespace,
                 device: torch.device, observe: bool) -> float:
    """images/s of a no-grad forward (eval), with calibration observers when ``observe``."""
    from mdk.quant import calibrate

    dtype, cl, _ = SETTINGS[setting]
    model = _model(cfg, stage, device, cl).eval()
    images, _ = _batch(cfg, model, a.batch, device)
    amp = getattr(torch, dtype) if dtype else None

    @torch.no_grad()
    def step() -> None:
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            model(images)

    if not observe:
        return _rate(step, a.iters, a.warmup, a.batch)
    with calibrate.observing(model):
        return _rate(step, a.iters, a.warmup, a.batch)


def sync_points(cfg: Any, setting: str, a: argparse.Namespace, device: torch.device) -> list[str]:
    """Where mdk's training step waits for the GPU: a few engine steps (after warmup) under
    ``torch.cuda.set_sync_debug_mode('warn')``, the distinct call sites that synchronised."""
    import warnings

    seen: dict[str, int] = {}
    mode = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            engine_loop(cfg, setting, argparse.Namespace(**{**vars(a), "iters": 12, "warmup": 3}),
                        device)
        finally:
            torch.cuda.set_sync_debug_mode(mode)
    for w in caught:
        if "synchroniz" in str(w.message):
            key = f"{Path(w.filename).name}:{w.lineno}"
            seen[key] = seen.get(key, 0) + 1
    return [f"{k} x{n}" for k, n in sorted(seen.items(), key=lambda kv: -kv[1])]


def run_py(a: argparse.Namespace, setting: str, device: str) -> float:
    """train img/s of run.py's last epoch (the engine logs it at each epoch's end)."""
    tmp = tempfile.TemporaryDirectory(prefix="bench_gpu_")  # checkpoints, removed on return
    out, data = tmp.name, Path(a.data) if Path(a.data).is_absolute() else common.REPO / a.data
    cmd = [sys.executable, str(common.REPO / "run.py"), f"model={a.model}",
           f"trainer.batch_size={a.batch}", f"trainer.epochs={a.e2e_epochs}",
           f"dataset.generate.num_train={a.e2e_images}", "trainer.limit_val_batches=1",
           "logger=none", "trainer.progress=false", f"trainer.device={device}",
           f"paths.data={data}", f"paths.checkpoints={out}/ck", f"hydra.run.dir={out}/run",
           *_overrides(setting), *a.overrides]
    env = {**__import__("os").environ, "MDK_NO_BOOTSTRAP": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    rates = re.findall(r"\(([\d.]+) train img/s, data wait ([\d.]+)%", p.stdout + p.stderr)
    if p.returncode != 0 or not rates:
        raise RuntimeError(f"run.py failed ({p.returncode}): {(p.stdout + p.stderr)[-2000:]}")
    print(f"  {setting}: epochs {', '.join(f'{r} img/s (data wait {w}%)' for r, w in rates)}")
    return float(rates[-1][0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gnetdet")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--iters", type=int, default=30, help="timed iterations per measurement")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--compile-warmup", type=int, default=3, help="extra warmup when compiling")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma list of " +
                    ", ".join(SETTINGS))
    ap.add_argument("--e2e", default="fp32,bf16+cl,bf16+cl+compile",
                    help="settings to run run.py with ('' to skip)")
    ap.add_argument("--e2e-epochs", type=int, default=3)
    ap.add_argument("--e2e-images", type=int, default=3200, help="built-in train images")
    ap.add_argument("--data", default=str(common.REPO / "outputs" / "data_bench_gpu"))
    ap.add_argument("--quick", action="store_true", help="few iterations (a smoke test)")
    ap.add_argument("--sync-debug", action="store_true",
                    help="also list where the engine's step waits for the GPU (CUDA only)")
    common.add_smoke_flag(ap)
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every part")
    a = ap.parse_args()
    if a.quick or a.smoke:
        a.iters, a.warmup, a.compile_warmup, a.e2e_epochs, a.e2e_images = 2, 1, 1, 2, 64
    if a.smoke:  # the CPU, tiny sizes; both layouts (so a fastest one is picked), run.py 1 epoch
        a.device, a.model, a.batch = "cpu", "gnetdet_small", 8
        a.settings, a.e2e = "fp32,fp32+cl", "fp32"
        a.e2e_epochs, a.e2e_images, a.data = 1, 48, str(common.smoke_dir() / "data")
        a.overrides = [*common.SMOKE, *a.overrides]
        torch.set_num_threads(common.SMOKE_THREADS)
    device = torch.device(a.device)
    cfg = common.compose([f"model={a.model}", f"trainer.device={a.device}", *a.overrides])
    settings = [s for s in a.settings.split(",") if s]
    print(f"# bench_gpu: model={a.model} batch={a.batch} iters={a.iters} ({a.device})")
    print(f"# {common.machine()}")
    ceil: dict[str, float] = {}
    print("\n== bare-loop ceilings (img/s), step1 float model ==")
    for s in settings:
        ceil[s] = bare_loop(cfg, "step1", s, a, device)
        print(f"{s:<18} {ceil[s]:8.1f}  ({ceil[s] / ceil[settings[0]]:.2f} x {settings[0]})")
    best = max(ceil, key=ceil.get)
    print(f"fastest setting: {best} ({ceil[best]:.0f} img/s)")

    def ceiling(s: str) -> float:
        """The bare loop of setting ``s`` (measured now if --settings left it out)."""
        if s not in ceil:
            ceil[s] = bare_loop(cfg, "step1", s, a, device)
        return ceil[s]

    print("\n== stage models (ratios of time per image: higher = slower) ==")
    for s in dict.fromkeys(["fp32", best]):
        q = bare_loop(cfg, "step3", s, a, device)
        ev = forward_pass(cfg, "step2", s, a, device, observe=False)
        cal = forward_pass(cfg, "cal", s, a, device, observe=True)
        f = ceiling(s)
        print(f"{s:<18} step3/float {f / q:5.2f}  ({q:.1f} vs {f:.1f} img/s)   "
              f"cal/eval {ev / cal:5.2f}  ({cal:.1f} vs {ev:.1f} img/s)")
    print("\n== engine / raw (time per image, same setting, data already on the device) ==")
    for s in dict.fromkeys(["fp32", best]):
        e = engine_loop(cfg, s, a, device)
        print(f"{s:<18} engine/raw {ceiling(s) / e:5.3f}  ({e:.1f} vs {ceiling(s):.1f} img/s)")
    if a.sync_debug and device.type == "cuda":
        for s in dict.fromkeys(["fp32", best]):
            print(f"{s:<18} host syncs in 12 engine steps: {sync_points(cfg, s, a, device) or 'none'}")
    e2e = [s for s in a.e2e.split(",") if s]
    if e2e:
        print(f"\n== run.py end to end (model={a.model}, default data path) / ceiling ==")
    for s in e2e:
        r = run_py(a, s, a.device)
        c = ceiling(s)
        print(f"{s:<18} run.py {r:8.1f} img/s = {r / c:5.3f} x the ceiling ({c:.1f})")


if __name__ == "__main__":
    main()
