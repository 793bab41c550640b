"""python -m mdk.tools.gti_handoff: the model JSON's `data file` set for the machine that runs
GTI's tools, nothing else changed, the CAP value printed; its errors."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO, run_cmd_env
from mdk.quant.gti_sdk import write_gti_files
from mdk.tools.gti_handoff import main
from helpers.gti import model_text, tiny_chip_model

MODEL_JSON = "5801_gnetdet_model.json"


@pytest.fixture
def stage_dir(tmp_path):
    """A stage folder as step4's export leaves it: <stage>/chip_model/gti/ (a tiny 8-px model)."""
    cm, floats = tiny_chip_model()
    write_gti_files(cm, tmp_path / "step4" / "chip_model" / "gti", float_layers=floats,
                    check_size=False)
    return tmp_path / "step4"


@pytest.mark.parametrize("where", ["", "chip_model", "chip_model/gti"])
def test_sets_the_data_file_and_keeps_the_rest_byte_for_byte(stage_dir, where, capsys):
    gti = stage_dir / "chip_model" / "gti"
    before = {p.name: p.read_bytes() for p in gti.iterdir()}
    assert (gti / MODEL_JSON).read_text() == model_text(os.path.realpath(gti / "chip.dat"),
                                                        8, 4, 2, 16, 20)
    assert main([str(stage_dir / where), "--dat-path", "/opt/gti/model/chip.dat"]) == 0
    # the converter's exact layout, with the new path: the only change in the folder
    assert (gti / MODEL_JSON).read_text() == model_text("/opt/gti/model/chip.dat", 8, 4, 2, 16, 20)
    assert {p.name: p.read_bytes() for p in gti.iterdir() if p.name != MODEL_JSON} == \
        {k: v for k, v in before.items() if k != MODEL_JSON}
    out = capsys.readouterr().out
    assert f"{gti / MODEL_JSON}: data file = /opt/gti/model/chip.dat" in out
    assert "CAP (the last layer's cap" in out and out.strip().endswith(": 15.5")


def test_refuses_a_relative_path_and_a_folder_without_a_hand_off(stage_dir, tmp_path, capsys):
    gti = stage_dir / "chip_model" / "gti"
    before = (gti / MODEL_JSON).read_bytes()
    assert main([str(stage_dir), "--dat-path", "model/chip.dat"]) == 1
    assert "error: --dat-path 'model/chip.dat' must be an absolute path" in capsys.readouterr().err
    assert (gti / MODEL_JSON).read_bytes() == before
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--dat-path", "/x/chip.dat"]) == 1
    err = capsys.readouterr().err
    assert f"error: {tmp_path / 'empty'} holds no GTI SDK hand-off" in err and "chip 5801" in err
    (gti / MODEL_JSON).unlink()
    assert main([str(stage_dir), "--dat-path", "/x/chip.dat"]) == 1
    assert "holds 0 GTI model JSON files" in capsys.readouterr().err


def test_the_real_command(stage_dir):
    p = subprocess.run([sys.executable, "-m", "mdk.tools.gti_handoff", str(stage_dir),
                        "--dat-path", "/opt/chip.dat"], cwd=REPO, env=run_cmd_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert '"data file": "/opt/chip.dat"' in \
        (stage_dir / "chip_model" / "gti" / MODEL_JSON).read_text()
