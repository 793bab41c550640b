"""Recipes (conf/experiment/): each composes and validates over the defaults, and a recipe's own
per-stage settings (``stages:``) hold whatever stages a command runs."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO, compose, run_cmd_env
from mdk.config import validate
from mdk.data.shapes import SHAPE_CLASSES, ensure_shapes_dataset
from mdk.stage import config_for_stage

RECIPES = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_composes_and_validates(recipe, tmp_path):
    cfg = compose([f"experiment={recipe}", f"dataset.root={tmp_path}"])
    validate(cfg)
    assert list(cfg.pipeline) == ["step1", "step2", "cal", "step3", "step4"]


def test_the_bccd_recipes():
    big = compose(["experiment=bccd", "dataset.root=/data/BCCD"])
    assert (big.model.image_size, big.dataset.name, list(big.dataset.class_names)) == \
        (448, "bccd", ["WBC", "RBC", "Platelets"])
    assert big.head._target_.endswith("AnchorHead") and big.loss._target_.endswith("AnchorLoss")
    assert big.model.net.mask_bits[0] == 8
    assert config_for_stage(big, "step2", train_images=205).trainer.epochs == 30   # 360 steps / 12
    assert config_for_stage(big, "cal").step.calibration._target_ == "mdk.quant.calibrate.KlCap"
    small = compose(["experiment=bccd_224", "dataset.root=/data/BCCD"])
    assert small.model.image_size == 224 and small.trainer.epochs == 120
    assert str(small.paths.checkpoints).endswith("gnetdet_small_bccd_224")


@pytest.mark.slow
def test_a_recipe_runs_step1_alone_but_a_typed_override_for_a_stage_left_out_is_refused(tmp_path):
    root = ensure_shapes_dataset(tmp_path / "voc", num_train=16, num_val=8, image_size=64, seed=0)
    names = list(SHAPE_CLASSES)
    base = [sys.executable, str(REPO / "run.py"), "experiment=bccd", f"dataset.root={root}",
            f"dataset.class_names=[{','.join(names)}]", f"dataset.num_classes={len(names)}",
            "debug=tiny_model", "dataset.num_workers=0", "trainer.epochs=1",
            f"paths.data={tmp_path}/data", f"hydra.run.dir={tmp_path}/run", "pipeline=[step1]",
            "dist.cpu_threads=1"]
    def run(*extra: str) -> subprocess.CompletedProcess:
        flags = [e for e in extra if e.startswith("-") and "=" not in e]   # before overrides
        args = [*base[:2], *flags, *base[2:], *[e for e in extra if e not in flags]]
        return subprocess.run(args, cwd=REPO, env=run_cmd_env(), capture_output=True, text=True,
                              timeout=600)

    p = run(f"paths.checkpoints={tmp_path}/ck")
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "ck" / "step1" / "best.pth").is_file()
    p = run(f"paths.checkpoints={tmp_path}/ck", "+stages.step3.epochs=2")
    assert p.returncode == 1
    assert "config error: stages.step3.* is set but step3 does not run in this command" in p.stderr
    # a sweep checks each job the same way before it starts any (launchers/hydra_app/sweep_check.py)
    p = run("-m", f"hydra.sweep.dir={tmp_path}/sweep", "seed=0,1", "trainer.limit_train_batches=1")
    assert p.returncode == 0, p.stderr[-2000:]
    p = run("-m", f"hydra.sweep.dir={tmp_path}/sweep2", "seed=0,1", "+stages.step3.epochs=2")
    assert p.returncode == 1 and "stages.step3.* is set but step3 does not run" in p.stderr
