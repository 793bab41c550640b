"""Starting from weights a user already has (docs/pipeline.md, "Start from weights"): a model of
another class count in ``step0/`` or named by ``step.init_weights`` (what fits comes over, the
output layer is re-initialised and said), a GTI MDK checkpoint wherever a starting file is read
(step0, the input of step2/step3/step4, the evaluate tool), and the one-line refusals. Through
the real command (``cli``: run.py's main in this process) on the tiny preset."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY, compose
from helpers.catalogue import argv_of, assert_intact, cli, one_error_line, snapshot
from mdk.checkpoint import gti_mdk
from mdk.checkpoint.files import load_checkpoint
from mdk.checkpoint.sources import chip_layer_count
from mdk.checkpoint.weights_file import load_start, read_weights
from mdk.data.shapes import ensure_shapes_dataset
from mdk.engine.runner import run_stage
from mdk.models.build import build_model
from mdk.stage import config_for_stage
from mdk.stage_config import StageConf
from mdk.tools import evaluate

pytestmark = pytest.mark.slow  # a chain and ~10 tiny stage runs: ~1 min on 2 cores
CHAIN = ("step1", "step2", "cal", "step3")


@pytest.fixture(scope="module")
def chain(tmp_path_factory, shared_data) -> Path:
    """An mdk tiny chain step1 -> step3 (5 classes); returns its checkpoint root."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("chain")
    common = [*TINY, f"paths.data={shared_data}", f"paths.checkpoints={root}/ck",
              "trainer.epochs=1"]
    for s in CHAIN:
        run_stage(config_for_stage(compose(common), s), root / "run")
    return root / "ck"


@pytest.fixture(scope="module")
def gti_root(chain, tmp_path_factory) -> Path:
    """The chain's checkpoints written in the GTI MDK's layout: checkpoint/step1..3/best.pth
    (step1 with BN, the output conv's an identity) and model/relu_cap.txt (cal's caps)."""
    root = tmp_path_factory.mktemp("gti")
    for gti_step, stage in ((1, "step1"), (2, "step2"), (3, "step3")):
        state = load_checkpoint(chain / stage / "best.pth")["model"]
        p = root / "checkpoint" / f"step{gti_step}" / "best.pth"
        p.parent.mkdir(parents=True)
        torch.save(gti_mdk.from_mdk(state, chip_layer_count(state)), p)
    cal = load_checkpoint(chain / "cal" / "best.pth")["model"]
    gti_mdk.write_caps(root / "model" / "relu_cap.txt", gti_mdk.caps_of(cal, chip_layer_count(cal)))
    return root


def _voc(root: Path, classes: list[str]) -> list[str]:
    """A VOC folder of ``classes`` (the built-in generator's), and the overrides that read it."""
    ensure_shapes_dataset(root, num_train=16, num_val=8, image_size=64, seed=1, class_names=classes)
    return ["dataset=voc", f"dataset.root={root}", "dataset.train_split=train",
            "dataset.val_split=val", f"dataset.class_names=[{','.join(classes)}]",
            f"dataset.num_classes={len(classes)}", "dataset.num_workers=0"]


@pytest.mark.parametrize("classes", [["circle"], ["circle", "square", "triangle"]],
                         ids=["1-class", "3-class"])
def test_a_5_class_model_in_step0_starts_a_step1_of_another_class_count(chain, tmp_path, capsys,
                                                                          classes):
    step0 = tmp_path / "ck" / "step0"
    step0.mkdir(parents=True)
    shutil.copy(chain / "step1" / "best.pth", step0 / "best.pth")
    data = _voc(tmp_path / "voc", classes)
    status, out, err = cli(tmp_path, *data, capsys=capsys)
    assert status == 0, err[-2000:]
    n = len(classes)
    assert (f"step1 starts from {step0 / 'best.pth'} (an mdk checkpoint): 36 of 38 tensors "
            f"copied; re-initialised: the output layer (layers.6.conv: 10 \u2192 {5 + n} "
            f"channels, class count 5 \u2192 {n})") in out + err
    assert load_checkpoint(tmp_path / "ck" / "step1" / "last.pth")["trainer"]["iter"] == 2
    # every tensor that came over equals the file's; the output layer kept its initialisation
    cfg = compose(argv_of(tmp_path, tuple(data)))
    spec = StageConf.from_node(config_for_stage(cfg, "step1").step)
    torch.manual_seed(0)
    model = build_model(cfg)
    torch.manual_seed(0)
    fresh = build_model(cfg)
    load_start(model, read_weights(step0 / "best.pth", "advice"), cfg, spec)
    theirs = load_checkpoint(step0 / "best.pth")["model"]
    for k, v in model.state_dict().items():
        if k.startswith("layers.6.conv."):
            assert v.shape[0] == 5 + n and torch.equal(v, fresh.state_dict()[k]), k
        else:
            assert torch.equal(v, theirs[k]), k


def test_init_weights_names_the_starting_file(chain, tmp_path, capsys):
    mine = tmp_path / "elsewhere" / "pretrained.pth"
    mine.parent.mkdir()
    shutil.copy(chain / "step1" / "best.pth", mine)
    status, out, err = cli(tmp_path, f"step.init_weights={mine}",
                           *_voc(tmp_path / "voc", ["star", "cross"]), capsys=capsys)
    assert status == 0, err[-2000:]
    assert f"step1 starts from {mine} (an mdk checkpoint): 36 of 38 tensors copied" in out + err
    assert "class count 5 \u2192 2" in out + err


def test_layers_that_do_not_fit_are_refused_in_one_line(chain, tmp_path, capsys):
    step0 = tmp_path / "ck" / "step0"
    step0.mkdir(parents=True)
    shutil.copy(chain / "step1" / "best.pth", step0 / "best.pth")
    before = snapshot(tmp_path / "ck")
    status, _, err = cli(tmp_path, "model.net.channels=[8,M,16,M,8,M,8,M,8,M,8]", capsys=capsys)
    one_error_line(status, err, f"checkpoint error: an mdk checkpoint {step0 / 'best.pth'} does "
                   "not fit model=gnetdet_small: layers.1.conv.weight is (8, 8, 3, 3) in the file "
                   "and (16, 8, 3, 3) in the model (another channel list)",
                   "pretrained starting point of step1 (step0/)")
    assert "step=None" not in err
    status, _, err = cli(tmp_path, "model.net.channels=[8,M,8,M,8,M,8,M,8]",
                         "model.net.mask_bits=[3,3,3,3,3,8]", capsys=capsys)
    one_error_line(status, err, "the file has 7 conv layers, the model 6 (another depth)")
    assert_intact(before)
    assert not (tmp_path / "ck" / "step1").exists()


def test_gti_files_start_every_stage_and_evaluate(chain, gti_root, tmp_path, capsys):
    """GTI-layout files of the chain: step1's in step0/, and each named with step.init_weights as
    the input of step2, step3 (caps from <root>/model/relu_cap.txt) and step4; the evaluate tool
    gives the numbers of mdk's own file."""
    step0 = tmp_path / "a" / "ck" / "step0"
    step0.mkdir(parents=True)
    shutil.copy(gti_root / "checkpoint" / "step1" / "best.pth", step0)
    status, out, err = cli(tmp_path / "a", capsys=capsys)
    assert status == 0, err[-2000:]
    assert "(a GTI MDK checkpoint): 38 of 38 tensors copied; GTI step 1, float (a float " \
           "starting point); read with model=gnetdet_small's layers (pools after layers " \
           "[0, 1, 2, 3, 4]); its output conv's BatchNorm folded" in out + err
    for stage, gti_step in (("step2", 1), ("step3", 2)):
        status, out, err = cli(tmp_path / stage, f"step={stage}",
                               f"step.init_weights={gti_root}/checkpoint/step{gti_step}/best.pth",
                               capsys=capsys)
        assert status == 0, err[-2000:]
        assert f"(a GTI MDK checkpoint): GTI step {gti_step}" in out + err
    assert f"caps from {gti_root / 'model' / 'relu_cap.txt'}" in out + err
    res = evaluate.evaluate_path(gti_root / "checkpoint" / "step3" / "best.pth",
                                 argv_of(tmp_path / "ev", ()))
    ref = evaluate.evaluate_path(chain / "step3" / "best.pth", argv_of(tmp_path / "ev", ()))
    assert (res["map50"], res["loss"]) == (ref["map50"], ref["loss"])
    assert res["description"].startswith(
        f"{gti_root / 'checkpoint' / 'step3' / 'best.pth'} is a GTI MDK checkpoint (") and \
        "GTI step 3, quantized weights and 5-bit activations" in res["description"]


def test_a_chip_model_from_a_gti_step3_file_equals_mdks(chain, gti_root, tmp_path, capsys):
    """step4 from the GTI layout of mdk's step3 and its caps exports the chip model step4 exports
    from mdk's own step3 checkpoint."""
    mine = tmp_path / "mine"
    shutil.copytree(chain, mine / "ck")
    status, _, err = cli(mine, "step=step4", capsys=capsys)
    assert status == 0, err[-2000:]
    status, out, err = cli(tmp_path / "gti", "step=step4",
                           f"step.init_weights={gti_root}/checkpoint/step3/best.pth",
                           capsys=capsys)
    assert status == 0, err[-2000:]
    a, b = mine / "ck" / "step4" / "chip_model", tmp_path / "gti" / "ck" / "step4" / "chip_model"
    assert (a / "chip_model.json").read_text() == (b / "chip_model.json").read_text()
    wa, wb = np.load(a / "weights.npz"), np.load(b / "weights.npz")
    assert sorted(wa.files) == sorted(wb.files) and all(np.array_equal(wa[k], wb[k])
                                                        for k in wa.files)


def test_gti_inputs_that_cannot_be_used_are_one_line(chain, gti_root, tmp_path, capsys):
    bare = tmp_path / "gti" / "checkpoint" / "step2"
    bare.mkdir(parents=True)
    shutil.copy(gti_root / "checkpoint" / "step2" / "best.pth", bare)  # no relu_cap.txt near
    before = snapshot(tmp_path)
    status, _, err = cli(tmp_path, "step=step3", f"step.init_weights={bare / 'best.pth'}",
                         capsys=capsys)
    one_error_line(status, err, f"checkpoint error: GTI MDK checkpoint {bare / 'best.pth'} (GTI "
                   "step 2, quantized weights (its folder step2/)) needs its activation caps",
                   "name it with step.init_caps=PATH")
    status, _, err = cli(tmp_path, "step=step3", f"step.init_weights={bare / 'best.pth'}",
                         "step.init_gti_step=7", capsys=capsys)
    one_error_line(status, err, "step.init_gti_step=7 (step3): the GTI MDK's steps are 1")
    status, _, err = cli(tmp_path, "step=step3", f"step.init_weights={tmp_path / 'nope.pth'}",
                         capsys=capsys)
    one_error_line(status, err, f"step.init_weights={tmp_path / 'nope.pth'}: "
                   f"{tmp_path / 'nope.pth'} does not exist")
    assert_intact(before)
    assert not (tmp_path / "ck" / "step3").exists()


# step1's epochs: the scratch recipe's at 224 px (None); 40 at 448 px, where from a trained start
# they score as the scratch recipe's 60 did (docs/experiments.md, 2026-11-29)
@pytest.mark.parametrize("recipe, size, epochs", [("bccd_224", 224, None), ("bccd", 448, 40)])
def test_the_transfer_recipe_starts_from_the_shapes_hard_recipes_step1(recipe, size, epochs):
    """The recipe's two commands connect: experiment=<recipe>_transfer's step1 starts from the
    best.pth that experiment=shapes_hard 'pipeline=[step1]' leaves in its default folder, and
    keeps its checkpoints apart from the scratch recipe's."""
    transfer = compose([f"experiment={recipe}_transfer", "dataset.root=/data/BCCD"])
    source = compose(["experiment=shapes_hard", "pipeline=[step1]"])
    scratch = compose([f"experiment={recipe}", "dataset.root=/data/BCCD"])
    step1 = config_for_stage(transfer, "step1").step
    assert step1.init_weights == f"{source.paths.checkpoints}/step1/best.pth"
    assert transfer.model.image_size == size
    assert transfer.trainer.epochs == (scratch.trainer.epochs if epochs is None else epochs)
    assert transfer.trainer.eval_every == scratch.trainer.eval_every  # the rest unchanged
    assert transfer.paths.checkpoints != scratch.paths.checkpoints
    # the chain continues as before
    assert config_for_stage(transfer, "step2").step.init_weights is None
