"""Speed of the fake-quant paths vs float (issue 4): run ``python benchmarks/bench_quant.py``.

Prints, for the small GNetDet preset on this machine's CPU (or CUDA if present):
- step3 fake-quant training iteration / float (step1) training iteration, same batch;
- cal pass (eval forward + per-layer percentile observers) / eval pass (step2 forward, no observers).
Targets: <= 1.25 and <= 1.15. Timings are medians over round-robin repeated iterations after
warmup. On a shared machine use `--threads 1 --cpu-time` (process CPU time is far less disturbed
by other jobs than wall time).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import common  # puts the repo on sys.path
import torch

from mdk.models.gnetdet import GNetDet
from mdk.quant import calibrate
from mdk.stage import apply_stage

SMALL = dict(channels=[16, "M", 16, "M", 32, 32, "M", 64, 64, 64, "M", 64, 64, 64, "M",
                       64, 64, 64, 64, 64], mask_bits=[3] * 13 + [8] * 3)


_CLOCK = time.perf_counter


def _time(fn) -> float:
    t0 = _CLOCK()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return _CLOCK() - t0


def _paired(fns: dict, iters: int, warmup: int = 2) -> dict:
    """Median time of each fn, measured round-robin so load from other processes hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    ts: dict = {k: [] for k in fns}
    for _ in range(iters):
        for k, fn in fns.items():
            ts[k].append(_time(fn))
    return {k: statistics.median(v) for k, v in ts.items()}


def _train_iter(model, opt, images):
    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(images).square().mean()
        loss.backward()
        opt.step()
    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--image", type=int, default=192)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with process CPU time instead of wall time: robust when other "
                         "jobs share the cores (use with --threads 1)")
    common.add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.batch, args.image, args.iters, args.threads = 2, 64, 1, common.SMOKE_THREADS
    global _CLOCK
    if args.cpu_time:
        _CLOCK = time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = common.device(args.smoke)
    torch.manual_seed(0)
    images = torch.randint(0, 256, (args.batch, 3, args.image, args.image), dtype=torch.uint8,
                           device=dev)
    base = GNetDet(num_classes=3, image_size=args.image, batch_norm=True, **SMALL).to(dev)
    with torch.no_grad():
        base.train()(images)  # give BN non-trivial running stats

    f32 = copy.deepcopy(base).train()  # step1: float, BN in train mode
    apply_stage(f32, "step1", "5801")
    q = copy.deepcopy(base).eval()
    apply_stage(q, "step2", "5801")
    nobn = copy.deepcopy(q)  # float with BN folded: isolates the quantizer overhead
    apply_stage(nobn, "step1", "5801")
    evalm = copy.deepcopy(q)

    def cal_pass():
        with calibrate.observing(q):
            q(images)
            calibrate.finalize_caps(q)

    with torch.no_grad():
        cal_pass()
        ev = _paired({"eval": lambda: evalm(images), "cal": cal_pass}, args.iters)
    t_eval, t_cal = ev["eval"], ev["cal"]
    apply_stage(q, "step3", "5801")
    q.train()
    nobn.train()
    tr = _paired({"float": _train_iter(f32, torch.optim.SGD(f32.parameters(), 1e-4), images),
                  "nobn": _train_iter(nobn, torch.optim.SGD(nobn.parameters(), 1e-4), images),
                  "q": _train_iter(q, torch.optim.SGD(q.parameters(), 1e-4), images)}, args.iters)
    t_float, t_nobn, t_q = tr["float"], tr["nobn"], tr["q"]

    print(f"device={dev} threads={torch.get_num_threads()} batch={args.batch} image={args.image} "
          f"clock={'process CPU time' if args.cpu_time else 'wall'} iters={args.iters}")
    print(f"float train iter (step1, BN)       {t_float * 1e3:8.1f} ms")
    print(f"float train iter (BN folded)       {t_nobn * 1e3:8.1f} ms")
    print(f"step3 fake-quant train iter        {t_q * 1e3:8.1f} ms")
    print(f"eval pass (step2 weights)          {t_eval * 1e3:8.1f} ms")
    print(f"cal pass (eval + observers)        {t_cal * 1e3:8.1f} ms")
    print(f"step3 / float(step1)   = {t_q / t_float:.3f}   (target <= 1.25)")
    print(f"step3 / float(folded)  = {t_q / t_nobn:.3f}")
    print(f"cal / eval             = {t_cal / t_eval:.3f}   (target <= 1.15)")


if __name__ == "__main__":
    main()
