"""Engine overhead: our step1 training iteration / a minimal hand-written PyTorch loop (issue 7).

    python benchmarks/bench_engine.py                       # default step1 config, both clocks
    python benchmarks/bench_engine.py --threads 1 --cpu-time --reps 20   # on a shared machine

Both competitors get the same model weights (two copies), the same optimizer and scheduler from
the config, the same loss, grad clipping, and the same pre-collated batches from the built-in
dataset held in memory (data loading is bench_data.py's business). The engine side is the real
``Trainer`` with the per-iteration hooks ``runner._train`` registers (NaN guard, metrics with the
configured sink, LR scheduler, tqdm progress bar, stop-request check, epoch setter); evaluation and
checkpoint hooks act once per epoch and are left out. Each repetition is one block of ``--iters``
iterations per competitor, alternating the order (ABBA); the ratio of medians is printed (goal
<= 1.02). Then each hook's own per-iteration cost is timed in isolation (thousands of calls), a
noise-free breakdown of what the ratio's excess is made of.
"""
from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def _batches(cfg, grid: int, n: int) -> list:
    """The first ``n`` batches of the real training loader, collated once and kept in memory."""
    from mdk.engine import build

    train_ds, _ = build.build_data(cfg, grid)
    loader, _ = build.build_train_loader(cfg, train_ds)
    out = []
    for b in loader:
        out.append((b[0], b[1]))
        if len(out) == n:
            return out
    raise SystemExit(f"the training split has fewer than {n} batches; lower --iters")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--iters", type=int, default=10, help="iterations per timed block")
    ap.add_argument("--reps", type=int, default=10, help="timed blocks per competitor")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch default)")
    ap.add_argument("--cpu-time", action="store_true", help="process CPU time instead of wall time")
    ap.add_argument("--amp-speed", action="store_true",
                    help="also time the raw loop under AMP (bf16 CPU / fp16 CUDA) vs float32")
    common.add_smoke_flag(ap)
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. model=gnetdet")
    a = ap.parse_args()
    if a.smoke:
        a.iters, a.reps, a.amp_speed, a.threads = 2, 1, True, common.SMOKE_THREADS
        a.overrides = [*common.smoke_overrides(), *a.overrides]

    import torch

    from mdk.engine import build, precision
    from mdk.models.build import build_model
    from mdk.engine.nan_guard import NanGuardHook
    from mdk.engine.hooks import (LRSchedulerHook, MetricsHook, ProgressHook,
                                  sampler_epoch_hook)
    from mdk.engine.loop import HookBase, Trainer
    from mdk.data.samplers import GlobalBatchSampler
    from mdk.engine.stop_hook import StopOnRequestHook
    from mdk.engine.build import build_loss
    from mdk.stage import apply_stage
    from mdk.world import single_process
    from mdk.sinks.build import build_sinks

    common.set_threads(a.threads)
    cfg = common.compose(["step=step1", *a.overrides])
    device = single_process(cfg.trainer.device).device
    build.seed_everything(cfg.seed)
    model = build_model(cfg)
    batches = _batches(cfg, model.grid, a.iters)
    apply_stage(model, "step1")
    model.to(device)
    raw_model = copy.deepcopy(model)
    loss_fn = build_loss(cfg)
    clip = cfg.trainer.grad_clip
    print(f"# bench_engine: model={cfg.model.name} batch={cfg.trainer.batch_size} "
          f"iters/block={a.iters} reps={a.reps} amp={cfg.trainer.amp} "
          f"({precision.amp_dtype(cfg.trainer, device, float_model=True)}) "
          f"clock={'process CPU' if a.cpu_time else 'wall'} sinks={list(cfg.logger.sinks)} "
          f"progress={cfg.trainer.progress} log_every={cfg.logger.log_every}")
    print(f"# {common.machine()}")

    # --- engine: the real Trainer and per-iteration hooks, one epoch per block -------------
    optimizer, scheduler = build.build_optim_sched(cfg, model, a.iters)
    # trainer.amp resolved as train_stage resolves it for step1 (a float stage)
    trainer = Trainer(model, loss_fn, optimizer, batches, device, 0, a.iters,
                      amp_dtype=precision.amp_dtype(cfg.trainer, device, float_model=True),
                      grad_clip=clip)
    tmp = tempfile.TemporaryDirectory(prefix="bench_engine_")  # the sink's files, removed at exit
    sink = build_sinks(cfg.logger, Path(tmp.name), {}, True)
    metrics = MetricsHook(sink, cfg.logger.log_every)
    sampler = GlobalBatchSampler(a.iters * cfg.trainer.batch_size, cfg.trainer.batch_size, 0, 1, 0)

    class _NoData:
        def set_epoch(self, epoch: int) -> None: ...

    hooks = [sampler_epoch_hook(sampler, _NoData()), NanGuardHook(0), metrics,
             LRSchedulerHook(scheduler), ProgressHook(metrics, cfg.trainer.progress, True),
             StopOnRequestHook(lambda: None)]
    trainer.register_hooks(hooks)

    def engine_block() -> None:
        trainer.epochs += 1
        trainer.train()

    # --- raw: what one would write by hand -------------------------------------------------
    def make_raw(raw_model, amp_dtype):
        raw_opt, raw_sched = build.build_optim_sched(cfg, raw_model, a.iters)

        def raw_block() -> None:
            _raw(raw_model, raw_opt, raw_sched, amp_dtype)
        return raw_block

    def _raw(raw_model, raw_opt, raw_sched, amp_dtype) -> None:
        raw_model.train()
        for images, targets in batches:
            images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            raw_opt.zero_grad(set_to_none=True)
            if amp_dtype is not None:
                with torch.autocast(device.type, dtype=amp_dtype):
                    pred = raw_model(images)
            else:
                pred = raw_model(images)
            loss_fn(pred.float(), targets)["total"].backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(raw_model.parameters(), clip)
            raw_opt.step()
            raw_sched.step()

    fns = {"engine": engine_block, "raw": make_raw(raw_model, trainer.amp_dtype)}
    if a.amp_speed:
        amp = torch.float16 if device.type == "cuda" else torch.bfloat16
        fns["raw_amp"] = make_raw(copy.deepcopy(raw_model), None if trainer.amp_dtype else amp)
    clk = common.clock(a.cpu_time)
    ts = common.interleaved(fns, a.reps, clk)
    sink.close()
    eng, raw = common.median(ts["engine"]) / a.iters, common.median(ts["raw"]) / a.iters
    print(f"engine {1e3 * eng:.1f} ms/iter  raw {1e3 * raw:.1f} ms/iter  ratio {eng / raw:.3f} "
          f"(goal <= 1.02)  {common.load()}")
    if a.amp_speed:
        other = common.median(ts["raw_amp"]) / a.iters
        fp32, amp_t = (other, raw) if trainer.amp_dtype else (raw, other)
        print(f"raw loop float32 {1e3 * fp32:.1f} ms/iter, AMP {1e3 * amp_t:.1f} ms/iter: AMP speed-up "
              f"{fp32 / amp_t:.2f}x  {common.load()}")
    pairs = sorted(e / r for e, r in zip(ts["engine"], ts["raw"]))
    print(f"  per-repetition ratios: min {pairs[0]:.3f}  median {common.median(pairs):.3f}  "
          f"max {pairs[-1]:.3f}")

    # --- per-hook cost in isolation (trainer state is that of a real finished step) ---------
    n = 2000
    print(f"per-iteration cost of each hook ({n} calls each; % of one raw iteration):")
    sched_state, total = scheduler.state_dict(), 0.0
    trainer.batch_in_epoch = 1  # mid-epoch, as during training
    for h in hooks:
        h.before_epoch()  # opens the progress bar
        for ev in ("before_step", "after_backward", "after_step"):
            if getattr(type(h), ev) is getattr(HookBase, ev):
                continue  # not overridden: only the dispatch cost, measured below
            fn = getattr(h, ev)
            t0 = time.perf_counter()
            for _ in range(n):
                trainer.iter += 1  # every-N logic (metrics, postfix) fires at its real rate
                fn()
            dt = (time.perf_counter() - t0) / n
            total += dt
            print(f"  {type(h).__name__}.{ev}: {1e6 * dt:8.1f} us  ({100 * dt / raw:.3f} %)")
        bar = getattr(h, "bar", None)
        if bar is not None:
            bar.close()
            h.bar = None
    scheduler.load_state_dict(sched_state)
    calls, nop = len(hooks) * 3, HookBase()
    t0 = time.perf_counter()
    for _ in range(n * calls):
        getattr(nop, "before_step")()
    dt = (time.perf_counter() - t0) / n
    total += dt
    print(f"  dispatch of {calls} hook calls: {1e6 * dt:8.1f} us  ({100 * dt / raw:.3f} %)")
    print(f"  all hooks: {1e6 * total:.0f} us per iteration = {100 * total / raw:.2f} % of a raw "
          f"iteration  {common.load()}")

if __name__ == "__main__":
    main()
