"""No checkpoint runs code (docs/errors.md): every ``.pth`` is read with torch's safe unpickler. A
file whose pickle would call a function is refused in one line wherever mdk reads a file (step0/,
a stage input, the evaluate tool, to_gti) and the function never runs; everything mdk writes,
and its older files (numpy's RNG state as an array, format 1), loads under ``weights_only=True``."""
from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from conftest import TINY, compose
from helpers.catalogue import assert_intact, cli, one_error_line, snapshot
from mdk.checkpoint.files import load_checkpoint
from mdk.checkpoint.layout import find_resume, iteration
from mdk.engine.runner import run_stage
from mdk.stage import config_for_stage
from mdk.tools import evaluate, to_gti


class _Payload:
    """Unpickling it calls ``os.mkdir(marker)``: a stand-in for any code a pickle can run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def _booby_trap(path, marker) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {"layers.0.conv.weight": torch.zeros(8, 3, 3, 3)},
                "extra": _Payload(str(marker))}, path)


REFUSED = ("was refused: it would call or build posix.mkdir", "torch's safe unpickler "
           "(weights_only=True), which never runs code from a file", "if you trust the file")


def test_a_pickle_that_runs_code_is_refused_in_step0_and_as_an_input(tmp_path, capsys):
    marker = tmp_path / "code-ran"
    trap = tmp_path / "ck" / "step0" / "best.pth"
    _booby_trap(trap, marker)
    before = snapshot(tmp_path / "ck")
    status, _, err = cli(tmp_path, capsys=capsys)
    one_error_line(status, err, f"checkpoint error: checkpoint {trap} {REFUSED[0]}", *REFUSED[1:])
    status, _, err = cli(tmp_path, "step=step2", f"step.init_weights={trap}", capsys=capsys)
    one_error_line(status, err, f"checkpoint {trap} {REFUSED[0]}")
    assert not marker.exists()
    assert_intact(before)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step0"]


def test_the_tools_refuse_it_too(tmp_path, capsys):
    marker = tmp_path / "code-ran"
    trap = tmp_path / "step3" / "best.pth"
    _booby_trap(trap, marker)
    assert evaluate.main([str(trap)]) == 1
    assert to_gti.main([str(trap), str(tmp_path / "out")]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(REFUSED[0] in line for line in lines)
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_everything_mdk_writes_loads_with_the_safe_unpickler(tmp_path, shared_data):
    torch.set_num_threads(1)
    common = [*TINY, f"paths.data={shared_data}", f"paths.checkpoints={tmp_path}/ck",
              "trainer.epochs=1", "trainer.ema.enabled=true"]
    for s in ("step1", "step2", "cal", "step3", "step4"):
        run_stage(config_for_stage(compose(common), s), tmp_path / "run")
    files = sorted((tmp_path / "ck").rglob("*.pth"))
    assert len(files) == 10
    for p in files:  # torch's own default allow-list: no numpy, no classes
        ck = torch.load(p, weights_only=True)
        assert "model" in ck and ("rng" in ck or ck.get("finished"))


def test_older_files_with_numpy_rng_state_still_load(tmp_path):
    """A format-1 checkpoint as mdk wrote it until 2026-11-28: flat training keys and numpy's RNG
    state as an uint32 array (the only numpy types allowed)."""
    ck = {"model": {"w": torch.ones(2)}, "stage": "step1", "iter": 7, "epoch": 1,
          "best_metric": 0.5, "optimizer": {"state": {}, "param_groups": []},
          "rng": {0: {"python": random.getstate(), "numpy": np.random.get_state(),
                      "torch": torch.get_rng_state()}}}
    torch.save(ck, tmp_path / "last.pth")
    with pytest.raises(Exception):  # torch's default list alone refuses numpy arrays
        torch.load(tmp_path / "last.pth", weights_only=True)
    got = load_checkpoint(tmp_path / "last.pth")
    assert np.array_equal(got["rng"][0]["numpy"][1], np.random.get_state()[1])
    state, path = find_resume(tmp_path)
    assert path == tmp_path / "last.pth" and iteration(state) == 7
