"""step.min_iters: a stage trains at least that many optimizer steps, more epochs on a small
dataset (a recipe's fine-tuning stages, conf/experiment/bccd.yaml)."""
from __future__ import annotations

import pytest

from mdk.errors import ConfigError
from mdk.stage import StageSpec, lengthen, stage_config


def test_lengthen_rounds_up_to_whole_epochs_and_leaves_long_stages(tiny_cfg):
    cfg = stage_config(tiny_cfg("step.min_iters=13", "trainer.epochs=1"), "step1")
    spec = StageSpec.from_node(cfg.step)
    assert lengthen(cfg, spec, 6).trainer.epochs == 3          # ceil(13 / 6)
    assert lengthen(cfg, spec, 13) is cfg                       # one epoch is enough
    assert cfg.trainer.epochs == 1                              # a copy: cfg is not changed
    off = stage_config(tiny_cfg("trainer.epochs=1"), "step1")
    assert lengthen(off, StageSpec.from_node(off.step), 6) is off   # null: off


def test_a_stage_with_min_iters_runs_that_many_steps(tiny_cfg, tmp_path):
    from mdk.engine.runner import run_stage

    # 48 images / batch 8 = 6 steps per epoch: 13 steps need 3 epochs
    res = run_stage(tiny_cfg("step.min_iters=13", "trainer.epochs=1"), tmp_path / "run")
    assert res.iterations == 18
    quick = run_stage(tiny_cfg("step.min_iters=13", "trainer.epochs=1",
                               "trainer.limit_train_batches=2", f"paths.checkpoints={tmp_path}/q"),
                      tmp_path / "q")
    assert quick.iterations == 2     # a capped quick run keeps its length


def test_bad_min_iters_is_one_line(tiny_cfg):
    with pytest.raises(ConfigError, match=r"^step.min_iters=-1 \(step1\) must be an integer >= 0"):
        stage_config(tiny_cfg("step.min_iters=-1"), "step1")
