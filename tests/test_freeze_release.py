"""``model.freeze_epochs``: the layers of ``model.freeze`` stay as loaded for the first epochs of a
training stage, then train; under DDP their gradients are reduced from then on (the training net
is built again), so the ranks keep the same weights."""
from __future__ import annotations

import pytest
import torch

from helpers.ddp import release_rank, tiny_cfg
from mdk.config import validate
from mdk.errors import ConfigError

FROZEN = ["model.freeze=[layers.0.*,layers.1.*]", "model.freeze_epochs=1"]


def _run(tmp_path, *extra: str):
    from launchers.processes.spawn import run_ranks
    from mdk.engine.runner import stage_on_rank
    from mdk.stage import config_for_stage

    cfg = tiny_cfg(tmp_path, "trainer.epochs=2", "trainer.checkpoint_every_iters=1",
                   "model.net.batch_norm=false", *extra)
    run_ranks(config_for_stage(cfg, "step1"), tmp_path / "run", stage_on_rank)
    return cfg


def test_frozen_layers_train_from_the_release_epoch(tmp_path, caplog):
    import shutil

    (tmp_path / "run").mkdir()
    with caplog.at_level("INFO"):
        _run(tmp_path, *FROZEN, "trainer.checkpoint_every_iters=3")  # one last.pth per epoch
    assert "epoch 2: model.freeze released (layers.0.*, layers.1.*)" in caplog.text
    ck = torch.load(tmp_path / "ck" / "step1" / "last.pth", weights_only=True)
    assert ck["trainer"]["iter"] == 6
    # the same run stopped after its frozen epoch: layers 0-1 still as initialised
    shutil.rmtree(tmp_path / "ck" / "step1")
    _run(tmp_path, *FROZEN, "trainer.epochs=1")
    one = torch.load(tmp_path / "ck" / "step1" / "last.pth", weights_only=True)["model"]
    torch.manual_seed(0)
    from mdk.models.build import build_model

    init = build_model(tiny_cfg(tmp_path, "model.net.batch_norm=false")).state_dict()
    for k in ("layers.0.conv.weight", "layers.1.conv.bias"):
        assert torch.equal(one[k], init[k]) and not torch.equal(ck["model"][k], init[k]), k
    assert not torch.equal(one["layers.2.conv.weight"], init["layers.2.conv.weight"])


@pytest.mark.ddp
def test_released_layers_are_reduced_over_the_ranks(tmp_path):
    """After the release every rank holds the same weights, the released layer's included: DDP
    reduces its gradient (the training net was built again once it needed one)."""
    from launchers.processes.spawn import run_ranks

    res = run_ranks(tiny_cfg(tmp_path, "dist.gpus=2"), tmp_path / "run", release_rank)
    rank0, rank1 = res["params"]
    assert rank0 == rank1
    assert rank0[:2] != res["start"]  # the first layer trained in the second epoch


@pytest.mark.parametrize("extra, needle", [
    (["model.freeze_epochs=2"], "model.freeze_epochs=2 but model.freeze is empty"),
    (["model.freeze=[layers.0.*]", "model.freeze_epochs=0"], "model.freeze_epochs=0 must be"),
])
def test_freeze_epochs_is_checked(tmp_path, extra, needle):
    with pytest.raises(ConfigError, match=needle):
        validate(tiny_cfg(tmp_path, *extra))
