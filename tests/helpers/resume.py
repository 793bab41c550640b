"""A tiny run of python run.py in a process, its checkpoints, and the training state two runs
must share."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from conftest import REPO, run_cmd_env


TINY_RUN = ["debug=tiny", "dataset.generate.num_train=32", "dataset.generate.num_val=8",
            "trainer.epochs=3", "trainer.checkpoint_every_iters=2"]


def run(tmp: Path, name: str, data: Path, fault: str = "", *extra: str) -> subprocess.CompletedProcess:
    env = dict(run_cmd_env(), OMP_NUM_THREADS="1")
    env.pop("MDK_FAULT", None)
    if fault:
        env["MDK_FAULT"] = fault
    args = [*TINY_RUN, f"paths.data={data}", f"paths.checkpoints={tmp / name}",
            f"hydra.run.dir={tmp / 'runs' / name}", *extra]
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def ckpt(tmp: Path, name: str, file: str = "last.pth") -> dict:
    return torch.load(tmp / name / "step1" / file, weights_only=False)


def assert_same_training_state(a: dict, b: dict) -> None:
    assert a["trainer"]["iter"] == b["trainer"]["iter"] and a["trainer"]["epoch"] == b["trainer"]["epoch"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for pid, s in a["optimizer"]["state"].items():
        for k, v in s.items():
            assert torch.equal(v, b["optimizer"]["state"][pid][k]), (pid, k)
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"]
    assert a["hooks"]["CheckpointHook"] == b["hooks"]["CheckpointHook"]
