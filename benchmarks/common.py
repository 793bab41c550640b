"""Shared helpers of the benchmark scripts: the machine line, config composition, fair timing.

This machine is shared: other jobs come and go while a benchmark runs. So competitors are timed
*interleaved* (A, B, B, A, ... per repetition, so a burst of load hits both alike) and compared by
their medians; with ``--threads 1 --cpu-time`` the clock is this process's CPU time, which other
processes disturb far less than wall time. Every result line carries ``os.getloadavg()``.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python benchmarks/x.py` from anywhere
    sys.path.insert(0, str(REPO))

# ``--smoke`` (every script has it; tests/test_benchmarks.py runs each so): the script's whole code
# path in seconds on the CPU, to show it still works; its numbers mean nothing. The model and data
# preset of the suite (conf/debug/tiny.yaml). Loader workers keep the config's default (``auto``): a smoke
# with 0 workers would not see a script break on the default config. One intra-op thread: beside
# other jobs, 2 threads spin and make these tiny steps several times slower (README).
SMOKE_THREADS = 1
SMOKE = ["debug=tiny", f"dist.cpu_threads={SMOKE_THREADS}"]  # run.py and bench_ddp.py's ranks


def add_smoke_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--smoke", action="store_true",
                    help="seconds-long run of the whole code path at the smallest sizes, on the "
                         "CPU: checks that the script works (its numbers mean nothing)")


@functools.cache
def _smoke_tmp() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="mdk-bench-smoke-")  # removed when the script exits


def smoke_dir() -> Path:
    """This process's temporary directory for what a smoke run generates."""
    return Path(_smoke_tmp().name)


def smoke_overrides() -> list[str]:
    """SMOKE with the generated data and checkpoints in ``smoke_dir()``."""
    d = smoke_dir()
    return [*SMOKE, f"paths.data={d}/data", f"paths.checkpoints={d}/checkpoints"]


def sweep_job(args: list[str], sweep: Path, threads: int) -> dict:
    """``python run.py -m <args>`` as one sweep job in ``sweep`` (its log: bench.log there) with
    ``threads`` intra-op threads; its result.json, or SystemExit with the log's last lines."""
    sweep.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(REPO / "run.py"), "-m", f"hydra.sweep.dir={sweep}",
           "hydra.callbacks.sweep.resume=true", f"dist.cpu_threads={threads}",
           "trainer.progress=false", *args]
    with open(sweep / "bench.log", "w") as log:
        p = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    result = sweep / "0" / "result.json"
    if p.returncode != 0 or not result.is_file():
        tail = (sweep / "bench.log").read_text().splitlines()[-5:]
        raise SystemExit(f"{sweep} failed (exit {p.returncode}); {sweep / 'bench.log'} ends:\n"
                         + "\n".join(tail))
    return json.loads(result.read_text())


def device(smoke: bool):
    """The device of the scripts that pick one themselves: CUDA where present, the CPU in smoke."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() and not smoke else "cpu")


def load() -> str:
    """The 1/5/15-minute load averages, to print next to every number."""
    return "load %.1f/%.1f/%.1f" % os.getloadavg()


def machine() -> str:
    """One line describing where the numbers come from."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{cpu}, {os.cpu_count()} cores, {gpu}; torch {torch.__version__}, "
            f"{torch.get_num_threads()} intra-op threads; python {platform.python_version()}; {load()}")


def compose(overrides: list[str]):
    """The real conf/ composed with ``overrides`` (as `python run.py <overrides>` would)."""
    from mdk.compose import compose as mdk_compose

    return mdk_compose(overrides)


def clock(cpu_time: bool) -> Callable[[], float]:
    """Process CPU time (robust to other jobs, meaningful with one thread) or wall time."""
    return time.process_time if cpu_time else time.perf_counter


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def interleaved(fns: dict[str, Callable[[], None]], reps: int, clk: Callable[[], float],
                warmup: int = 1) -> dict[str, list[float]]:
    """Time each fn ``reps`` times, alternating the order every repetition (ABBA...)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    names = list(fns)
    out: dict[str, list[float]] = {k: [] for k in names}
    for r in range(reps):
        for k in (names if r % 2 == 0 else names[::-1]):
            sync()
            t0 = clk()
            fns[k]()
            sync()
            out[k].append(clk() - t0)
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def set_threads(n: int) -> None:
    """Pin intra-op threads (0: leave torch's default)."""
    import torch

    if n:
        torch.set_num_threads(n)
