"""Time of the quantization report against one evaluation pass: ``python
benchmarks/bench_quant_report.py [--checkpoints DIR] [overrides]``.

Prints the wall time of the whole command ``python -m mdk.tools.quant_report`` (start-up to exit,
what the user waits; and the report's own work, from its log) and, measured in the same run, one
evaluation pass of the report's subject (its best.pth, all val images, one process, the tool's
batch size; model loading not counted), and their ratio. Target (issue 28): the whole report on
the default model and data in <= 3 minutes on 2 cores. On a machine shared with other jobs use
``--threads 1`` (one intra-op thread for the pass and for each report process): its CPU-time
ratio is what other jobs disturb least.

Without ``--checkpoints`` a short chain (one epoch per stage, 8 batches each) is trained first
into a temporary folder: the numbers of interest are times, not mAP. ``--smoke``: the TINY
sizes of tests/conftest.py, seconds.
"""
from __future__ import annotations

import argparse
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # puts the repo on sys.path

from mdk.engine.build import build_loss
from mdk.eval.distributed import evaluate
from mdk.tools.evaluate import build_split, load_any

SHORT_CHAIN = ["pipeline=[step1,step2,cal,step3,step4]", "trainer.epochs=1",
               "trainer.limit_train_batches=8", "+stages.step2.epochs=1",
               "+stages.step3.epochs=1", "+stages.step4.epochs=1"]
QUIET = ["logger=none", "trainer.progress=false"]


def _run(argv: list[str], what: str) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, *argv], cwd=common.REPO, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{what} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return p


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def evaluation_pass(subject: Path, overrides: list[str]) -> tuple[float, float, int]:
    """Seconds of one evaluation of ``subject`` on the val split (model and data loaded first, one
    warm-up pass before)."""
    loaded = load_any(subject, overrides)
    cfg = loaded.cfg
    ds = build_split(cfg, loaded.model)
    loss_fn = build_loss(cfg)

    def one() -> dict:
        return evaluate(loaded.model, ds, int(cfg.trainer.batch_size), loaded.device,
                        cfg.trainer.conf_thresh, cfg.trainer.nms_iou, loss_fn=loss_fn,
                        metric=str(cfg.eval.metric), box_rule=str(cfg.eval.box_rule))

    one()  # warm: the first pass also pays one-time kernel and cache set-up
    t0, c0 = time.perf_counter(), time.process_time()
    res = one()
    return time.perf_counter() - t0, time.process_time() - c0, int(res["images"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", default=None,
                    help="paths.checkpoints of a trained chain (default: train a short one)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the chain and the report")
    ap.add_argument("--threads", type=int, default=0,
                    help="intra-op threads of the evaluation pass and of each report process "
                         "(dist.cpu_threads); 0: the config's. With 1, the CPU-time ratio is "
                         "robust to other jobs on the machine")
    common.add_smoke_flag(ap)
    a = ap.parse_args()
    if a.threads:
        common.set_threads(a.threads)
        a.overrides = [*a.overrides, f"dist.cpu_threads={a.threads}"]
    work = Path(tempfile.mkdtemp(prefix="mdk-bench-report-"))
    over = [*(common.smoke_overrides() if a.smoke else []), *QUIET, *a.overrides]
    if a.checkpoints:
        over.append(f"paths.checkpoints={a.checkpoints}")
    elif not a.smoke:
        over += [f"paths.checkpoints={work}/ck", f"paths.data={work}/data"]
    print(common.machine())
    if not a.checkpoints:
        t0 = time.perf_counter()
        _run(["run.py", *over, *SHORT_CHAIN, f"hydra.run.dir={work}/chain"], "training the chain")
        print(f"trained a short chain in {time.perf_counter() - t0:.1f} s")
    run_dir = work / "report"
    t0, c0 = time.perf_counter(), _children_cpu()
    p = _run(["-m", "mdk.tools.quant_report", *over, f"hydra.run.dir={run_dir}"], "the report")
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    log = "".join(f.read_text() for f in run_dir.glob("*.log"))
    work_s = re.search(r"quantization report done in ([0-9.]+) s", log)
    subject = re.search(r"^per layer: \S+ float weights \(BN folded\) at (\S+)'s ", p.stdout,
                        re.M)
    if subject is None or work_s is None:
        sys.exit(f"the report printed no per-layer table:\n{p.stdout[-3000:]}")
    root = next(o.split("=", 1)[1] for o in reversed(over) if o.startswith("paths.checkpoints="))
    best = Path(root) / subject.group(1) / "best.pth"
    eval_s, eval_cpu, images = evaluation_pass(best, over)
    print(f"one evaluation pass ({subject.group(1)}, {images} val images): {eval_s:.2f} s wall, "
          f"{eval_cpu:.2f} s CPU")
    print(f"quant_report command: {wall:.1f} s wall (report work {float(work_s.group(1)):.1f} s) "
          f"= {wall / eval_s:.1f} x one evaluation pass; {common.load()}")
    print(f"quant_report command: {cpu:.1f} s CPU = {cpu / eval_cpu:.1f} x one evaluation pass's "
          "CPU time")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
