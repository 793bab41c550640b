"""Every script in benchmarks/ still works: each runs with ``--smoke`` (its whole code path at the
smallest sizes, on the CPU, in seconds) and must print its result lines with numbers in them, which
shows that the measurement ran, not only that the script started. The numbers themselves are not
checked (tiny sizes on a shared machine). A new benchmarks/bench_*.py is picked up by the glob and
fails here until it has ``--smoke`` and its result lines are listed in RESULTS.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cmd_env

SCRIPTS = sorted((REPO / "benchmarks").glob("bench_*.py"))
NUM = r"-?\d+(?:\.\d+)?"  # a finite number: 'nan' or 'inf' in a result line fails the match

# Per script: the lines (regexes, searched in stdout) it prints once each measurement is done.
RESULTS = {
    "bench_chip_runtime.py": [r"integer == fake-quant: True",
                              rf"integer reference\s+{NUM} ms/image",
                              rf"onnxruntime\s+{NUM} ms/image\s+x\s*{NUM}"],
    "bench_data.py": [rf"build_data \(train 48 \+ val 16 images\): {NUM} s wall",
                      rf"num_workers=\d+ \(default\): waiting for data {NUM} % of step time",
                      rf"index check of an unchanged 200-image VOC folder: {NUM} s"],
    "bench_ddp.py": [rf"world 2, global batch 8: {NUM} images/s",
                     rf"speed-up 2 processes vs 1 at the same global batch 8: {NUM}x",
                     rf"dist\.exact_chunk=2 on 2 processes runs at {NUM}x"],
    "bench_engine.py": [rf"engine {NUM} ms/iter  raw {NUM} ms/iter  ratio {NUM}",
                        rf"AMP speed-up {NUM}x", rf"all hooks: {NUM} us per iteration"],
    "bench_gpu.py": [rf"fastest setting: \S+ \({NUM} img/s\)", rf"step3/float\s+{NUM}",
                     rf"cal/eval\s+{NUM}", rf"engine/raw {NUM}",
                     rf"run\.py\s+{NUM} img/s = {NUM} x the ceiling"],
    "bench_memory.py": [rf"activation_checkpointing=on\s+process peak RSS\s+{NUM} MB",
                        rf"training-step peak lower by {NUM} %", r"same losses: True"],
    "bench_quant.py": [rf"step3 / float\(step1\)\s+= {NUM}", rf"cal / eval\s+= {NUM}"],
    "bench_quant_report.py": [rf"one evaluation pass \(\S+, \d+ val images\): {NUM} s",
                              rf"quant_report command: {NUM} s wall \(report work {NUM} s\) = "
                              rf"{NUM} x one evaluation pass"],
    "bench_plan_rank.py": [rf"step4 mAP with today's widths: {NUM}",
                           *[rf"{by}\s+(?:[+-]{NUM}|n/a)\s+(?:[+-]{NUM}|n/a)\n"
                             for by in ("loss", "map", "fisher")],
                           rf"seed-to-seed Spearman of the measured losses .*: seeds 0/1 "
                           rf"(?:[+-]{NUM}|n/a)", rf"total: {NUM} s wall"],
    "bench_recipe.py": [rf"step1\s+{NUM} ± {NUM}(\s+{NUM})+", rf"step4\s+{NUM} ± {NUM}",
                        rf"all seeds: {NUM} s wall",
                        rf"seed 0: 0 reached at epoch 1, \d+ min \d\d s after the command"],
    "bench_yolo_index.py": [rf"VOC  first use of 40 images: {NUM} s \(index {NUM} s, image check "
                            rf"{NUM} s\), peak RSS {NUM} MB",
                            rf"YOLO first use of 40 images: {NUM} s",
                            rf"YOLO / VOC: time {NUM}x, index {NUM}x, peak memory {NUM}x"],
    "bench_startup.py": [rf"command -> first iteration: {NUM} s wall", rf"median {NUM} s",
                         r"slowest imports of `run\.py --help`"],
}


def _run(script: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], cwd=REPO, env=run_cmd_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_every_benchmark_has_its_result_lines_listed():
    assert SCRIPTS, "no benchmarks/bench_*.py found"
    assert sorted(p.name for p in SCRIPTS) == sorted(RESULTS), \
        "list each benchmark's result lines in RESULTS (and drop those of removed scripts)"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_has_a_smoke_flag(script: Path):
    p = _run(script, "--help", timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "--smoke" in p.stdout, f"{script.name} has no --smoke flag (common.add_smoke_flag)"


@pytest.mark.slow  # the chain-training smokes take 20-35 s each on 2 cores
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_smoke_run_prints_its_results(script: Path):
    p = _run(script, "--smoke", timeout=300)
    log = f"exit {p.returncode}\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}"
    assert p.returncode == 0, log
    missing = [r for r in RESULTS.get(script.name, []) if not re.search(r, p.stdout)]
    assert script.name in RESULTS and not missing, f"result lines not printed: {missing}\n{log}"
