"""step.min_iters: a stage trains at least that many optimizer steps, more epochs on a small
dataset (a recipe's fine-tuning stages, conf/experiment/bccd.yaml). The launcher counts the train
split and the cosine (T_max: null, the whole stage) anneals over the longer stage."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO, TINY, run_cmd_env
from mdk.errors import ConfigError
from mdk.stage import config_for_stage


def test_min_iters_rounds_up_to_whole_epochs_and_leaves_long_stages(tiny_cfg):
    cfg = tiny_cfg("step.min_iters=13", "trainer.epochs=1")
    assert config_for_stage(cfg, "step1", train_images=48).trainer.epochs == 3   # 6 steps an epoch
    assert config_for_stage(cfg, "step1", train_images=13 * 8).trainer.epochs == 1
    assert config_for_stage(cfg, "step1").trainer.epochs == 1                     # count unknown
    assert cfg.trainer.epochs == 1                                            # not mutated
    quick = tiny_cfg("step.min_iters=13", "trainer.epochs=1", "trainer.limit_train_batches=2")
    assert config_for_stage(quick, "step1", train_images=48).trainer.epochs == 1  # a quick run
    longer = config_for_stage(tiny_cfg("+stages.step2.min_iters=60"), "step2", train_images=48)
    assert longer.trainer.epochs == 10 and longer.scheduler.T_max is None  # was 8 x 6 = 48


@pytest.mark.slow
def test_a_command_with_min_iters_trains_that_many_steps_on_the_longer_schedule(tmp_path,
                                                                                shared_data):
    argv = [sys.executable, str(REPO / "run.py"), *TINY, f"paths.data={shared_data}",
            f"paths.checkpoints={tmp_path}/ck", f"hydra.run.dir={tmp_path}/run",
            "step.min_iters=13", "trainer.epochs=1", "dist.cpu_threads=1"]
    p = subprocess.run(argv, cwd=REPO, env=run_cmd_env(), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout + p.stderr
    assert "step1: 3 epochs of 6 iterations, for step.min_iters=13 (instead of 1)" in out
    assert "=== step1 ===  3 epochs" in out
    assert "epoch 3/3" in out


def test_trainer_finetune_min_iters_reaches_the_fine_tuning_stages_only(tiny_cfg):
    cfg = tiny_cfg("trainer.finetune_min_iters=60", "trainer.epochs=2")
    assert [config_for_stage(cfg, s, train_images=48).trainer.epochs
            for s in ("step1", "step2", "step3", "step4")] == [2, 10, 10, 10]
    cal = config_for_stage(cfg, "cal", train_images=48)
    assert cal.step.get("min_iters") is None   # cal makes no optimizer steps


def test_bad_min_iters_is_one_line(tiny_cfg):
    from mdk.config import validate

    with pytest.raises(ConfigError, match=r"^step.min_iters=-1 \(step1\) must be an integer >= 0"):
        config_for_stage(tiny_cfg("step.min_iters=-1"), "step1")
    with pytest.raises(ConfigError, match=r"^trainer.finetune_min_iters=-5 must be an integer >= 0"):
        validate(tiny_cfg("trainer.finetune_min_iters=-5"))
