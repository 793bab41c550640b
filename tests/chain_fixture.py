"""pytest plugin: the session-scoped ``fitted_chain`` fixture (conftest.py registers it).

A tiny trained chain (step1 -> step4 and the chip-model export) whose step1 fits the 48 training
images (30 epochs, augmentation off), so mAP on the train split is far from 0 and exactness checks
compare real detections, not two empty lists. Its layers take 8-bit masks: the chain keeps most
of its float mAP through quantization (TINY's 3-bit 8-channel layers lose nearly all of it).

It is trained once per suite run, not once per module that reads it: the first pytest-xdist
worker to ask trains it into the run's shared temporary folder under a lock; the others wait for
that and read the same files. Readers never write into it (they copy what they change).
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import TINY, compose
from mdk.engine.runner import run_stage
from mdk.stage import config_for_stage

STAGES = ("step1", "step2", "cal", "step3", "step4")
# The GTI MDK's linear score readings: a logistic head's background logits lie below 0, where the
# chip's 5-bit output layer clips, so its last layer would rank first in the quantization report
# whatever else is planted there (tests/test_quant_report.py plants a defect in another layer).
TRAINING = ["dataset.augment=false", "model.net.mask_bits=[8,8,8,8,8,8,8]",
            "loss.conf_scores=linear", "loss.class_scores=linear"]
PER_STAGE = {"step1": ["trainer.epochs=30", "trainer.eval_every=30", "optim.lr=5e-3"]}
FINE_TUNE = ["trainer.epochs=1", "optim.lr=5e-4"]


def _run_folder(factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this run shares (a worker's own basetemp lies in it)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def fitted_chain(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> dict[str, Any]:
    """``ckpt`` (paths.checkpoints of the chain), ``run`` (its run dir: each stage's pictures)
    and ``overrides`` (this worker's: its data, the chain's checkpoints and training settings)."""
    root = _run_folder(tmp_path_factory) / "fitted_chain"
    overrides = [*TINY, f"paths.data={shared_data}", f"paths.checkpoints={root}/ckpt", *TRAINING]
    root.mkdir(exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one trains; a second waits here, then reads
        if not (root / "done").exists():
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                for s in STAGES:
                    cfg = compose(overrides + PER_STAGE.get(s, FINE_TUNE))
                    run_stage(config_for_stage(cfg, s), root / "run")
            finally:
                torch.set_num_threads(threads)
            (root / "done").touch()
    return {"ckpt": root / "ckpt", "run": root / "run", "overrides": overrides}
