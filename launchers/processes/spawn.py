"""Start the ranks of a run: in this process, as local workers, or inside torchrun/SLURM tasks.

The parent resolves the config and the run directory once and hands a plain (resolved) config to
every rank, so no worker ever re-resolves Hydra interpolations or picks its own run dir. Each rank
makes its ``mdk.world.World`` once, from the rank this module gave it (or, under torchrun/SLURM,
from their environment: launchers/processes/join.py), and the stage gets it as an argument. Every
rank logs to ``<run_dir>/rank<r>.log``; rank-0-only side effects are decided in ``mdk.dist``.
Failures: a rank that raises writes its traceback to ``<run_dir>/.errors/``; the parent kills the
other local ranks at once (SIGTERM, not the gloo/NCCL timeout) and reports the rank that failed
*first*, or how a rank that could not report ended (launchers/processes/rank_ends.py). Stop
signals to the parent are passed on to the ranks, which save and stop
(launchers/processes/stop_signals.py); the ranks die with the parent (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as tdist
from omegaconf import DictConfig, OmegaConf

from launchers.processes.env import ProcessEnv, detect, leave_process
from launchers.processes.join import StageFn, join_external
from launchers.processes.rank_ends import lost_peer, ranks_outcome, record_failure, record_stop
from launchers.processes.rank_logs import remove_rank_file_handler, setup_worker_logging
from launchers.processes.rendezvous import connect, host_store, init_group
from launchers.processes.stop_signals import (forwarding_to, hold_stop_signals, received,
                                              signals_held, stop_signals)
from mdk.dist_config import parse_dist_url
from mdk.engine.build import die_with_parent
from mdk.stop import StopRequested
from mdk.world import World, backend_for, check_local_size, make_world, single_process

log = logging.getLogger(__name__)
# torch's join() warns "Terminating process N via signal SIGTERM" when a peer of a failed rank
# outlives the grace period (a busy machine); that SIGTERM is this module's plan, and the
# failure's one line is rank_ends.py's: the warning would be a second, misleading line.
logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)

STOP_GRACE_S = 3.0
STOP_WAIT_S = 120.0  # after a stop signal: time for the ranks to save last.pth and end
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


def _worker(local_rank: int, fn: StageFn, plain: dict, run_dir: str, addr: str, port: int,
            prefix: str, tag: str, parent: int) -> None:
    die_with_parent(parent)  # no orphans: the kernel kills this rank when the launcher dies
    cfg = OmegaConf.create(plain)
    gpus = int(cfg.dist.gpus)
    rank = cfg.dist.rank * gpus + local_rank
    setup_worker_logging(Path(run_dir), rank)
    set_cpu_threads(cfg)
    log.info("rank %d runs as pid %d", rank, os.getpid())
    with stop_signals("rank"):
        try:
            try:
                out = fn(cfg, Path(run_dir), _join(cfg, rank, local_rank, addr, port, prefix))
                hold_stop_signals()  # done: a stop now is for the launcher, between stages
                if rank == 0:
                    (Path(run_dir) / f".{tag}.result.json").write_text(json.dumps(out))
                tdist.barrier()  # leave together: no rank tears gloo down under a peer using it
            except BaseException as e:
                _ended(e, Path(run_dir), tag, rank)
        except StopRequested as e:  # a stop signal raised while the exception above was handled
            _ended(e, Path(run_dir), tag, rank)
    # Finished or stopped: exit without interpreter teardown. Destroying a gloo group (or its C++
    # statics at exit) can abort a rank that did all its work ("terminate called without an
    # active exception", SIGABRT; ~1 in 12 two-rank runs here), and the parent would report a
    # failure.
    leave_process()


def _join(cfg: DictConfig, rank: int, local_rank: int, addr: str, port: int,
          prefix: str) -> World:
    gpus = int(cfg.dist.gpus)
    world = make_world(rank, local_rank, gpus * cfg.dist.nodes, gpus, cfg.trainer.device,
                       cfg.dist.backend)
    init_group(world.backend, rank, world.size, addr, port, float(cfg.dist.timeout_s), prefix)
    return world


def _ended(e: BaseException, run_dir: Path, tag: str, rank: int) -> None:
    """A rank's work ended early: a stop is recorded (the rank then exits with status 0), an exit
    code is kept, anything else is recorded and raised again (torch reports it to the parent)."""
    hold_stop_signals()
    if isinstance(e, StopRequested):
        record_stop(run_dir, tag, rank, e)
        return
    if isinstance(e, SystemExit) and isinstance(e.code, int):
        log.error("rank %d exited with code %d", rank, e.code)
        logging.shutdown()
        os._exit(e.code)
    # Only a consequence of a peer's failure: the rank that failed first logs the cause.
    if isinstance(e, RuntimeError) and lost_peer(str(e)):
        log.warning("rank %d stopped: %s", rank, str(e).splitlines()[0][:300])
    else:
        log.exception("rank %d failed", rank)
    record_failure(run_dir, tag, rank)
    if tdist.is_initialized():
        tdist.destroy_process_group()
    raise e


def set_cpu_threads(cfg: DictConfig) -> int:
    """Intra-op threads of this rank: ``dist.cpu_threads``, or with ``auto`` cores / processes on
    this machine (N workers on N cores, not N x N threads fighting for them). Returns the count."""
    n = cfg.dist.get("cpu_threads", "auto")
    n = max(1, (os.cpu_count() or 1) // cfg.dist.gpus) if n == "auto" else int(n)
    torch.set_num_threads(n)
    return n


def _run_inline(cfg: DictConfig, run_dir: Path, fn: StageFn, addr: str, port: int,
                store: Any) -> dict:
    """One rank on this machine (dist.gpus=1, several machines): this process is the rank."""
    rank = int(cfg.dist.rank)
    setup_worker_logging(run_dir, rank, keep_existing=True)
    try:
        world = make_world(rank, 0, int(cfg.dist.nodes), 1, cfg.trainer.device, cfg.dist.backend)
        init_group(world.backend, rank, world.size, addr, port, float(cfg.dist.timeout_s),
                   f"mdk/{cfg.step.name}", store)
        out = fn(cfg, run_dir, world)
        tdist.barrier()  # leave together (see _worker)
        return out if rank == 0 else {"stage": cfg.step.name, "rank": rank}
    finally:
        remove_rank_file_handler(rank)
        if tdist.is_initialized():
            tdist.destroy_process_group()


def run_ranks(cfg: DictConfig, run_dir: Path, fn: StageFn) -> dict:
    """Run ``fn(cfg, run_dir)`` on every rank of this machine; return rank 0's result."""
    nw = cfg.trainer.num_workers if cfg.trainer.num_workers is not None else \
        cfg.dataset.get("num_workers", 0)
    check_shm(1 if nw == "auto" else int(nw or 0))
    env: ProcessEnv = detect()
    if cfg.dist.get("cpu_threads", "auto") != "auto":  # auto: torch's default in this process
        set_cpu_threads(cfg)  # (spawned workers below always set theirs)
    if env.external:
        return join_external(cfg, run_dir, fn, env)
    size = cfg.dist.gpus * cfg.dist.nodes
    # Machine checks before any process starts (two ranks on one GPU, CUDA asked for but absent).
    check_local_size(cfg.trainer.device, int(cfg.dist.gpus))
    if size == 1:
        return fn(cfg, run_dir, single_process(cfg.trainer.device))
    if backend_for(cfg.trainer.device, cfg.dist.backend) == "gloo":
        log.info("running %d CPU worker processes with gloo on this machine (world size %d)",
                 cfg.dist.gpus, size)
    timeout = float(cfg.dist.timeout_s)
    store = None
    if cfg.dist.rank == 0:  # machine 0 hosts the rendezvous for the whole run
        store, addr, port = host_store(str(cfg.dist.dist_url), int(cfg.dist.nodes), timeout)
    else:
        addr, port = parse_dist_url(str(cfg.dist.dist_url))
        connect(addr, port, timeout)  # fail here, once, with the address, not in every worker
    if cfg.dist.gpus == 1:  # one rank on this machine: this process is it (no spawn)
        return _run_inline(cfg, run_dir, fn, addr, port, store)
    # prefix: the same on every machine (the store is per run and stage); tag: files of this parent.
    prefix, tag = f"mdk/{cfg.step.name}", f"{cfg.step.name}_{os.getpid()}_{time.time_ns()}"
    plain = OmegaConf.to_container(cfg, resolve=True)
    with contextlib.ExitStack() as forwarding:
        with signals_held():  # until the ranks' pids are known to the stop-signal handler
            ctx = torch.multiprocessing.start_processes(
                _worker, args=(fn, plain, str(run_dir), addr, port, prefix, tag, os.getpid()),
                nprocs=cfg.dist.gpus, join=False, start_method="spawn")
            forwarding.enter_context(forwarding_to(ctx.pids()))
        first_failed = _wait(ctx)
    del store
    err = ranks_outcome(run_dir, tag, ctx.processes, int(cfg.dist.rank) * int(cfg.dist.gpus),
                        first_failed, received(), int(cfg.dist.nodes) > 1)
    if err is not None:
        raise err from None
    result_file = run_dir / f".{tag}.result.json"
    if cfg.dist.rank != 0:
        return {"stage": cfg.step.name, "rank": cfg.dist.rank}
    out = json.loads(result_file.read_text())
    result_file.unlink(missing_ok=True)
    return out


def _wait(ctx: Any) -> Optional[int]:
    """Wait for the ranks; the index of the one torch saw fail first (None: all exited with 0).

    On the first failure join() gives the other local ranks STOP_GRACE_S to fail on their own (a
    peer's error reaches them as "connection reset", which makes a better report), then SIGTERMs
    them, and SIGKILLs after as long again: a rank stuck in a collective (its SIGTERM only asks
    the training loop to stop) is gone within seconds, not 30 s. After a stop signal the ranks get
    STOP_WAIT_S to save and stop, then they are killed."""
    deadline = None
    try:
        while not ctx.join(timeout=1.0, grace_period=STOP_GRACE_S):
            if received() is None:
                continue
            deadline = deadline or time.monotonic() + STOP_WAIT_S
            if time.monotonic() > deadline:
                log.error("the ranks did not stop within %.0f s of the signal: killing them",
                          STOP_WAIT_S)
                for p in ctx.processes:
                    if p.is_alive():
                        os.kill(p.pid, signal.SIGKILL)
    except (torch.multiprocessing.ProcessRaisedException,
            torch.multiprocessing.ProcessExitedException) as e:
        return e.error_index
    return None
