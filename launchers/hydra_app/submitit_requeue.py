"""Hydra submitit launchers whose requeued jobs come back to the SAME job directory and resume,
and whose signals (USR2, SIGTERM, SIGINT) save last.pth first (why and how: docs/cluster.md,
"Preemption and time limits"; the plugin recomputes a rerun's output dir, hydra#2042).
"""
from __future__ import annotations

import contextlib
import json
import logging
import signal
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, run_job, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from launchers.bootstrap import add_plugin_path
from launchers.hydra_app.job_ends import (JobsEndedError, forget_stopped_job, jobs_end_lines,
                                          record_stopped_job)
from launchers.hydra_app.optuna_study import SWEEPER
from launchers.reports.stop_line import SEARCH_RERUN, sweep_rerun
from mdk.atomic_file import write_json
from mdk.stop import StopRequested, arm, clear_stop, request_stop

log = logging.getLogger(__name__)

JOBDIRS = Path(".submitit") / "jobdirs"


def pin_job_dir(cfg: DictConfig, sweep_dir: str, job_num: int, overrides: Sequence[str],
                record: bool = True) -> str:
    """Fix ``hydra.sweep.dir``/``subdir`` in ``cfg`` to what job ``job_num`` used on its first
    run; returns the job dir. ``record``: write the marker on a first run (rank 0 only)."""
    marker = Path(sweep_dir) / JOBDIRS / f"{job_num}.json"
    subdir = None
    if marker.is_file():
        prev = json.loads(marker.read_text())
        if prev.get("overrides") == list(overrides):
            subdir = prev["subdir"]
        else:
            log.warning("%s was written for other overrides (%s); job %d gets a fresh directory",
                        marker, prev.get("overrides"), job_num)
    if subdir is None:
        subdir = str(OmegaConf.select(cfg, "hydra.sweep.subdir"))
        if record:
            write_json(marker, {"subdir": subdir, "overrides": list(overrides)})
    with read_write(cfg.hydra.sweep), open_dict(cfg.hydra.sweep):
        cfg.hydra.sweep.dir = sweep_dir
        cfg.hydra.sweep.subdir = subdir
    return str(Path(sweep_dir) / subdir)


def check_resources_not_swept(master: DictConfig, job_overrides: Sequence[Sequence[str]]) -> None:
    """The SLURM request is made once for the whole sweep from the launching config, so a swept
    ``dist.gpus``/``dist.nodes`` would get the wrong number of processes: refused up front."""
    for overrides in job_overrides:
        for o in overrides:
            key, _, value = o.partition("=")
            key = key.lstrip("+~")
            if key in ("dist.gpus", "dist.nodes") and str(OmegaConf.select(master, key)) != value:
                raise ValueError(
                    f"{o}: {key} cannot be swept with the submitit launchers (the sweep shares one "
                    f"SLURM request, made for {key}={OmegaConf.select(master, key)}). Run one sweep "
                    f"per value, e.g. `python run.py -m hydra/launcher=submitit_slurm {key}={value} ...`")


def slurm_dist_url(cfg: DictConfig, master_addr: str, master_port: int) -> None:
    """A job on several nodes meets where SLURM puts it, so ``dist.dist_url=auto`` (refused for
    ``dist.nodes>1``) becomes that address: it passes the check and the config says where it met."""
    if int(cfg.dist.nodes) > 1 and str(cfg.dist.dist_url) == "auto":
        with open_dict(cfg):
            cfg.dist.dist_url = f"{master_addr}:{master_port}"


@contextlib.contextmanager
def stop_on_signals(signums: Sequence[int]) -> Iterator[dict[int, Any]]:
    """While inside, the signals ask the training loop to save and stop. Yields the previous
    handlers by signal number, plus the signal that arrived under ``"received"``."""
    prev: dict[Any, Any] = {s: signal.getsignal(s) for s in signums}

    def handler(signum: int, frame: Any) -> None:
        prev["received"] = signum
        name = signal.Signals(signum).name
        if request_stop(name):
            log.warning("caught %s: saving last.pth after the current step, then stopping", name)
            return
        log.warning("caught %s while no training loop runs: handing it to submitit", name)
        old = prev[signum]
        if callable(old):
            old(signum, frame)

    for s in signums:
        signal.signal(s, handler)
    arm(True)
    try:
        yield prev
    finally:
        arm(False)
        for s in signums:
            signal.signal(s, prev[s])


class RequeueMixin:
    """Mixed into the plugin's launchers in launchers/plugins/hydra_plugins/mdk_submitit.py."""

    config: DictConfig
    hydra_context: Any
    task_function: Callable

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        check_resources_not_swept(self.config, job_overrides)
        # Jobs unpickle this launcher and the task: the repo and the plugin folder on PYTHONPATH
        # (sbatch --export=ALL passes it on), whatever directory the command ran in.
        add_plugin_path()
        # Resolve the sweep dir here, once, absolute: jobs and their reruns get this string.
        sweep_dir = str(Path(str(self.config.hydra.sweep.dir)).absolute())
        with read_write(self.config.hydra.sweep), open_dict(self.config.hydra.sweep):
            self.config.hydra.sweep.dir = sweep_dir
        import submitit  # here, as the plugin does: Hydra loads this module at every start

        search = OmegaConf.select(self.config, "hydra.sweeper._target_") == SWEEPER
        try:
            return super().launch(job_overrides, initial_job_idx)  # type: ignore[misc]
        except (submitit.core.utils.UncompletedJobError, submitit.core.utils.FailedJobError) as e:
            # One line per job without a result, not submitit's message with its whole stderr.
            lines, status = jobs_end_lines(
                sweep_dir, e, range(initial_job_idx, initial_job_idx + len(job_overrides)))
            raise JobsEndedError(status, lines) from None
        except StopRequested as e:  # a stop signal to this process, which only waits
            rerun = SEARCH_RERUN if search else sweep_rerun(sweep_dir, "collect or resume them")
            e.line = (f"stopped by {e.reason} while waiting for the sweep's jobs; jobs that did not "
                      f"get the signal go on (on SLURM: squeue, scancel); {rerun}")
            raise

    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: dict) -> JobReturn:
        import submitit  # here, as the plugin does: Hydra loads this module at every start

        Singleton.set_state(singleton_state)
        setup_globals()
        env = submitit.JobEnvironment()
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, sweep_overrides)
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.id = env.job_id
            cfg.hydra.job.num = job_num
        if env.num_nodes > 1:
            te = submitit.helpers.TorchDistributedEnvironment()
            slurm_dist_url(cfg, te.master_addr, te.master_port)
        sweep_dir = str(self.config.hydra.sweep.dir)
        job_dir = pin_job_dir(cfg, sweep_dir, job_num, sweep_overrides, record=env.global_rank == 0)
        log.info("job %d (%s) runs in %s", job_num, env.job_id, job_dir)
        clear_stop()
        if env.global_rank == 0:
            forget_stopped_job(sweep_dir, job_num)  # a requeued job runs again
        usr = env._usr_sig()
        with stop_on_signals([usr, signal.SIGTERM, signal.SIGINT]) as prev:
            try:
                return run_job(hydra_context=self.hydra_context, task_function=self.task_function,
                               config=cfg, job_dir_key=job_dir_key,
                               job_subdir_key="hydra.sweep.subdir")
            except StopRequested as e:
                log.warning("%s", e)
                if env.global_rank == 0:  # for the launching process, if no rerun comes
                    record_stopped_job(sweep_dir, job_num, env.job_id, e)
                got = prev.get("received")
                if got == usr and callable(prev.get(usr)):
                    # submitit's handler requeues the same call (a no-op on ranks other than 0).
                    prev[usr](usr, None)
                raise SystemExit(-1) from None  # no result file: the job is not over
