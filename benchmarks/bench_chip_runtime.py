"""Cost of the three ways to run a step4 model: `python benchmarks/bench_chip_runtime.py`.

For the default small GNetDet (conf/, `model=...` overrides accepted) on one batch of random
uint8 images, prints the median time per image of
- the step4 fake-quant model (float32, what training and checkpoint evaluation run),
- the exported chip model through the integer-only reference (int64; `evaluate --runtime integer`),
- the exported ONNX file in onnxruntime (`evaluate --runtime onnx`),
and checks on the way that all three agree (integer == fake-quant bit for bit). Weights are random
and caps come from one calibration pass on the same images: the cost does not depend on training.
On a shared machine use `--threads 1 --cpu-time`.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import (SMOKE, SMOKE_THREADS, add_smoke_flag, clock, compose, interleaved, machine,
                    median, set_threads)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--cpu-time", action="store_true", help="process CPU time instead of wall")
    add_smoke_flag(ap)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=gnetdet")
    args = ap.parse_args()
    if args.smoke:
        args.batch, args.reps, args.threads = 2, 1, SMOKE_THREADS
        args.overrides = [*SMOKE, *args.overrides]
    set_threads(args.threads)

    import onnxruntime as ort
    import torch

    from mdk.models.build import build_model
    from mdk.quant import calibrate
    from mdk.quant.chips import allow_any_size
    from mdk.quant.export import ONNX_FILE, export_chip_model
    from mdk.quant.integer_ref import integer_forward
    from mdk.stage import apply_stage

    cfg = compose(list(args.overrides))
    torch.manual_seed(0)
    size = int(cfg.model.image_size)
    images = torch.randint(0, 256, (args.batch, 3, size, size), dtype=torch.uint8)
    model = build_model(cfg).eval()
    apply_stage(model, "cal", str(cfg.chip))
    with torch.no_grad(), calibrate.observing(model):
        model(images)
        calibrate.finalize_caps(model)
    apply_stage(model, "step4", str(cfg.chip))
    with tempfile.TemporaryDirectory() as d:
        cm = export_chip_model(model, Path(d), str(cfg.chip), onnx=True, gti=False,
                               allow_any_size=allow_any_size(cfg))
        opts = ort.SessionOptions()
        if args.threads:
            opts.intra_op_num_threads = args.threads
            opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(Path(d) / ONNX_FILE), opts, providers=["CPUExecutionProvider"])
    u8 = images.numpy()

    with torch.no_grad():
        fq = model(images)
        ref = integer_forward(cm, images)[0].float()
        onx = torch.from_numpy(sess.run(None, {"image_u8": u8})[0])
        runs = interleaved({
            "fake-quant float32": lambda: model(images),
            "integer reference": lambda: integer_forward(cm, images),
            "onnxruntime": lambda: sess.run(None, {"image_u8": u8}),
        }, args.reps, clock(args.cpu_time))
    print(machine())
    print(f"model={cfg.model.name} image={size} batch={args.batch} reps={args.reps} "
          f"clock={'process CPU' if args.cpu_time else 'wall'}")
    print(f"integer == fake-quant: {torch.equal(fq, ref)}; onnx max |diff| "
          f"{float((onx - ref).abs().max()):.3g} (one 5-bit level = {cm.out_scale:.3g})")
    base = median(runs["fake-quant float32"])
    for name, ts in runs.items():
        m = median(ts)
        print(f"{name:<20} {m / args.batch * 1e3:8.2f} ms/image   x{m / base:5.2f}")


if __name__ == "__main__":
    main()
