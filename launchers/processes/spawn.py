"""Start the ranks of a run: in this process, as local workers, or inside torchrun/SLURM tasks.

The parent resolves the config and the run directory once and hands a plain (resolved) config to
every rank, so no worker ever re-resolves Hydra interpolations or picks its own run dir. Each rank
makes its ``mdk.world.World`` once, from the rank this module gave it (or, under torchrun/SLURM,
from their environment: launchers/processes/join.py), and the stage gets it as an argument. Every
rank logs to ``<run_dir>/rank<r>.log``; rank-0-only side effects are decided in ``mdk.dist``.
Failures: a rank that raises writes its traceback to ``<run_dir>/.errors/``; the parent kills the
other local ranks at once (SIGTERM, not the gloo/NCCL timeout) and raises RankFailedError with
the traceback of the rank that failed *first* (the others usually only report "connection closed
by peer" afterwards).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
from omegaconf import DictConfig, OmegaConf

from launchers.processes.env import ProcessEnv, detect, leave_process
from launchers.processes.join import StageFn, join_external
from launchers.processes.rank_logs import remove_rank_file_handler, setup_worker_logging
from launchers.processes.rendezvous import connect, host_store, init_group, parse_url
from mdk.world import backend_for, check_local_size, make_world, single_process

log = logging.getLogger(__name__)

STOP_GRACE_S = 3.0
SHM_MIN_BYTES = 1 << 30  # below this, DataLoader workers can die with "bus error"


class RankFailedError(RuntimeError):
    """A rank raised; the message carries that rank's traceback."""


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


def _record_failure(run_dir: Path, tag: str, rank: int) -> None:
    d = Path(run_dir) / ".errors"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{tag}_rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "time": time.time(), "traceback": traceback.format_exc()}))


def _killed_by_signal(procs: list, first_rank: int) -> list[tuple[int, str]]:
    """(global rank, signal name) of local workers that died by a signal other than the SIGTERM
    torch's join() sends to the survivors of a failure."""
    out = []
    for i, p in enumerate(procs):
        code = p.exitcode
        if code is not None and code < 0 and -code != signal.SIGTERM:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            out.append((first_rank + i, name))
    return out


def _first_failure(run_dir: Path, tag: str) -> dict[str, Any] | None:
    recs = [json.loads(p.read_text()) for p in (Path(run_dir) / ".errors").glob(f"{tag}_rank*.json")]
    return min(recs, key=lambda r: r["time"]) if recs else None


def _lost_peer(text: str) -> bool:
    """True for the error a healthy rank gets when a peer died (gloo/NCCL connection lost)."""
    return any(k in text for k in ("closed by peer", "Connection reset", "remote worker crashing",
                                   "remote process exited"))


def _worker(local_rank: int, fn: StageFn, plain: dict, run_dir: str, addr: str, port: int,
            prefix: str, tag: str) -> None:
    cfg = OmegaConf.create(plain)
    gpus = int(cfg.dist.gpus)
    rank = cfg.dist.rank * gpus + local_rank
    setup_worker_logging(Path(run_dir), rank)
    set_cpu_threads(cfg)
    try:
        world = make_world(rank, local_rank, gpus * cfg.dist.nodes, gpus, cfg.trainer.device,
                           cfg.dist.backend)
        init_group(world.backend, rank, world.size, addr, port, float(cfg.dist.timeout_s), prefix)
        out = fn(cfg, Path(run_dir), world)
        if rank == 0:
            (Path(run_dir) / f".{tag}.result.json").write_text(json.dumps(out))
        tdist.barrier()  # leave together: no rank tears gloo down under a peer still using it
    except BaseException as e:
        # Only a consequence of a peer's failure: the rank that failed first logs the cause.
        if isinstance(e, RuntimeError) and _lost_peer(str(e)):
            logging.getLogger(__name__).warning("rank %d stopped: %s", rank,
                                                str(e).splitlines()[0][:300])
        else:
            logging.getLogger(__name__).exception("rank %d failed", rank)
        _record_failure(Path(run_dir), tag, rank)
        if tdist.is_initialized():
            tdist.destroy_process_group()
        raise
    # Finished: exit without interpreter teardown. Destroying a gloo group (or its C++ statics at
    # exit) can abort a rank that did all its work ("terminate called without an active
    # exception", SIGABRT; ~1 in 12 two-rank runs here), and the parent would report a failure.
    leave_process()


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
        addr, port = parse_url(str(cfg.dist.dist_url))
        connect(addr, port, timeout)  # fail here, once, with the address, not in every worker
    if cfg.dist.gpus == 1:  # one rank on this machine: this process is it (no spawn)
        return _run_inline(cfg, run_dir, fn, addr, port, store)
    # prefix: the same on every machine (the store is per run and stage); tag: files of this parent.
    prefix, tag = f"mdk/{cfg.step.name}", f"{cfg.step.name}_{os.getpid()}_{time.time_ns()}"
    plain = OmegaConf.to_container(cfg, resolve=True)
    ctx = torch.multiprocessing.start_processes(
        _worker, args=(fn, plain, str(run_dir), addr, port, prefix, tag), nprocs=cfg.dist.gpus,
        join=False, start_method="spawn")
    try:
        # On the first failure join() gives the other local ranks STOP_GRACE_S to fail on their
        # own (a peer's error reaches them as "connection reset", which makes a better report),
        # then SIGTERMs them, and SIGKILLs after as long again: a rank stuck in a collective
        # (its SIGTERM only asks the training loop to stop) is gone within seconds, not 30 s.
        while not ctx.join(grace_period=STOP_GRACE_S):
            pass
    except (torch.multiprocessing.ProcessRaisedException,
            torch.multiprocessing.ProcessExitedException) as e:
        first = _first_failure(run_dir, tag)
        shutil.rmtree(run_dir / ".errors", ignore_errors=True)
        lost = first is not None and _lost_peer(first["traceback"])
        killed = _killed_by_signal(ctx.processes, int(cfg.dist.rank) * int(cfg.dist.gpus))
        if killed and (first is None or lost):
            # The real cause: a local rank died without a word (OOM killer, kill -9); a peer's
            # "connection reset" is only its consequence.
            r, sig = killed[0]
            after = (f"; rank {first['rank']} then lost its connection:\n{first['traceback']}"
                     if first else "")
            raise RankFailedError(f"rank {r} was killed by {sig} before it could report (out of "
                                  f"memory? see `dmesg` or the job's memory limit; log: "
                                  f"{run_dir}/rank{r}.log){after}") from None
        if first is None:
            raise RankFailedError(f"a worker process died: {e}. See {run_dir}/rank*.log") from None
        hint = ("\n(this rank lost its connection: a rank on another machine probably failed "
                "first; see that machine's rank*.log)") if lost else ""
        raise RankFailedError(f"rank {first['rank']} failed (log: {run_dir}/rank{first['rank']}"
                              f".log):\n{first['traceback']}{hint}") from None
    finally:
        del store
    result_file = run_dir / f".{tag}.result.json"
    if cfg.dist.rank != 0:
        return {"stage": cfg.step.name, "rank": cfg.dist.rank}
    out = json.loads(result_file.read_text())
    result_file.unlink(missing_ok=True)
    return out
