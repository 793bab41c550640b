"""`pipeline=[...]`: one command runs the stages in order and ends with the stage table; the same
override composes inside a sweep."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from PIL import Image

from conftest import REPO, TINY, compose, run_cmd_env
from mdk.stage import config_for_stage
from mdk.config import validate
from omegaconf import OmegaConf

CHAIN = ["step1", "step2", "cal", "step3", "step4"]
NUM = r"(\d+\.\d+)"


@pytest.mark.slow
def test_pipeline_command_runs_every_stage_and_prints_the_table(tmp_path):
    # TINY's channels at the default chain's 224 px (a chip input size; export.allow_any_size as
    # on defaults), the data following the model's size: the chain ends in a GTI hand-off
    tiny = [*TINY, "model.image_size=224", "export.allow_any_size=false"]
    cmd = [sys.executable, str(REPO / "run.py"), f"pipeline=[{','.join(CHAIN)}]", *tiny,
           "trainer.epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
           *[f"+stages.{s}.epochs=1" for s in ("step2", "step3", "step4")],
           f"paths.data={tmp_path}/data", f"paths.checkpoints={tmp_path}/ckpt",
           f"hydra.run.dir={tmp_path}/run"]
    p = subprocess.run(cmd, cwd=REPO, env=run_cmd_env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    table = (tmp_path / "run" / "summary.txt").read_text().splitlines()
    assert table[0].split()[:4] == ["stage", "mAP@0.5", "best", "ep"]
    assert "loss" in table[0] and "time s" in table[0]
    rows = table[1:1 + len(CHAIN)]
    times = []
    for stage, row in zip(CHAIN, rows):
        # stage, mAP, [best epoch], loss, time, checkpoint dir of that stage
        m = re.match(rf"^{stage}\s+{NUM}\s+(\d+|-)\s+{NUM}\s+{NUM}\s+(\S+)$", row)
        assert m, row
        assert 0.0 <= float(m.group(1)) <= 1.0 and float(m.group(3)) > 0
        times.append(float(m.group(4)))  # seconds, one decimal: a tiny stage can show 0.0
        assert m.group(5) == f"{tmp_path}/ckpt/{stage}"
    assert sum(times) > 0
    assert f"chip model exported to {tmp_path}/ckpt/step4/chip_model" in table
    for s in CHAIN:
        assert (tmp_path / "ckpt" / s / "best.pth").is_file(), s
    # the table is also logged to the run's log (what the user sees on the console)
    shown = p.stdout + p.stderr + (tmp_path / "run" / "run.log").read_text()
    assert all(row in shown for row in rows)
    chip = tmp_path / "ckpt" / "step4" / "chip_model"
    spec = json.loads((chip / "chip_model.json").read_text())
    assert spec["meta"]["image_size"] == 224 and spec["simulation_only"] is False
    gti = chip / "gti"
    assert sorted(p.name for p in gti.iterdir()) == [
        "5801_gnetdet_dat.json", "5801_gnetdet_model.json", "bias.txt", "filter.txt", "relu_cap.txt"]
    cap = float((gti / "relu_cap.txt").read_text())
    assert cap == pytest.approx(31 * spec["output"]["scale"], rel=1e-6)
    model = json.loads((gti / "5801_gnetdet_model.json").read_text())
    assert model["layer"][0]["output height"] == 224
    assert model["layer"][1]["data file"] == os.path.realpath(gti / "chip.dat")
    with Image.open(next((tmp_path / "data" / "shapes" / "JPEGImages").glob("*.jpg"))) as im:
        assert im.size == (224, 224)  # dataset.generate.image_size follows model.image_size


def test_pipeline_composes_inside_a_sweep():
    # `python run.py -m pipeline=[...] scheduler=step,cosine` and a sweep over pipelines themselves:
    # expand the sweep as Hydra's basic sweeper does, compose each job with the real conf/.
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from launchers.hydra_app.hydra_internals import BasicSweeper

    parser = OverridesParser.create()
    sweep = parser.parse_overrides([f"pipeline=[{','.join(CHAIN)}]", "scheduler=step,cosine"])
    jobs = BasicSweeper.split_arguments(sweep, max_batch_size=None)[0]
    assert len(jobs) == 2
    for job in jobs:
        cfg = compose(TINY + list(job))
        validate(cfg)
        assert list(cfg.pipeline) == CHAIN
        for s in CHAIN:  # every stage of every job keeps the job's swept scheduler
            scfg = config_for_stage(cfg, s)
            assert scfg.step.name == s and scfg.scheduler._target_ == cfg.scheduler._target_
            assert scfg.scheduler.warmup == cfg.scheduler.warmup
    sweep = parser.parse_overrides(["pipeline=choice([step1,step2],[step1,step2,cal,step3])"])
    jobs = BasicSweeper.split_arguments(sweep, max_batch_size=None)[0]
    assert [list(compose(TINY + list(j)).pipeline) for j in jobs] == [CHAIN[:2], CHAIN[:4]]


def test_stage_epochs_and_lr_scale_follow_the_stage():
    cfg = compose(TINY + ["trainer.epochs=7", "optim.lr=0.004"])
    one = config_for_stage(cfg, "step1")  # epochs: null -> trainer.epochs
    assert one.trainer.epochs == 7 and one.scheduler.T_max is None and one.optim.lr == 0.004
    for s in ("step2", "step3", "step4"):
        step = OmegaConf.load(REPO / "conf" / "step" / f"{s}.yaml")
        scfg = config_for_stage(cfg, s)
        # the stage's own length, and the cosine schedule anneals over it (interpolation follows)
        assert scfg.trainer.epochs == step.epochs and scfg.scheduler.T_max is None
        assert scfg.optim.lr == pytest.approx(0.004 * step.lr_scale)
    assert cfg.trainer.epochs == 7 and cfg.optim.lr == 0.004  # the input is not changed
    # step=step2 from the command line: its step.* overrides apply
    two = config_for_stage(compose(TINY + ["step=step2", "step.epochs=2", "step.lr_scale=0.5",
                                       "optim.lr=0.004"]), "step2")
    assert two.trainer.epochs == 2 and two.scheduler.T_max is None and two.optim.lr == 0.002


@pytest.mark.parametrize("bad", ["step.epochs=0", "step.lr_scale=-1"])
def test_bad_stage_schedule_names_the_key(bad):
    from mdk.errors import ConfigError

    with pytest.raises(ConfigError, match=bad.split("=")[0]):
        config_for_stage(compose(TINY + ["step=step2", bad]), "step2")


def test_stages_override_one_stage_of_a_pipeline():
    """+stages.<stage>.<key>=v reaches that stage only; step.* stays with the `step` stage."""
    cfg = compose(TINY + [f"pipeline=[{','.join(CHAIN)}]", "trainer.epochs=7", "optim.lr=0.004",
                          "+stages.step3.epochs=12", "+stages.step3.lr_scale=0.25",
                          "+stages.step2.init_required=false"])
    validate(cfg)
    s3 = config_for_stage(cfg, "step3")
    assert s3.step.epochs == 12 and s3.trainer.epochs == 12 and s3.scheduler.T_max is None
    assert s3.optim.lr == pytest.approx(0.001) and s3.step.init_from == "cal"  # the rest kept
    assert config_for_stage(cfg, "step2").step.init_required is False
    step4 = OmegaConf.load(REPO / "conf" / "step" / "step4.yaml")
    assert config_for_stage(cfg, "step4").trainer.epochs == step4.epochs  # untouched
    assert config_for_stage(cfg, "step1").trainer.epochs == 7


@pytest.mark.parametrize("over, needle", [
    ("+stages.step3.epoch=12", r"stages\.step3\.epoch is not a key of conf/step/step3\.yaml; use "
                               r"one of \['bar', 'epochs', 'eval_quant'"),
    ("+stages.step3.epochs=0", r"step\.epochs=0 \(step3\) must be an integer >= 1"),
    ("+stages.step5.epochs=2", r"stages\.step5 is not a stage"),
])
def test_bad_stages_override_names_the_key(over, needle):
    from mdk.errors import ConfigError

    cfg = compose(TINY + [f"pipeline=[{','.join(CHAIN)}]", over])
    with pytest.raises(ConfigError, match=needle):
        validate(cfg)
        config_for_stage(cfg, "step3")


def test_only_a_stage_whose_world_differs_gets_ranks_of_its_own():
    """The stages of a pipeline share one start of the ranks; a stage with other ``dist``
    settings (or device) than the one before it starts ranks of its own."""
    from launchers.hydra_app.entry import same_world

    cfg = compose(TINY + [f"pipeline=[{','.join(CHAIN)}]"])
    configs = [config_for_stage(cfg, s) for s in CHAIN]
    assert same_world(configs) == [[0, 1, 2, 3, 4]]
    configs[2] = OmegaConf.merge(configs[2], {"dist": {"gpus": 2}})
    assert same_world(configs) == [[0, 1], [2], [3, 4]]
    configs[4] = OmegaConf.merge(configs[4], {"trainer": {"device": "cuda"}})
    assert same_world(configs) == [[0, 1], [2], [3], [4]]
