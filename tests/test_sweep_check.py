"""Fail before the queue: a sweep's jobs get a single run's config checks before any job starts
(launchers/hydra_app/sweep_check.py), whatever the launcher."""
from __future__ import annotations

import subprocess
import sys
from typing import Iterator

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode

from conftest import REPO, TINY, run_cmd_env
from launchers.hydra_app.sweep_check import SweepConfigError, check_job, check_sweep, sweep_jobs
from mdk.errors import ConfigError

SHADOW_WARNING = "ignore:(?s).*validated against ConfigStore schema with the same name:UserWarning"


@pytest.fixture
def load() -> Iterator:
    """Compose like `python run.py -m ...` (sweep values allowed), with the global Hydra set up."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        yield lambda *o: GlobalHydra.instance().config_loader().load_configuration(
            "config", overrides=[*TINY, "trainer.device=cpu", *o], run_mode=RunMode.MULTIRUN)


def test_jobs_are_expanded_in_the_order_the_sweeper_runs_them(load):
    jobs = sweep_jobs(load("scheduler=step,cosine", "seed=0,1"))
    assert [[o for o in j if o.startswith(("scheduler=", "seed="))] for j in jobs] == [
        ["scheduler=step", "seed=0"], ["scheduler=step", "seed=1"],
        ["scheduler=cosine", "seed=0"], ["scheduler=cosine", "seed=1"]]
    assert all("debug=tiny" in j for j in jobs)  # the fixed overrides are in every job


def test_a_search_picks_its_jobs_as_it_runs(load):
    assert sweep_jobs(load("hparams_search=lr_warmup")) is None


def test_the_bad_job_is_named_with_its_swept_values_and_the_key(load):
    cfg = load("dist.gpus=2", "trainer.batch_size=8,7", "seed=0,1")
    jobs = sweep_jobs(cfg)
    with pytest.raises(SweepConfigError) as e:
        check_sweep(cfg, jobs)
    msg = str(e.value)
    assert msg.startswith("sweep job #2 (trainer.batch_size=7 seed=0): trainer.batch_size=7 is the "
                          "global batch and must divide by the world size dist.gpus*dist.nodes=2. "
                          "Nothing was started (4 jobs)"), msg
    good = load("dist.gpus=2", "trainer.batch_size=8,16")
    check_sweep(good, sweep_jobs(good))  # no error


def test_stage_settings_are_checked_per_job(load):
    cfg = load("pipeline=[step1,step3],[step1,step2]", "+stages.step3.epochs=2")
    with pytest.raises(SweepConfigError, match=r"sweep job #1 \(pipeline=\[step1,step2\]\): stages.step3.\* "
                                               r"is set but step3 does not run"):
        check_sweep(cfg, sweep_jobs(cfg))
    cfg = load("pipeline=[step1,step3]", "+stages.step3.epoch=2,3")
    with pytest.raises(SweepConfigError, match=r"^sweep job #0 \(\+stages.step3.epoch=2\): stages.step3."
                                               r"epoch is not a key of conf/step/step3.yaml"):
        check_sweep(cfg, sweep_jobs(cfg))


@pytest.mark.filterwarnings(SHADOW_WARNING)
def test_several_nodes_need_an_address_except_under_slurm(load):
    cfg = load("dist.nodes=2")
    check_job(cfg.copy(), slurm=True)  # the job fills dist.dist_url in from SLURM
    with pytest.raises(ConfigError, match="dist.dist_url=auto only works on one machine"):
        check_job(cfg.copy(), slurm=False)


def _run_py(tmp_path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "run.py"), "-m", *TINY, "trainer.device=cpu",
           f"paths.data={tmp_path / 'data'}", f"hydra.sweep.dir={tmp_path / 'sweep'}", *args]
    return subprocess.run(cmd, env=run_cmd_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("launcher", ["basic", "submitit_slurm"])
def test_a_bad_combination_stops_the_sweep_before_any_job(tmp_path, launcher):
    extra = [] if launcher == "basic" else ["hydra/launcher=submitit_slurm", "hydra.launcher.partition=none"]
    res = _run_py(tmp_path, *extra, "dist.gpus=2", "trainer.batch_size=8,7", "scheduler=step,cosine")
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1].startswith(
        "sweep job #2 (trainer.batch_size=7 scheduler=step): trainer.batch_size=7 is the global "
        "batch and must divide by the world size dist.gpus*dist.nodes=2"), res.stderr[-2000:]
    assert not (tmp_path / "sweep").exists()  # no job dir, no .submitit folder, nothing queued
    assert not (tmp_path / "data").exists()
