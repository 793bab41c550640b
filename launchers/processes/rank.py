"""One local rank, as torch's elastic agent runs it: ``run_rank`` is the callable spawn.py hands
``elastic_launch``; torch pickles it with its arguments (the function to run: a pipeline's stages,
the plain config, the run dir) and calls it in a fresh interpreter it spawns for the rank once per
command (a child of the launcher, with the launcher's environment as it is at the launch).

How it ends: rank 0 returns the result (torch passes it back to the launcher); a rank that raises
leaves its traceback in torch's error file (torch's ``record`` around this function); a stop
leaves where last.pth stands in the run dir (rank_ends.py) and exits with ``STOP_EXIT``.
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any, NoReturn, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from launchers.processes.env import detect
from launchers.processes.join import StageFn, join
from launchers.processes.log_handlers import FILE_ONLY, setup_worker_logging
from launchers.processes.rank_ends import STOP_EXIT, lost_peer, record_stop
from launchers.processes.stop_signals import end_on_stop_signals, hold_stop_signals, stop_signals
from mdk.engine.build import die_with_parent
from mdk.errors import UserError
from mdk.stop import StopRequested

log = logging.getLogger(__name__)

LOST_PEER_WAIT_S = 1.0


def set_cpu_threads(cfg: DictConfig) -> None:
    """Intra-op threads of this rank: ``dist.cpu_threads``, or with ``auto`` cores / processes on
    this machine (N workers on N cores, not N x N threads fighting for them)."""
    n = cfg.dist.get("cpu_threads", "auto")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.dist.gpus) if n == "auto" else int(n))


def _leave(code: int) -> NoReturn:
    """End this rank now with ``code`` (logs flushed, no interpreter teardown)."""
    logging.shutdown()
    os._exit(code)


def run_rank(fn: StageFn, plain: dict[str, Any], run_dir: str, tag: str) -> Optional[dict]:
    """Run ``fn`` as this local rank; rank 0 returns its result (the others None)."""
    try:
        return _run(fn, OmegaConf.create(plain), Path(run_dir), tag)
    except KeyboardInterrupt:  # a SIGINT before the stop handlers were in place: a stop
        # torch's worker wrapper ends a KeyboardInterrupt with status 0 and no result, which its
        # agent waits on forever
        _leave(STOP_EXIT)


def _run(fn: StageFn, cfg: DictConfig, run: Path, tag: str) -> Optional[dict]:
    # Its own session, as torch's command-line workers have: a Ctrl-C in the terminal reaches
    # the launcher only, which passes the stop on once (to this rank, not its loader workers).
    os.setsid()
    die_with_launcher()
    env = detect()
    setup_worker_logging(run, env.rank)
    set_cpu_threads(cfg)
    log.info("rank %d runs as pid %d", env.rank, os.getpid())
    with stop_signals("rank"):
        try:
            try:
                out = join(cfg, run, fn, env, spawned=True)
                # Done (every stage): from here a stop signal ends this rank at once; it only
                # waits for torch to collect its result.
                end_on_stop_signals()
                # torch lacks a gloo that cannot abort in its C++ statics at interpreter exit
                # (SIGABRT in ~1 of 12 two-rank runs): once torch has the result, exit without it
                atexit.register(_leave, 0)
                return out if env.rank == 0 else None
            except BaseException as e:
                hold_stop_signals()  # its error file first; the agent waits for it
                if isinstance(e, StopRequested):
                    raise
                if isinstance(e, SystemExit) and isinstance(e.code, int):
                    log.error("rank %d exited with code %d", env.rank, e.code)
                    # torch reads a clean exit without a result as "still running": never 0
                    _leave(e.code or 1)
                # Only a consequence of a peer's failure: the rank that failed first logs the cause.
                if isinstance(e, RuntimeError) and lost_peer(str(e)):
                    log.warning("rank %d stopped: %s", env.rank, str(e).splitlines()[0][:300])
                    # torch's agent reports only the first rank it sees end: let it be the one
                    # that failed (a rank killed without a word has no error file to find it by)
                    time.sleep(LOST_PEER_WAIT_S)
                elif isinstance(e, UserError):  # its one line comes from the launcher
                    log.error("rank %d failed", env.rank, exc_info=True, extra=FILE_ONLY)
                else:
                    log.exception("rank %d failed", env.rank)
                raise  # torch's error file carries the traceback to the launcher
        except StopRequested as e:  # also one raised while the exception above was handled
            hold_stop_signals()
            record_stop(run, tag, env.rank, e)
            # Not a return: when the launcher was signalled, torch's agent no longer collects
            # results, and a rank that returned would wait for it until the shutdown timeout.
            _leave(STOP_EXIT)


def die_with_launcher() -> None:
    """SIGKILL this rank when the launcher ends, however it ends (no orphans), which torch's agent
    lacks (a SIGKILLed agent leaves its workers running): the kernel's parent-death signal (Linux;
    a no-op elsewhere), and an end before it was set seen through multiprocessing's sentinel."""
    die_with_parent()
    launcher = multiprocessing.parent_process()
    if launcher is not None and not launcher.is_alive():
        _leave(1)
