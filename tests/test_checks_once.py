"""A value checked where the config is validated and again where it is used gives the same line
from both places: one check, owned by its config group (trainer.ema: tests/test_ema.py;
step.calibration: tests/test_cal_world.py)."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from conftest import compose
from mdk.data.config import check_dataset
from mdk.data.image_check import apply_bad_image_policy
from mdk.data.samplers import GlobalBatchSampler
from mdk.dist_config import check_world
from mdk.errors import ConfigError, DataError


def test_a_batch_that_does_not_split_over_the_processes():
    with pytest.raises(ConfigError) as from_config:
        check_world(compose(["trainer.batch_size=8", "dist.gpus=3"]))
    with pytest.raises(ConfigError) as from_sampler:
        GlobalBatchSampler(100, 8, rank=0, world=3, seed=0)
    assert str(from_config.value) == ("trainer.batch_size=8 is the global batch and must divide "
                                      "by the world size dist.gpus*dist.nodes=3")
    assert str(from_sampler.value) == ("trainer.batch_size=8 is the global batch and must divide "
                                       "by the world size=3")


def test_an_unknown_bad_image_policy(tmp_path):
    cfg = compose([])
    OmegaConf.update(cfg, "dataset.on_bad_image", "ignore")
    with pytest.raises(DataError) as from_config:
        check_dataset(cfg)
    with pytest.raises(DataError) as from_dataset:
        apply_bad_image_policy(tmp_path, "train", {}, "ignore", 0)
    assert str(from_config.value) == str(from_dataset.value) == (
        "dataset.on_bad_image='ignore' must be one of ['error', 'skip'] (error: stop naming the "
        "file; skip: leave bad images out of the index and list them in the log)")
