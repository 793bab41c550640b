"""DataLoader workers (the built-in dataset's default is one): same numbers as loading in the
training process, and a worker survives the signals SLURM sends to a whole job step."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import torch

from mdk.checkpoint.files import load_checkpoint
from mdk.engine import build
from mdk.engine.runner import run_stage


def test_workers_give_the_same_weights_as_in_process_loading(tiny_cfg, tmp_path):
    def weights(name: str, workers: int) -> dict:
        cfg = tiny_cfg("trainer.epochs=2", f"dataset.num_workers={workers}",
                       f"paths.checkpoints={tmp_path}/{name}")
        run_stage(cfg, tmp_path / name)
        return load_checkpoint(Path(cfg.paths.checkpoints) / "step1" / "last.pth")["model"]

    a, b = weights("in_process", 0), weights("two_workers", 2)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_default_dataset_uses_a_worker(tiny_cfg):
    import os

    from conftest import compose
    from mdk.world import World

    cfg = compose([])  # the built-in dataset as a user runs it: num_workers auto
    n = build.loader_workers(cfg, World())
    assert n >= 1 and n == max(1, min(8, (os.cpu_count() or 1) - 1))


def test_worker_ignores_preemption_signals(tiny_cfg):
    cfg = tiny_cfg("dataset.num_workers=1")
    train_ds, _ = build.build_data(cfg, grid=2)
    loader, _ = build.build_train_loader(cfg, train_ds)
    it = iter(loader)
    first = next(it)
    (worker,) = it._workers  # noqa: SLF001 - the one worker process of this epoch
    for s in (signal.SIGUSR2, signal.SIGTERM):
        os.kill(worker.pid, s)
    rest = list(it)  # a killed worker would raise "DataLoader worker ... exited unexpectedly"
    assert worker.exitcode in (None, 0)
    assert len(rest) + 1 == len(loader) == 48 // 8 and first[0].shape == (8, 3, 64, 64)


def _grandchild_waits(ready_w: int) -> None:
    """Child of a child: arm die_with_parent, report the pid, then just live on."""
    import time

    build.die_with_parent()
    os.write(ready_w, f"{os.getpid()}\n".encode())
    time.sleep(60)


def test_worker_dies_with_its_rank():
    """A forked loader worker holds copies of its rank's sockets: it must not outlive the rank
    (a SIGKILLed rank otherwise looks alive to its peers, and the orphan lingers)."""
    import multiprocessing as mp
    import time

    r, w = os.pipe()
    ctx = mp.get_context("fork")

    def rank() -> None:
        ctx.Process(target=_grandchild_waits, args=(w,)).start()
        time.sleep(60)

    p = ctx.Process(target=rank)
    p.start()
    with os.fdopen(r) as f:
        worker = int(f.readline())
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        # an orphan is reparented; once killed it may linger as a zombie of its new parent
        with open(f"/proc/{worker}/stat") as st:
            if st.read().split(")")[1].split()[0] == "Z":
                break
        time.sleep(0.05)
    else:
        os.kill(worker, signal.SIGKILL)
        raise AssertionError("the worker outlived its killed parent by 5 s")
