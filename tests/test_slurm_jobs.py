"""Real `python run.py -m hydra/launcher=submitit_slurm ...` runs on the private test cluster.

* a 2-job scheduler sweep finishes and both jobs are in the sweep table;
* a 2-task job (dist.gpus=2, two CPU workers with gloo, rank/world from the SLURM environment)
  is one DDP run: the same model as the same run started by our own local spawner;
* a search (`hparams_search=lr_warmup`) runs each trial as a SLURM job that reports its epochs to
  the study's journal file, and records each job's final loss as the trial's value;
* a job preempted (SIGUSR2, submitit requeues it) and then requeued (`scontrol requeue`, SIGTERM)
  mid-training comes back to the same job dir each time, resumes from the last.pth saved on the
  signal and ends with weights bit-identical to an uninterrupted twin job.

Every wait is bounded (see slurm_fixture.wait_for).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, TINY, compose
from slurm_fixture import read_text, wait_for

pytestmark = pytest.mark.slurm


def _env(cluster) -> dict:
    return dict(cluster.env, MDK_NO_BOOTSTRAP="1", PYTHONPATH=str(REPO))


def _cmd(cluster, data: Path, sweep: Path, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "run.py"), "-m", *TINY, f"paths.data={data}",
            f"hydra.sweep.dir={sweep}", "hydra/launcher=submitit_slurm",
            f"hydra.launcher.partition={cluster.partition}", "hydra.launcher.gpus_per_node=0",
            "hydra.launcher.timeout_min=10", *extra]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The tiny dataset, generated once here: concurrent jobs must not all generate it at once."""
    from mdk.engine import build
    from mdk.models.build import build_model

    d = tmp_path_factory.mktemp("slurm_data")
    cfg = compose([*TINY, f"paths.data={d}"])
    build.build_data(cfg, build_model(cfg).grid)
    return d


def _weights(job: Path) -> dict:
    ck = torch.load(job / "checkpoints" / "step1" / "last.pth", map_location="cpu", weights_only=False)
    return ck


def _jobs(sweep: Path) -> list[dict]:
    return json.loads((sweep / "sweep_summary.json").read_text())["jobs"]


def test_scheduler_sweep_runs_both_jobs_on_slurm(slurm_cluster, data, tmp_path):
    sweep = tmp_path / "sweep"
    res = subprocess.run(_cmd(slurm_cluster, data, sweep, "trainer.epochs=1", "trainer.limit_train_batches=2",
                              "scheduler=step,cosine"),
                         env=_env(slurm_cluster), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:] + slurm_cluster.logs(10)
    jobs = _jobs(sweep)
    assert [(j["job"], j["status"]) for j in jobs] == [("0", "completed"), ("1", "completed")]
    assert [o for j in jobs for o in j["overrides"] if o.startswith("scheduler=")] == \
        ["scheduler=step", "scheduler=cosine"]
    array = {j["job_id"].split("_")[0] for j in jobs}
    assert len(array) == 1 and [j["job_id"].split("_")[1] for j in jobs] == ["0", "1"]  # one job array
    for j in jobs:  # each job trained in its own dir, with its own checkpoints
        assert j["final_loss"] > 0 and j["best_map50"] is not None
        assert _weights(sweep / j["job"])["trainer"]["iter"] == 2
    table = (sweep / "sweep_summary.txt").read_text().splitlines()
    assert [line.split()[:2] for line in table[1:3]] == [["0", "step"], ["1", "cosine"]]


@pytest.mark.slow
def test_two_task_job_is_one_ddp_run_like_a_local_two_process_run(slurm_cluster, data, tmp_path):
    from launchers.processes.spawn import run_ranks
    from mdk.engine.runner import stage_on_rank

    sweep = tmp_path / "sweep"
    # One intra-op thread per rank in both runs: SLURM's task may see other cores than the local
    # spawner's share, and the summation order of the (NHWC) convolutions follows the threads.
    proc = subprocess.Popen(_cmd(slurm_cluster, data, sweep, "trainer.epochs=1", "dist.gpus=2",
                                 "dist.cpu_threads=1"),
                            env=_env(slurm_cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        # Meanwhile (the SLURM job spends most of its time queued and starting up): the same run
        # started by our own spawner, not SLURM.
        cfg = compose([*TINY, f"paths.data={data}", f"paths.checkpoints={tmp_path / 'local'}",
                       "trainer.epochs=1", "dist.gpus=2", "dist.cpu_threads=1"])
        run_ranks(cfg, tmp_path / "local_run", stage_on_rank)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    job = sweep / "0"
    assert [(j["job"], j["status"]) for j in _jobs(sweep)] == [("0", "completed")]
    # Rank/world came from the SLURM task environment (launchers/processes/env.py), one run dir
    # for both.
    assert "slurm: 2 CPU worker processes with gloo" in read_text(job / "rank0.log")
    ck = _weights(job)
    # Both ranks took part in every step (the RNG gather before each save is a collective), and
    # the global batch 8 was split 2 x 4: 48 images -> 6 steps.
    assert ck["world_size"] == 2 and sorted(ck["rng"]) == [0, 1] and ck["trainer"]["iter"] == 6
    vals = [re.findall(r"val mAP@0.5 \S+  val loss \S+", read_text(job / f"rank{r}.log")) for r in (0, 1)]
    assert vals[0] and vals[0] == vals[1]  # the ranks agree on the all-reduced validation numbers
    # The locally spawned run trains the same model. Not compared: conv biases in front of
    # BatchNorm (BN cancels them, so they only get rounding-noise gradients, which Adam turns into
    # lr-sized steps that depend on the thread count) and the BN running means that carry them.
    local = torch.load(tmp_path / "local" / "step1" / "last.pth", map_location="cpu", weights_only=False)
    bn = {k.split(".bn.")[0] for k in local["model"] if ".bn." in k}
    noisy = {f"{p}.conv.bias" for p in bn} | {f"{p}.bn.running_mean" for p in bn}
    compared = [k for k in local["model"] if k not in noisy]
    assert len(compared) > len(noisy)
    for k in compared:
        torch.testing.assert_close(ck["model"][k], local["model"][k], rtol=1e-4, atol=1e-5,
                                   msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.slow
def test_preempted_and_requeued_job_resumes_in_same_dir_to_identical_weights(slurm_cluster, data, tmp_path):
    """Job 0 gets SIGUSR2 (submitit's time-out/preemption signal: save, submitit requeues it) in
    its first run and `scontrol requeue` (SIGTERM: save, SLURM requeues it) in its second; job 1
    of the same array (seed=0,0: identical) runs uninterrupted.

    The tiny job trains its 18 iterations in about a second, faster than a signal round trip
    through SLURM: ``hold`` faults (mdk/faults.py) make each run wait after iterations 6 and 12
    until the signal arrives (at most 20 s; the twin job waits until the test, done with job 0,
    releases the holds)."""
    sweep = tmp_path / "sweep"
    release = tmp_path / "release"  # a hold ends once it exists (the twin's need not wait 20 s)
    env = dict(_env(slurm_cluster), MDK_FAULT="hold:iter:6,hold:iter:12",
               MDK_FAULT_RELEASE=str(release))
    # dataset.num_workers=1 (the built-in dataset's default): SLURM signals the loader worker
    # too, and it must not die before the trainer has saved.
    proc = subprocess.Popen(_cmd(slurm_cluster, data, sweep, "trainer.epochs=3",
                                 "trainer.checkpoint_every_iters=2", "seed=0,0",
                                 "dataset.num_workers=1"),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    last, log_path = sweep / "0" / "checkpoints" / "step1" / "last.pth", sweep / "0" / "run.log"
    try:
        # Signal each run while it is parked in its hold: waiting for a checkpoint instead raced
        # with the tiny job, which can write iterations 8-12 before the test looks.
        wait_for(lambda: "holding at iter 6" in read_text(log_path), 180,
                 "job 0's first run to reach iteration 6", slurm_cluster)
        job_id = json.loads(read_text(sweep / "0" / "result.json"))["job_id"]
        slurm_cluster.run("scancel", "--signal=USR2", job_id)
        wait_for(lambda: "holding at iter 12" in read_text(log_path), 180,
                 "job 0's second run to reach iteration 12", slurm_cluster)
        slurm_cluster.run("scontrol", "requeue", job_id)
        # Released only once job 0 has saved on the signal (a release before would let it train
        # past 12); its rerun starts after 12, so no hold is left for it, and its twin goes on.
        wait_for(lambda: "stop requested (SIGTERM)" in read_text(log_path), 180,
                 "job 0's second run to save on SIGTERM", slurm_cluster)
        release.touch()
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:] + slurm_cluster.logs(10)
    jobs = _jobs(sweep)
    assert [(j["job"], j["status"], j["attempts"]) for j in jobs] == [("0", "completed", 3), ("1", "completed", 1)]
    log = read_text(log_path)
    stops = re.findall(r"stop requested \((SIG\w+)\): saved last.pth after iteration (\d+)", log)
    resumes = re.findall(r"resuming step1 from (\S+) \(iteration (\d+)\)", log)
    assert [s for s, _ in stops] == ["SIGUSR2", "SIGTERM"], log[-3000:]
    # Each rerun ran in the first run's dir and started from the state saved on the signal.
    assert resumes == [(str(last), it) for _, it in stops]
    assert [int(it) for _, it in stops] == [6, 12]  # each stop at its hold
    assert f"Requeued job {job_id}" in log  # USR2: submitit's own requeue, after our save
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")) == ["0", "1"]
    a, b = _weights(sweep / "0"), _weights(sweep / "1")
    assert a["trainer"]["iter"] == b["trainer"]["iter"] == 18
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(x, y) for x, y in zip(_flat(a["optimizer"]), _flat(b["optimizer"])))


def _flat(state: dict) -> list[torch.Tensor]:
    return [t for s in state["state"].values() for t in s.values() if isinstance(t, torch.Tensor)]


def test_search_runs_its_trials_as_slurm_jobs_that_report_to_the_journal(slurm_cluster, data, tmp_path):
    """`hparams_search=lr_warmup` through submitit_slurm, the study in its default journal file in
    the sweep dir: 2 trials side by side (n_jobs=2), each its own SLURM job, each reporting its
    2 epochs to the study from the node; each trial's value is its job's final loss."""
    import optuna
    from omegaconf import OmegaConf

    from launchers.hydra_app.optuna_study import open_storage, storage_url

    sweep = tmp_path / "sweep"
    res = subprocess.run(_cmd(slurm_cluster, data, sweep, "hparams_search=lr_warmup",
                              "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2",
                              "objective.metric=final_loss", "hydra.sweeper.direction=minimize",
                              "hydra/sweeper/pruner=median", "hydra.sweeper.study_name=s",
                              "trainer.epochs=2", "trainer.limit_train_batches=2"),
                         env=_env(slurm_cluster), capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:] + slurm_cluster.logs(10)
    jobs = _jobs(sweep)
    assert [(j["job"], j["status"]) for j in jobs] == [(str(i), "completed") for i in range(2)]
    assert jobs[0]["job_id"] != jobs[1]["job_id"]  # one SLURM job per trial, started as slots free
    study = optuna.load_study(study_name="s", storage=open_storage(storage_url(None, sweep)))
    assert (sweep / "optuna_journal.log").is_file()
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 2
    assert [t.value for t in study.trials] == [j["final_loss"] for j in jobs]
    assert [sorted(t.intermediate_values) for t in study.trials] == [[1, 2], [1, 2]]  # from the nodes
    for t, j in zip(study.trials, jobs):  # the trial's parameters are the job's overrides
        assert f"optim.lr={t.params['optim.lr']}" in j["overrides"]
        assert j["trial"]["state"] == "COMPLETE" and j["trial"]["epoch"] == 2
    best = OmegaConf.load(sweep / "optimization_results.yaml")
    assert best.best_value == study.best_value == min(j["final_loss"] for j in jobs)
