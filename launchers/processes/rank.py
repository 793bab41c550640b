"""``python -m launchers.processes.rank <payload>``: one local rank, as torch's elastic agent
starts it (spawn.py writes the payload: the stage function, the plain config, the run dir).

It ends with ``os._exit`` once its work is done: tearing gloo's C++ statics down at exit can abort
a rank that did all its work (SIGABRT, ~1 in 12 two-rank runs here). Rank 0 leaves its result in
the run dir; a rank that raises, its traceback in torch's error file (``record``); a stop, where
last.pth stands (rank_ends.py).
"""
from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import time
from multiprocessing import spawn
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.errors import record

from launchers.processes.env import detect, leave_process
from launchers.processes.join import join
from launchers.processes.log_handlers import setup_worker_logging
from launchers.processes.rank_ends import lost_peer, record_stop
from launchers.processes.stop_signals import hold_stop_signals, stop_signals
from mdk.engine.build import die_with_parent
from mdk.stop import StopRequested

log = logging.getLogger(__name__)

LOST_PEER_WAIT_S = 1.0


def set_cpu_threads(cfg: DictConfig) -> None:
    """Intra-op threads of this rank: ``dist.cpu_threads``, or with ``auto`` cores / processes on
    this machine (N workers on N cores, not N x N threads fighting for them)."""
    n = cfg.dist.get("cpu_threads", "auto")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.dist.gpus) if n == "auto" else int(n))


@record
def main(payload: str) -> None:
    with open(payload, "rb") as f:
        # The launcher's sys.path and __main__ first (as multiprocessing's spawn does), so that
        # fn can be unpickled also when the launcher's script defines it.
        spawn.prepare(pickle.load(f))
        fn, plain, run_dir, tag, parent = pickle.load(f)
    die_with_parent(parent)  # no orphans: the kernel kills this rank when the launcher dies
    env, cfg, run = detect(), OmegaConf.create(plain), Path(run_dir)
    setup_worker_logging(run, env.rank)
    set_cpu_threads(cfg)
    log.info("rank %d runs as pid %d", env.rank, os.getpid())
    with stop_signals("rank"):
        try:
            try:
                out = join(cfg, run, fn, env, spawned=True)
                hold_stop_signals()  # done: a stop now is for the launcher, between stages
                if env.rank == 0:
                    (run / f".{tag}.result.json").write_text(json.dumps(out))
            except BaseException as e:
                hold_stop_signals()
                if isinstance(e, StopRequested):
                    raise
                if isinstance(e, SystemExit) and isinstance(e.code, int):
                    log.error("rank %d exited with code %d", env.rank, e.code)
                    logging.shutdown()
                    os._exit(e.code)
                # Only a consequence of a peer's failure: the rank that failed first logs the cause.
                if isinstance(e, RuntimeError) and lost_peer(str(e)):
                    log.warning("rank %d stopped: %s", env.rank, str(e).splitlines()[0][:300])
                    # The agent reports the first rank to end: let it be the one that failed
                    # (a rank killed without a word has no error file to find it by).
                    time.sleep(LOST_PEER_WAIT_S)
                else:
                    log.exception("rank %d failed", env.rank)
                raise  # torch's error file carries the traceback to the launcher
        except StopRequested as e:  # also one raised while the exception above was handled
            hold_stop_signals()
            record_stop(run, tag, env.rank, e)
    leave_process()


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except BaseException:  # in its log and torch's error file: the launcher reports it, once
        logging.shutdown()
        os._exit(1)
