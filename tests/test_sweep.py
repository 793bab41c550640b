"""Sweeps without SLURM: the per-job result records, the closing table, failure handling, the
sweep-dir guard, the job-dir pinning of requeued jobs and the save-on-signal hook.

The end-to-end tests run the real `python run.py -m ...` (basic and submitit_local launchers);
SLURM ones are in test_slurm_jobs.py.
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import TINY
from launchers.hydra_app import job
from launchers.hydra_app import sweep_summary as ss
from launchers.hydra_app.submitit_requeue import (check_resources_not_swept, pin_job_dir,
                                                  stop_on_signals)
from launchers.reports import sweep_results
from mdk import checks, stop
from mdk.engine.loop import HookBase, Trainer
from mdk.engine.result import StageResult
from mdk.engine.stop_hook import StopOnRequestHook
from helpers.sweep import run_py

QUICK = [*TINY, "trainer.epochs=1", "trainer.limit_train_batches=2"]


# --- records and table ------------------------------------------------------------------------
def test_job_record_of_a_pipeline_takes_last_scored_stage_and_sums_time():
    stages = [StageResult("step1", best_map50=0.5, final_loss=2.0, time_s=3.0),
              StageResult("cal", time_s=1.5),
              StageResult("step3", best_map50=0.25, final_loss=1.5, time_s=2.0)]
    rec = sweep_results.job_record(stages, ["scheduler=step"], started=0.0)
    assert (rec["status"], rec["best_map50"], rec["final_loss"], rec["time_s"]) == \
        ("completed", 0.25, 1.5, 6.5)
    assert rec["overrides"] == ["scheduler=step"]


def test_job_record_of_failures_keeps_the_error_and_traceback():
    try:
        raise ValueError("bad value for x")
    except ValueError as e:
        exc = e
    rec = sweep_results.job_record(exc, [], started=0.0)
    assert rec["status"] == "failed" and rec["error"] == "ValueError: bad value for x"
    assert "raise ValueError" in rec["traceback"]
    guarded = {"status": "failed", "error": "config error: x", "traceback": "tb"}
    assert sweep_results.job_record(guarded, [], 0.0)["error"] == "config error: x"


def _result(d: Path, **rec) -> None:
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps(rec))


def test_table_shows_swept_keys_and_marks_failed_and_incomplete_jobs(tmp_path):
    common = ["trainer.epochs=2"]
    _result(tmp_path / "0", status="completed", overrides=[*common, "scheduler=step", "scheduler.warmup.iters=0"],
            best_map50=0.125, final_loss=3.25, time_s=12.0, attempts=2)
    _result(tmp_path / "1", status="failed", overrides=[*common, "scheduler=step", "scheduler.warmup.iters=200"],
            error="config error: trainer.eval_every=0 must be an integer >= 1\nmore")
    _result(tmp_path / "10", status="running", overrides=[*common, "scheduler=cosine", "scheduler.warmup.iters=0"])
    rows = sweep_results.collect_results(tmp_path)
    assert [r["job"] for r in rows] == ["0", "1", "10"]  # numeric order, not "0, 1, 10" by accident
    assert [r["status"] for r in rows] == ["completed", "failed", "incomplete"]
    lines = sweep_results.format_table(rows, tmp_path).splitlines()
    assert lines[0].split() == ["job", "scheduler", "scheduler.warmup.iters", "best", "mAP@0.5",
                                "final", "loss", "time", "s", "status"]
    assert lines[1].split() == ["0", "step", "0", "0.1250", "3.2500", "12.0", "completed", "(2", "runs)"]
    assert lines[2].split()[:6] == ["1", "step", "200", "-", "-", "-"]
    assert lines[2].endswith("failed: config error: trainer.eval_every=0 must be an integer >= 1")
    assert lines[3].split()[:3] == ["10", "cosine", "0"] and lines[3].endswith("incomplete")
    assert lines[4] == f"1/3 jobs completed; sweep dir: {tmp_path}"
    assert lines[5] == "all jobs: trainer.epochs=2"


def _sweep_cfg(d: Path):
    return OmegaConf.create({"hydra": {"sweep": {"dir": str(d)}}})


def test_a_used_sweep_dir_is_refused_unless_resume(tmp_path):
    ss.SweepSummary().on_multirun_start(_sweep_cfg(tmp_path / "new"))  # fresh dir: fine
    _result(tmp_path / "0", status="completed")
    with pytest.raises(ss.SweepDirInUseError, match="hydra.callbacks.sweep.resume=true") as e:
        ss.SweepSummary().on_multirun_start(_sweep_cfg(tmp_path))
    assert isinstance(e.value, SystemExit)  # Hydra only warns about Exceptions from callbacks
    ss.SweepSummary(resume=True).on_multirun_start(_sweep_cfg(tmp_path))
    (tmp_path / "older").mkdir()  # a sweep from before result.json existed: multirun.yaml tells
    (tmp_path / "older" / "multirun.yaml").write_text("hydra: {}\n")
    with pytest.raises(ss.SweepDirInUseError, match="multirun.yaml exists"):
        ss.SweepSummary().on_multirun_start(_sweep_cfg(tmp_path / "older"))


def test_multirun_end_writes_table_and_exits_1_on_failure(tmp_path):
    _result(tmp_path / "0", status="completed", overrides=["a=1"], best_map50=0.5)
    ss.SweepSummary().on_multirun_end(_sweep_cfg(tmp_path))  # all good: no exit
    _result(tmp_path / "1", status="failed", overrides=["a=2"], error="RuntimeError: boom")
    with pytest.raises(ss.SweepFailedError, match=r"1 of 2 sweep jobs did not complete: #1 failed: "
                                                  r"RuntimeError: boom") as e:
        ss.SweepSummary().on_multirun_end(_sweep_cfg(tmp_path))
    assert e.value.code != 0
    saved = json.loads((tmp_path / "sweep_summary.json").read_text())
    assert [j["status"] for j in saved["jobs"]] == ["completed", "failed"]
    assert "failed: RuntimeError: boom" in (tmp_path / "sweep_summary.txt").read_text()


def test_run_guarded_records_errors_only_in_multirun(monkeypatch):
    def boom(cfg):
        raise ValueError("nope")

    with pytest.raises(ValueError):
        job.run_guarded(boom, None)  # a single run raises as before
    monkeypatch.setattr(job, "is_multirun", lambda: True)
    out = job.run_guarded(boom, None)
    assert out["status"] == "failed" and out["error"] == "ValueError: nope"
    config_error = job.run_guarded(lambda c: (_ for _ in ()).throw(SystemExit("config error: x")), None)
    assert config_error["error"] == "SystemExit: config error: x"
    # A user error's record names its kind as the command's one line does, whatever its class.
    bad = job.run_guarded(lambda c: checks.integer("trainer.epochs", 0, 1), None)
    assert bad["error"] == "config error: trainer.epochs=0 must be an integer >= 1"
    assert "BadValue" in bad["traceback"]
    for exc in (SystemExit(-1), stop.StopRequested("SIGTERM", 3), KeyboardInterrupt()):
        def raiser(cfg, exc=exc):
            raise exc
        with pytest.raises(type(exc)):  # requeue exits and preemption stops end the process
            job.run_guarded(raiser, None)


# --- requeue: same job dir, resources --------------------------------------------------------
def test_rerun_of_a_job_gets_the_directory_of_its_first_run(tmp_path):
    def cfg(subdir: str):
        return OmegaConf.create({"hydra": {"sweep": {"dir": "elsewhere", "subdir": subdir}}})

    first = cfg("2026-01-01_10-00-00")  # e.g. a ${now:} subdir, re-evaluated on the rerun
    assert pin_job_dir(first, str(tmp_path), 3, ["x=1"]) == str(tmp_path / "2026-01-01_10-00-00")
    rerun = cfg("2026-01-01_11-30-00")
    assert pin_job_dir(rerun, str(tmp_path), 3, ["x=1"]) == str(tmp_path / "2026-01-01_10-00-00")
    assert (rerun.hydra.sweep.dir, rerun.hydra.sweep.subdir) == (str(tmp_path), "2026-01-01_10-00-00")
    other = cfg("fresh")  # same job number, other overrides (a different sweep): not pinned
    assert pin_job_dir(other, str(tmp_path), 3, ["x=2"], record=False) == str(tmp_path / "fresh")


def test_sweeping_the_process_count_through_submitit_is_refused():
    master = OmegaConf.create({"dist": {"gpus": 2, "nodes": 1}})
    check_resources_not_swept(master, [["dist.gpus=2", "scheduler=step"], ["dist.gpus=2"]])
    with pytest.raises(ValueError, match=r"dist.gpus=4: dist.gpus cannot be swept .* dist.gpus=2"):
        check_resources_not_swept(master, [["dist.gpus=2"], ["dist.gpus=4"]])


# --- save on signal ---------------------------------------------------------------------------
class _Signal(HookBase):
    """Sends a real signal to this process after optimizer step ``at``."""

    def __init__(self, at: int, sig: int = signal.SIGUSR1) -> None:
        self.at, self.sig = at, sig

    def after_step(self) -> None:
        if self.trainer.iter == self.at:
            os.kill(os.getpid(), self.sig)


class _Saves(HookBase):
    def __init__(self) -> None:
        self.at: list[tuple[int, str]] = []

    def after_epoch(self) -> None:
        self.at.append((self.trainer.iter, "epoch"))


def _trainer(epochs: int = 3, per_epoch: int = 4) -> Trainer:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    data = [(torch.randn(2, 3), torch.randn(2, 1)) for _ in range(per_epoch)]
    loss = lambda p, t: {"total": ((p - t) ** 2).mean()}  # noqa: E731
    return Trainer(model, loss, torch.optim.SGD(model.parameters(), lr=0.1), data, torch.device("cpu"),
                   epochs, per_epoch)


@pytest.mark.parametrize("at, saved_by_hook", [(6, True), (4, False)])
def test_signal_saves_last_at_the_next_step_boundary_and_stops(at, saved_by_hook):
    t = _trainer()
    epoch_saves, hook_saves = _Saves(), []
    stop_hook = StopOnRequestHook(lambda: hook_saves.append(t.iter))
    t.register_hooks([_Signal(at), epoch_saves, stop_hook])
    before = signal.getsignal(signal.SIGUSR1)
    stop.clear_stop()
    with stop_on_signals([signal.SIGUSR1]):
        with pytest.raises(stop.StopRequested) as e:
            t.train()
    assert signal.getsignal(signal.SIGUSR1) is before and not stop.listening()
    assert (e.value.reason, e.value.iteration) == ("SIGUSR1", at)
    if saved_by_hook:  # mid-epoch: the hook writes last.pth itself
        assert hook_saves == [6] and epoch_saves.at == [(4, "epoch")]
    else:  # last step of epoch 1: stop after the epoch-end checkpoint, no extra write
        assert hook_saves == [] and epoch_saves.at == [(4, "epoch")]
    stop.clear_stop()


def test_signal_outside_training_goes_to_the_previous_handler():
    got = []
    old = signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
    try:
        stop.clear_stop()
        with stop_on_signals([signal.SIGUSR1]):
            os.kill(os.getpid(), signal.SIGUSR1)
        assert got == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, old)
        stop.clear_stop()


# --- end to end: python run.py -m ---------------------------------------------------------------


@pytest.mark.slow
def test_basic_sweep_marks_failed_job_exits_1_and_protects_its_dir(tmp_path, shared_data):
    sweep = tmp_path / "sweep"
    args = ["-m", *QUICK, f"paths.data={shared_data}", f"hydra.sweep.dir={sweep}"]
    # A job that fails while the sweep runs: with the pre-sweep config check on (sweep_check,
    # tests/test_sweep_check.py) this bad value would stop the sweep before job 0 starts.
    res = run_py(*args, "trainer.eval_every=1,0", "hydra.callbacks.sweep_check.enabled=false")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "1 of 2 sweep jobs did not complete: #1 failed: config error: trainer.eval_every=0 must be an integer >= 1" in res.stderr
    table = (sweep / "sweep_summary.txt").read_text().splitlines()
    assert table[0].split()[:2] == ["job", "trainer.eval_every"]
    assert table[1].split()[:2] == ["0", "1"] and table[1].endswith("completed")
    assert table[2].endswith("failed: config error: trainer.eval_every=0 must be an integer >= 1")
    ok = json.loads((sweep / "0" / "result.json").read_text())
    assert ok["stages"][0]["checkpoints"] == str(sweep / "0" / "checkpoints" / "step1")
    assert ok["stages"][0]["iterations"] == 2 and ok["final_loss"] > 0
    last = sweep / "0" / "checkpoints" / "step1" / "last.pth"
    before = (last.stat().st_mtime_ns, last.read_bytes())
    # Same sweep dir again (as two sweeps started in the same second would get): refused.
    again = run_py(*args, "trainer.eval_every=1")
    assert again.returncode == 1
    assert f"hydra.sweep.dir={sweep} already holds a sweep" in again.stderr
    assert (last.stat().st_mtime_ns, last.read_bytes()) == before
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]


@pytest.mark.slow
def test_submitit_local_two_tasks_share_one_run(tmp_path, shared_data):
    sweep = tmp_path / "sweep"
    res = run_py("-m", *QUICK, f"paths.data={shared_data}", f"hydra.sweep.dir={sweep}",
                 "hydra/launcher=submitit_local", "hydra.launcher.gpus_per_node=0", "dist.gpus=2")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    job = sweep / "0"
    rows = json.loads((sweep / "sweep_summary.json").read_text())["jobs"]
    assert [(r["job"], r["status"]) for r in rows] == [("0", "completed")]
    assert sorted(p.name for p in job.glob("rank*.log")) == ["rank0.log", "rank1.log"]
    assert "submitit_local: 2 CPU worker processes with gloo" in (job / "rank0.log").read_text()
    ck = torch.load(job / "checkpoints" / "step1" / "last.pth", map_location="cpu", weights_only=False)
    assert ck["world_size"] == 2 and sorted(ck["rng"]) == [0, 1] and ck["trainer"]["iter"] == 2
