"""2-process gloo runs on CPU: whole runs through run.py / torchrun, exact eval, a crashing rank.

Tiny model and data (see helpers/ddp.py TINY) so each run is dominated by process start-up.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mdk.world import World
from helpers.ddp import REPO, TINY, eval_rank, raise_on_rank1, tiny_cfg

pytestmark = pytest.mark.ddp
PY = sys.executable
ENV = {**os.environ, "MDK_NO_BOOTSTRAP": "1", "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "0"}


def _run_py(cwd: Path, data: Path, *extra: str, launcher: tuple = (PY,)) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    cmd = [*launcher, str(REPO / "run.py"), *TINY, "dataset.generate.num_val=24",
           f"paths.data={data}", f"paths.checkpoints={cwd}/ck", *extra]
    return subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _finish(p: subprocess.Popen, timeout: float = 240) -> str:
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out[-3000:]
    return out


def _only_run_dir(cwd: Path) -> Path:
    dirs = [d for d in (cwd / "outputs").glob("*/*") if d.is_dir()]
    assert len(dirs) == 1, f"expected one run directory, got {dirs}"
    return dirs[0]


@pytest.mark.slow
def test_two_concurrent_two_process_runs(tmp_path):
    """dist.gpus=2 twice at the same time on one machine: no port collision; each run has one run
    dir holding every rank's log; checkpoints, TensorBoard and the LR plot come from rank 0."""
    procs = [_run_py(tmp_path / n, tmp_path / f"data_{n}", "dist.gpus=2", "logger=tensorboard")
             for n in ("a", "b")]
    outs = [_finish(p) for p in procs]
    for name, out in zip("ab", outs):
        cwd = tmp_path / name
        run = _only_run_dir(cwd)
        assert out.count("running 2 CPU worker processes with gloo") == 1
        assert (run / "rank0.log").is_file() and (run / "rank1.log").is_file()
        assert "split 'train': 64 images" in (run / "rank1.log").read_text()
        assert sorted(p.name for p in (cwd / "ck" / "step1").iterdir()) == ["best.pth", "last.pth"]
        assert len(list(run.rglob("events.out.tfevents*"))) == 1  # one writer: rank 0
        assert len(list(run.glob("lr_*.png"))) == 1
        assert "saved LR curve" in (run / "rank0.log").read_text()
        assert "saved LR curve" not in (run / "rank1.log").read_text()
        assert not (run / ".errors").exists() and not list(run.glob(".*result.json"))


@pytest.mark.slow
def test_a_five_stage_pipeline_on_two_processes_starts_its_ranks_once(tmp_path):
    """`pipeline=[step1,step2,cal,step3,step4] dist.gpus=2`: the launcher starts its two ranks
    once, and the five stages run one after another inside them (each rank one process, one
    pid, for the whole command); the summary has a row per stage."""
    chain = ["step1", "step2", "cal", "step3", "step4"]
    out = _finish(_run_py(tmp_path / "p", tmp_path / "data", "trainer.device=cpu", "dist.gpus=2",
                          f"pipeline=[{','.join(chain)}]", "trainer.limit_val_batches=1",
                          "hydra.run.dir=run"))
    run = tmp_path / "p" / "run"
    assert out.count("running 2 CPU worker processes with gloo") == 1  # one launch
    for r in (0, 1):
        log = (run / f"rank{r}.log").read_text()
        assert len(re.findall(rf"rank {r} runs as pid \d+", log)) == 1, log[-2000:]
        assert re.findall(r"=== (\w+) ===", log) == chain  # every stage, in that one process
    table = (run / "summary.txt").read_text().splitlines()
    assert [row.split()[0] for row in table[1:1 + len(chain)]] == chain
    for s in chain:
        assert (tmp_path / "p" / "ck" / s / "best.pth").is_file(), s


@pytest.mark.slow
def test_run_py_exact_chunk_two_processes_equal_one_bit_for_bit(tmp_path):
    """`python run.py dist.exact_chunk=2` on 1 and on 2 processes (global batch 8): the final
    checkpoints hold the same bits (weights, optimizer moments), and the same val mAP."""
    import torch

    common = ("model.net.batch_norm=false", "trainer.batch_size=8", "dist.exact_chunk=2",
              "dist.cpu_threads=1")
    procs = [_run_py(tmp_path / f"w{g}", tmp_path / "data", f"dist.gpus={g}", *common)
             for g in (1, 2)]
    for p in procs:
        _finish(p)
    cks = [torch.load(tmp_path / f"w{g}" / "ck" / "step1" / "last.pth", weights_only=False)
           for g in (1, 2)]
    assert cks[0]["trainer"]["iter"] == cks[1]["trainer"]["iter"] == 3 and cks[1]["world_size"] == 2
    for k, v in cks[0]["model"].items():
        assert torch.equal(v, cks[1]["model"][k]), k
    st = [c["optimizer"]["state"] for c in cks]
    assert all(torch.equal(st[0][i]["exp_avg_sq"], st[1][i]["exp_avg_sq"]) for i in st[0])
    m1, m2 = cks[0]["metric"], cks[1]["metric"]
    assert m1["map50"] == m2["map50"] and m1["images"] == m2["images"] == 24
    # The val loss is summed per eval batch (8 images vs 4 per rank): equal up to rounding.
    assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-6)


@pytest.mark.slow
def test_torchrun_two_processes_share_rank0_run_dir(tmp_path):
    torchrun = (str(Path(PY).parent / "torchrun"), "--standalone", "--nproc-per-node", "2")
    out = _finish(_run_py(tmp_path / "t", tmp_path / "data", "hydra.run.dir=run",
                          launcher=torchrun))
    run = tmp_path / "t" / "run"
    assert (run / "rank0.log").is_file() and (run / "rank1.log").is_file()
    assert "torchrun: 2 CPU worker processes with gloo" in out
    assert out.count("stage    mAP@0.5") == 1  # only rank 0 prints the summary
    assert (tmp_path / "t" / "ck" / "step1" / "best.pth").is_file()


@pytest.mark.slow
def test_two_machines_simulated_on_localhost(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ("dist.nodes=2", f"dist.dist_url=127.0.0.1:{port}")
    # machine 1 first: it must wait for machine 0 instead of failing
    m1 = _run_py(tmp_path / "m1", tmp_path / "data", *common, "dist.rank=1")
    time.sleep(2)
    m0 = _run_py(tmp_path / "m0", tmp_path / "data", *common, "dist.rank=0")
    out0, out1 = _finish(m0), _finish(m1)
    assert (_only_run_dir(tmp_path / "m0") / "rank0.log").is_file()
    assert (_only_run_dir(tmp_path / "m1") / "rank1.log").is_file()
    assert (tmp_path / "m0" / "ck" / "step1" / "last.pth").is_file()
    assert not (tmp_path / "m1" / "ck").exists()  # machine 1 holds rank 1: writes no checkpoint


def test_the_ranks_of_each_launch_are_the_launchers_children_with_its_environment_of_now(
        tmp_path, monkeypatch):
    """Two launches from one process (two jobs of a sweep, or stages of different worlds): the
    ranks of each are the launcher's own children (they die with it), and each launch's ranks see
    the launcher's environment as it is at that launch (a later ``hydra.job.env_set``)."""
    from helpers.ddp import env_rank
    from launchers.processes.spawn import run_ranks

    cfg = tiny_cfg(tmp_path, "dist.gpus=2")
    monkeypatch.setenv("MDK_TEST_RANK_ENV", "first")
    monkeypatch.setenv("MDK_TEST_GONE", "1")
    first = run_ranks(cfg, tmp_path / "a", env_rank)
    monkeypatch.setenv("MDK_TEST_RANK_ENV", "second")
    monkeypatch.delenv("MDK_TEST_GONE")
    second = run_ranks(cfg, tmp_path / "b", env_rank)
    assert (first["var"], first["gone"]) == ("first", True)
    assert (second["var"], second["gone"]) == ("second", False)
    assert first["rank"] == second["rank"] == "0" and first["world"] == second["world"] == 2
    assert first["parent"] == second["parent"] == os.getpid()


def test_distributed_eval_equals_single_process_with_odd_val_size(tmp_path):
    from launchers.processes.spawn import run_ranks

    cfg1 = tiny_cfg(tmp_path, num_val=23)  # 23 images: not divisible by 2
    single = eval_rank(cfg1, tmp_path, World())
    cfg2 = tiny_cfg(tmp_path, "dist.gpus=2", num_val=23)
    (tmp_path / "run").mkdir()
    multi = run_ranks(cfg2, tmp_path / "run", eval_rank)
    assert multi["world"] == 2 and single["world"] == 1
    assert single["metrics"]["images"] == multi["metrics"]["images"] == 23
    assert len(multi["dets"]) == 23
    single_dets = json.loads(json.dumps(single["dets"]))  # the same JSON round trip as rank 0's
    assert multi["dets"] == single_dets  # every box and score, bit for bit
    assert multi["metrics"] == single["metrics"]  # mAP and loss exactly
    # A random model scores mAP 0; the oracle (jittered ground truth) checks a real number.
    assert 0.3 < single["oracle"]["map50"] < 0.95
    assert multi["oracle"] == single["oracle"]


@pytest.mark.slow
def test_real_command_crashing_rank_shows_its_traceback_not_the_parents(tmp_path):
    """`python run.py dist.gpus=2` whose rank 1 raises at iteration 2: exit 1 within seconds
    (rank 0 is not left waiting for the 60 s collective timeout), and what the user reads on
    stderr is rank 1's traceback, not the frames of the parent waiting for its workers."""
    cwd = tmp_path / "c"
    cwd.mkdir()
    cmd = [PY, str(REPO / "run.py"), *TINY, "dataset.generate.num_val=24",
           f"paths.data={tmp_path}/data", f"paths.checkpoints={cwd}/ck", "dist.gpus=2"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd, env={**ENV, "MDK_FAULT": "raise:iter:2:1"},
                       capture_output=True, text=True, timeout=240)
    took = time.monotonic() - t0
    err = p.stderr
    assert p.returncode == 1, err[-3000:]
    assert "rank 1 failed" in err and "Traceback (most recent call last)" in err
    assert "InjectedError: MDK_FAULT: injected error at iter 2 on rank 1" in err
    assert "mdk/faults.py" in err  # the failing rank's own frames
    assert "launchers/hydra_app/entry.py" not in err and "Error executing job" not in err
    assert took < 45, f"took {took:.0f}s"


def test_crashing_rank_stops_the_others_and_its_traceback_is_reported(tmp_path):
    from launchers.processes.rank_ends import RankFailedError
    from launchers.processes.spawn import run_ranks

    cfg = tiny_cfg(tmp_path, "dist.gpus=2", "dist.timeout_s=120")
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(RankFailedError) as e:
        run_ranks(cfg, run, raise_on_rank1)
    done = time.time()
    msg = str(e.value)
    assert "rank 1 failed" in msg and "boom from rank 1" in msg and "raise_on_rank1" in msg
    log1 = (run / "rank1.log").read_text()
    assert "boom from rank 1" in log1
    # rank 0 sat in a barrier with a 120 s timeout: it was killed within seconds of the failure
    stamp = next(ln for ln in log1.splitlines() if "rank 1 failed" in ln)[1:24]
    t_fail = time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:]) / 1000
    assert done - t_fail < 10, f"other ranks were stopped {done - t_fail:.1f}s after the failure"
