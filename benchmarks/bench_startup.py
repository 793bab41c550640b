"""Startup: command -> first training iteration done (issue 7; goal <= 6 s on CPU).

    python benchmarks/bench_startup.py                 # 3 runs of `python run.py` (step1 defaults)
    python benchmarks/bench_startup.py --runs 5 trainer.batch_size=8

Each run is a fresh ``python run.py <overrides>`` (MDK_NO_BOOTSTRAP=1, this interpreter) in a
temporary checkpoint dir, so nothing is resumed. A tiny wrapper runs run.py as ``__main__`` and
patches ``Trainer.run_step`` to print a timestamp after the first step and exit at once, so the
number is exactly "command typed -> first optimizer step finished", interpreter start-up
included. The built-in dataset is generated beforehand (first use only, ~7 s, not a per-run cost).
The wrapper also reports where the time went: import of run.py's modules, and the phases the
runner logs. ``--importtime`` prints the 15 slowest imports of ``run.py --help``.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# Runs inside the measured process; argv[1] is the start timestamp, the rest go to run.py.
WRAPPER = r"""
import os, runpy, sys, time
t0 = float(sys.argv[1]); sys.argv = ["run.py", *sys.argv[2:]]
import mdk.engine.loop as loop
_orig = loop.Trainer.run_step
def _first(self, batch):
    print(f"@@import-done {t_import - t0:.3f}", flush=True)
    _orig(self, batch)
    print(f"@@first-iter {time.time() - t0:.3f}", flush=True)
    os._exit(0)
loop.Trainer.run_step = _first
t_import = time.time()
runpy.run_path("run.py", run_name="__main__")
"""


def one_run(overrides: list[str], ckpt_dir: str) -> tuple[float, str]:
    env = dict(os.environ, MDK_NO_BOOTSTRAP="1", HYDRA_FULL_ERROR="1")
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", WRAPPER, repr(t0), *overrides,
                        f"paths.checkpoints={ckpt_dir}", "hydra.run.dir=" + ckpt_dir + "/run"],
                       cwd=common.REPO, env=env, capture_output=True, text=True)
    m = re.search(r"@@first-iter ([\d.]+)", p.stdout)
    if not m:
        sys.exit(f"run.py did not reach its first iteration (exit {p.returncode}):\n"
                 f"{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return float(m.group(1)), p.stdout + p.stderr


def import_profile() -> None:
    p = subprocess.run([sys.executable, "-X", "importtime", "run.py", "--help"], cwd=common.REPO,
                       env=dict(os.environ, MDK_NO_BOOTSTRAP="1"), capture_output=True, text=True)
    rows = []
    for line in p.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            rows.append((int(m.group(2)), len(m.group(3)), m.group(4)))
    top = [r for r in rows if r[1] <= 3]  # top-level and direct children only
    print("slowest imports of `run.py --help` (cumulative):")
    for us, _, name in sorted(top, reverse=True)[:15]:
        print(f"  {us / 1e6:6.2f} s  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--importtime", action="store_true")
    common.add_smoke_flag(ap)
    ap.add_argument("overrides", nargs="*", help="run.py overrides (default: step1 defaults)")
    a = ap.parse_args()
    if a.smoke:  # the tiny data is generated within the one timed run
        a.runs, a.importtime, a.overrides = 1, True, [*common.smoke_overrides(), *a.overrides]
    overrides = ["trainer.progress=false", *a.overrides]
    print(f"# bench_startup: python run.py {' '.join(overrides)}")
    print(f"# {common.machine()}")
    if not a.smoke:
        with tempfile.TemporaryDirectory() as warm:  # generate the dataset once (first use only)
            one_run(overrides, warm)
    times = []
    for _ in range(a.runs):
        c0 = os.times()
        with tempfile.TemporaryDirectory() as d:
            t, out = one_run(overrides, d)
        c1 = os.times()
        cpu = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
        imp = re.search(r"@@import-done ([\d.]+)", out)
        times.append(t)
        print(f"command -> first iteration: {t:.2f} s wall ({cpu:.2f} s CPU of the process; "
              f"python + torch import {float(imp.group(1)) if imp else float('nan'):.2f} s)  "
              f"{common.load()}")
    print(f"median {statistics.median(times):.2f} s (goal <= 6 s on CPU)  {common.load()}")
    if a.importtime:
        import_profile()


if __name__ == "__main__":
    main()
