"""Start the ranks of a run: in this process, through torch's elastic agent
(``elastic_launch``), or inside torchrun/SLURM tasks (docs/distributed.md, "Starting the ranks").
Every rank then joins like a torchrun rank (join.py); rank.py is what a spawned rank runs.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from multiprocessing import resource_tracker
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from launchers.processes.env import detect
from launchers.processes.join import HINT, RendezvousError, StageFn, join
from launchers.processes.rank import run_rank, set_cpu_threads
from launchers.processes.rank_ends import ErrorFileLogs, error_files, ranks_outcome
from launchers.processes.stop_signals import STOP_SIGNALS, forwarding, received
from mdk.dist_config import parse_dist_url
from mdk.world import backend_for, check_local_size, single_process

log = logging.getLogger(__name__)
# The agent's own progress lines (rendezvous, "shutting down workers") would sit beside mdk's one
# report of how the ranks ended; its loggers set their own levels, so each is set here.
for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]:
    logging.getLogger(name).setLevel(logging.CRITICAL)
logging.getLogger("torchelastic-events-null").setLevel(logging.CRITICAL)
# torch.multiprocessing's "Terminating process ... via signal SIGTERM" when a rank failed: the
# peers' ends are in ranks_outcome's one report.
logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)


STOP_WAIT_S = 120  # after a stop signal: time for the ranks to save last.pth and end
# mdk's handlers own the stop signals (stop_signals.py; SIGHUP ends the ranks too) and the ranks
# get STOP_WAIT_S to save. A torch without these knobs handles the signals itself, 30 s grace.
KNOBS = {"signals_to_handle": "SIGHUP", "shutdown_timeout": STOP_WAIT_S}
TRACKER_QUIET = "ignore::UserWarning:multiprocessing.resource_tracker"
SHM_MIN_BYTES = 1 << 30  # below this, DataLoader workers can die with "bus error"


def check_shm(num_workers: int, path: str = "/dev/shm") -> bool:
    """Warn (and return False) when DataLoader workers would share batches through a tiny /dev/shm
    (Docker's default is 64 MB); the symptom later is a cryptic 'bus error' in a worker."""
    if num_workers <= 0 or not os.path.isdir(path):
        return True
    free = shutil.disk_usage(path).free
    if free >= SHM_MIN_BYTES:
        return True
    log.warning("%s has only %d MB free and trainer.num_workers=%d: DataLoader workers pass batches "
                "through shared memory and may crash with 'bus error' / 'unable to write to file "
                "</torch_...>'. Fix: give the container more (docker run --shm-size=8g, or a "
                "k8s emptyDir with medium: Memory), or set trainer.num_workers=0",
                path, free >> 20, num_workers)
    return False


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (it removes the named semaphores of the agent's
    result queues when this process is killed) with its leak warning off, which multiprocessing
    has no switch for: after a ``kill -9`` of the command it would add "There appear to be 9
    leaked semaphore objects" to the user's terminal, about a clean-up it does as it should."""
    before = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [before, TRACKER_QUIET]))
    try:
        resource_tracker.ensure_running()  # started once per process; later calls return
    finally:
        if before is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = before


def _launch_config(cfg: DictConfig, logs: ErrorFileLogs) -> LaunchConfig:
    nodes, timeout = int(cfg.dist.nodes), int(float(cfg.dist.timeout_s))
    if nodes == 1:  # a free port the agent's store keeps for the run: runs never collide
        rdzv = dict(rdzv_backend="c10d", rdzv_endpoint="localhost:0")
    else:  # machine 0 hosts the store at dist.dist_url; the others dial it
        host, port = parse_dist_url(str(cfg.dist.dist_url))
        rdzv = dict(rdzv_backend="static", rdzv_endpoint=f"{host}:{port}")
    return LaunchConfig(
        min_nodes=nodes, max_nodes=nodes, nproc_per_node=int(cfg.dist.gpus),
        run_id=f"mdk-{cfg.step.name}", max_restarts=0,
        rdzv_configs={"rank": int(cfg.dist.rank), "timeout": timeout}, **rdzv,
        # torch's default: each rank a fresh interpreter, a child of this process (a fork of a
        # launcher that ran OpenMP threads hangs in libgomp; CUDA cannot start after a fork)
        monitor_interval=0.1, logs_specs=logs, start_method="spawn",
        **{k: v for k, v in KNOBS.items() if k in LaunchConfig.__dataclass_fields__})


def _rendezvous_error(cfg: DictConfig, e: BaseException) -> RendezvousError:
    url, why = str(cfg.dist.dist_url), str(e).splitlines()[0] if str(e) else type(e).__name__
    if int(cfg.dist.rank) == 0:
        return RendezvousError(
            f"cannot open the rendezvous at dist.dist_url={url} on machine 0 or the other "
            f"machines did not arrive within dist.timeout_s={cfg.dist.timeout_s:g}: {why}. "
            f"Pick a free port and give the same dist.dist_url=HOST:PORT on every machine; "
            f"{HINT}")
    return RendezvousError(
        f"could not reach the rendezvous at dist.dist_url={url} within dist.timeout_s="
        f"{cfg.dist.timeout_s:g}: nothing answered ({why}). {HINT[0].upper() + HINT[1:]}")


def run_ranks(cfg: DictConfig, run_dir: Path, fn: StageFn) -> dict:
    """Run ``fn(cfg, run_dir, world)`` on every rank of this machine; return rank 0's result."""
    nw = cfg.trainer.num_workers if cfg.trainer.num_workers is not None else \
        cfg.dataset.get("num_workers", 0)
    check_shm(1 if nw == "auto" else int(nw or 0))
    env = detect()
    if cfg.dist.get("cpu_threads", "auto") != "auto":  # auto: torch's default in this process
        set_cpu_threads(cfg)  # (spawned ranks always set theirs)
    if env.external:
        return join(cfg, run_dir, fn, env)
    # Machine checks before any process starts (two ranks on one GPU, CUDA asked for but absent).
    check_local_size(cfg.trainer.device, int(cfg.dist.gpus))
    if cfg.dist.gpus * cfg.dist.nodes == 1:
        return fn(cfg, run_dir, single_process(cfg.trainer.device))
    if backend_for(cfg.trainer.device, cfg.dist.backend) == "gloo":
        log.info("running %d CPU worker processes with gloo on this machine (world size %d)",
                 cfg.dist.gpus, cfg.dist.gpus * cfg.dist.nodes)
    tag = f"{cfg.step.name}_{os.getpid()}_{time.time_ns()}"  # this launcher's files
    run_dir.mkdir(parents=True, exist_ok=True)
    _start_resource_tracker()  # quiet: multiprocessing's tracker has no switch for its warning
    handlers = {s: signal.getsignal(s) for s in (*STOP_SIGNALS, signal.SIGHUP)}
    logs = ErrorFileLogs(str(run_dir / ".ranks"))
    failures, tracebacks, results = None, {}, {}
    try:
        with forwarding():
            results = elastic_launch(_launch_config(cfg, logs), run_rank)(
                fn, OmegaConf.to_container(cfg, resolve=True), str(run_dir), tag)
    except ChildFailedError as e:
        failures = e.failures
    except SignalException:
        pass  # a stop signal: the agent passed it on and waited for the ranks (ranks_outcome)
    except (RuntimeError, OSError) as e:  # the agent's rendezvous: DistNetworkError/StoreError
        if received() is None:
            raise _rendezvous_error(cfg, e) from e
    finally:
        for s, h in handlers.items():  # torch's agent never puts back the handlers it replaced
            signal.signal(s, h)
        tracebacks = error_files(logs.error_files, int(cfg.dist.rank) * int(cfg.dist.gpus))
        shutil.rmtree(run_dir / ".ranks", ignore_errors=True)
    err = ranks_outcome(run_dir, tag, failures, tracebacks, received(), int(cfg.dist.nodes) > 1)
    if err is not None:
        raise err from None
    if cfg.dist.rank != 0:
        return {"stage": cfg.step.name, "rank": cfg.dist.rank}
    return results[0]  # torch's return values, by global rank
