"""Catalogue, config / distributed / cluster entries: one stderr line, exit status 1, before any
process is spawned, and the files already in the checkpoint folder untouched."""
from __future__ import annotations

import pytest
import torch

from conftest import REPO
from launchers.hydra_app.user_error_line import user_error_line
from mdk.errors import user_errors
from helpers.catalogue import assert_intact, cli, one_error_line, snapshot


@pytest.fixture
def existing(tmp_path):
    """Files a previous run left in the checkpoint folder; no bad config may touch them."""
    d = tmp_path / "ck" / "step1"
    d.mkdir(parents=True)
    (d / "last.pth").write_bytes(b"PK\x03\x04 previous run")
    (d / "notes.txt").write_text("keep me")
    return snapshot(tmp_path / "ck")


CASES = {
    # id: (overrides, needles in the one line)
    "wrong_type": (["trainer.epochs=abc"], ["config error: trainer.epochs='abc' must be an integer"]),
    "zero_epochs": (["trainer.epochs=0"], ["config error: trainer.epochs=0 must be an integer >= 1"]),
    "zero_stage_epochs": (["step=step2", "step.epochs=0"],
                          ["config error: step.epochs=0 (step2) must be an integer >= 1, or null"]),
    "negative_batch": (["trainer.batch_size=-8"], ["config error: trainer.batch_size=-8 must be an integer >= 1"]),
    "negative_lr": (["optim.lr=-1"], ["config error: optim.lr=-1 must be a number > 0"]),
    "class_count": (["dataset.num_classes=3"],
                    ["config error: dataset.num_classes=3 but dataset.class_names has 5 names"]),
    "bad_pipeline": (["pipeline=[step1,bogus]"], ["config error: pipeline entry 'bogus' is not a stage"]),
    "rank_ge_nodes": (["dist.rank=1"], ["config error: dist.rank=1 must be < dist.nodes=1"]),
    "zero_gpus": (["dist.gpus=0"], ["config error: dist.gpus=0 must be an integer >= 1"]),
    "multi_node_auto_url": (["dist.nodes=2"], ["config error: dist.dist_url=auto only works on one "
                                               "machine", "dist.dist_url=10.0.0.1:29500"]),
    "bad_dist_url": (["dist.dist_url=node0"], ["config error: dist.dist_url='node0' must be host:port"]),
    "bad_port": (["dist.dist_url=node0:70000"], ["dist.dist_url='node0:70000'", "1..65535"]),
    "batch_not_divisible": (["dist.gpus=3"], ["config error: trainer.batch_size=8 is the global batch",
                                              "dist.gpus*dist.nodes=3"]),
    "exact_chunk_not_dividing": (["dist.gpus=2", "dist.exact_chunk=3", "model.net.batch_norm=false"],
                                 ["config error: dist.exact_chunk=3 must divide the per-process "
                                  "batch trainer.batch_size/world = 8/2 = 4"]),
    "exact_chunk_with_bn": (["dist.exact_chunk=2"],
                            ["config error: dist.exact_chunk=2 cannot train step1 with BatchNorm",
                             "model.net.batch_norm=false"]),
    "stage_override_not_running": (["+stages.step3.epochs=12"],
                                   ["config error: stages.step3.* is set but step3 does not run "
                                    "in this command (stages: step1)"]),
    "channels_last_value": (["trainer.channels_last=nhwc"],
                            ["config error: trainer.channels_last='nhwc' must be true, false or "
                             "auto"]),
    "amp_value": (["trainer.amp=maybe"],
                  ["config error: trainer.amp='maybe' must be true, false or auto"]),
    "unparsable_override": (["paths.data=/d/ü"],
                            ["config error: could not parse the override paths.data=/d/ü (at 'ü')",
                             "must be quoted, e.g. 'paths.data=\"/d/ü\"'"]),
    "progress_value": (["trainer.progress=sometimes"],
                       ["config error: trainer.progress='sometimes' must be true, false or auto "
                        "(auto: progress bars only when stderr is a terminal, none in a log file)"]),
    "loss_ignore_iou": (["loss.ignore_iou=2"],
                        ["config error: loss.ignore_iou=2.0 must be an IoU in [0, 1] or null"]),
    "loss_weight": (["loss.lambda_cls=-1"],
                    ["config error: loss.lambda_cls=-1.0 must be a finite number >= 0"]),
    "eval_box_rule": (["eval.box_rule=pixels"],
                      ["config error: eval.box_rule='pixels' must be devkit or continuous"]),
    "bad_backend": (["dist.backend=mpi"], ["config error: dist.backend='mpi' must be auto, gloo or nccl"]),
    "nccl_without_cuda": (["dist.backend=nccl"], ["config error: dist.backend=nccl needs CUDA GPUs"]),
    "cuda_without_gpu": (["trainer.device=cuda"], ["config error: trainer.device=cuda but this machine "
                                                   "has no usable CUDA GPU"]),
    "missing_stage_input": (["step=step3"], ["missing stage input: step3 starts from cal's result",
                                             "cal/best.pth does not exist",
                                             "Run `python run.py step=cal` first"]),
    "warmup_start_factor": (["scheduler.warmup.start_factor=-0.5"],
                            ["config error: scheduler.warmup.start_factor=-0.5 must be a number in (0, 1]"]),
    "warmup_method": (["scheduler.warmup.method=quadratic"],
                      ["config error: scheduler.warmup.method='quadratic' must be linear or "
                       "constant"]),
    "warmup_iters": (["scheduler.warmup.iters=-5"],
                     ["config error: scheduler.warmup.iters=-5 must be an integer >= 0"]),
    "split_below_one_batch": (["trainer.batch_size=32"],
                              ["data error: dataset.generate.num_train has 16 images, fewer than "
                               "one global batch (trainer.batch_size=32)", "lower trainer.batch_size"]),
    "image_size_no_chip_size": (["pipeline=[step1,step2,cal,step3,step4]", "model.image_size=192",
                                 "export.allow_any_size=false"],
                                ["config error: model.image_size=192 is no input size of chip 5801 "
                                 "(it takes 224, 320, 448, 640 px)",
                                 "export.allow_any_size=true for a simulation-only chip model"]),
    "export_flag": (["export.allow_any_size=maybe"],
                    ["config error: export.allow_any_size='maybe' must be true or false"]),
    "image_size_not_divisible": (["model.image_size=100"],
                                 ["config error: model.image_size=100 must be divisible by 2^5 = 32 "
                                  "(the model has 5 2x2 max-pools): e.g. 96 or 128"]),
    "model_value_its_class_refuses": (["model.net.channels=[8,M,x]", "model.net.mask_bits=[3,3,8]"],
                                      ["config error: model.net (mdk.models.gnetdet.GNetDet): "
                                       "invalid literal for int() with base 10: 'x'"]),
    "rendezvous_unreachable": (["dist.nodes=2", "dist.rank=1", "dist.dist_url=127.0.0.1:1",
                                "dist.timeout_s=1"],
                               ["distributed setup error: could not reach the rendezvous at "
                                "dist.dist_url=127.0.0.1:1", "machine 0 (dist.rank=0) is running"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_config_error_is_one_line(case, tmp_path, capsys, existing):
    if case == "cuda_without_gpu" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU, so trainer.device=cuda is no error here")
    overrides, needles = CASES[case]
    status, _, err = cli(tmp_path, *overrides, capsys=capsys)
    one_error_line(status, err, *needles)
    assert_intact(existing)
    assert not (tmp_path / "run" / "lr_step1.png").exists()  # stopped before any training


@pytest.mark.parametrize("override, needles", [
    ("trainer.bogus=1", ["config error: trainer.bogus=1: trainer has no key 'bogus'; its keys: "
                         "python run.py --cfg job --package trainer"]),
    ("model=nope", ["Could not find 'model/nope'", "Available options", "gnetdet_small"]),
])
def test_hydra_rejects_unknown_keys_and_choices(override, needles, tmp_path, capsys, existing):
    status, _, err = cli(tmp_path, override, capsys=capsys)
    assert status == 1 and "Traceback" not in err
    for n in needles:
        assert n in err, err
    assert_intact(existing)


def test_more_gpus_than_the_machine_has(tmp_path, capsys, existing, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    status, _, err = cli(tmp_path, "dist.gpus=2", "trainer.device=auto", capsys=capsys)
    one_error_line(status, err, "config error: dist.gpus=2 but this machine has 1 GPU(s)",
                   "trainer.device=cpu")
    assert_intact(existing)


def test_checkpoint_folder_is_a_file(tmp_path, capsys):
    (tmp_path / "ck").write_text("not a folder")
    status, _, err = cli(tmp_path, capsys=capsys)
    one_error_line(status, err, f"config error: paths.checkpoints='{tmp_path / 'ck'}'",
                   "is a file, not a folder")
    assert (tmp_path / "ck").read_text() == "not a folder"


def test_user_error_raised_inside_a_rank_is_one_line_naming_the_rank():
    class RankFailedError(RuntimeError):  # what launchers.processes.spawn raises, by name
        pass

    tb = ("rank 1 failed (log: /r/rank1.log):\nTraceback (most recent call last):\n  File x\n"
          "mdk.engine.loop.NonFiniteLossError: loss is not finite at iteration 3: term(s) "
          "['coord'] = [nan]\n")
    assert user_error_line(RankFailedError(tb)) == (
        "training stopped (rank 1): loss is not finite at iteration 3: term(s) ['coord'] = [nan]")
    assert user_error_line(RankFailedError("rank 0 failed:\nKeyError: 'x'")) is None
    assert user_error_line(KeyError("x")) is None  # a bug keeps its traceback


def test_every_kind_of_user_error_is_documented_with_its_label():
    """mdk/errors.py is the one list of kinds; docs/errors.md names each kind's label."""
    text = (REPO / "docs" / "errors.md").read_text()
    kinds = user_errors()
    assert {c.__name__ for c in kinds} >= {"ConfigError", "DataError", "CheckpointError",
                                            "MissingStageInput", "NonFiniteLossError",
                                            "RendezvousError"}
    for cls in kinds:
        assert f"`{cls.label}`" in text, cls
        assert user_error_line(cls("msg")) == f"{cls.label}: msg"
