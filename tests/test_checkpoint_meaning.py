"""What a checkpoint means and was trained with, against a later run's config
(mdk/checkpoint/meaning.py): which keys count for which start, and when a done stage refuses."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import TINY, compose
from mdk.checkpoint.meaning import (_ABSENT, check_input, check_resume, hparams_of, meaning_of,
                                    nothing_left, resume_changes, unfit_parts)
from mdk.errors import CheckpointError
from mdk.stage import config_for_stage
from mdk.stage_config import StageConf

PATH = Path("/ck/stage/last.pth")


def _cfg(stage: str, *extra: str):
    return config_for_stage(compose([*TINY, f"step={stage}", *extra]), stage)


def _ck(cfg, **state) -> dict:
    spec = StageConf.from_node(cfg.step)
    return {"meaning": meaning_of(cfg, spec), "hparams": hparams_of(cfg), **state}


def _spec(cfg) -> StageConf:
    return StageConf.from_node(cfg.step)


def test_the_chip_is_part_of_the_meaning_of_quantized_stages_only():
    float_ck, quant_ck = _ck(_cfg("step1")), _ck(_cfg("step2"))
    assert "chip" not in float_ck["meaning"] and quant_ck["meaning"]["chip"] == "5801"
    other_chip = _cfg("step2", "chip=2801")
    check_input(float_ck, PATH, other_chip, _spec(other_chip))  # float weights: any chip
    cal = _cfg("cal", "chip=2801")
    with pytest.raises(CheckpointError, match=r"^chip='2801' differs from the checkpoint's '5801' "
                       r"\(/ck/stage/last.pth, the input of cal\): its weights are quantized for "
                       r"the other chip; run step=step2 again with this value"):
        check_input(quant_ck, PATH, cal, _spec(cal))


def test_mask_widths_are_meaning_of_quantized_weights_only():
    """A bit plan (python -m mdk.tools.plan_bits) is made on step1's float weights: step2 may
    start from them with other widths, but not from quantized weights of other widths."""
    float_ck, quant_ck = _ck(_cfg("step1")), _ck(_cfg("step2"))
    assert "model.net.mask_bits" not in float_ck["meaning"]
    assert quant_ck["meaning"]["model.net.mask_bits"] == [3, 3, 3, 3, 3, 3, 8]
    planned = _cfg("step2", "model.net.mask_bits=[8,3,1,3,3,3,8]")
    check_input(float_ck, PATH, planned, _spec(planned))
    older = {**float_ck, "meaning": {**float_ck["meaning"],
                                     "model.net.mask_bits": [3, 3, 3, 3, 3, 3, 8]}}
    check_input(older, PATH, planned, _spec(planned))  # a float file that still recorded them
    cal = _cfg("cal", "model.net.mask_bits=[8,3,1,3,3,3,8]")
    with pytest.raises(CheckpointError, match=r"^model.net.mask_bits=\[8, 3, 1, 3, 3, 3, 8\] "
                       r"differs from the checkpoint's \[3, 3, 3, 3, 3, 3, 8\]"):
        check_input(quant_ck, PATH, cal, _spec(cal))


def test_an_input_is_not_compared_on_its_own_stage_record_but_a_resume_is():
    step2 = _cfg("step2")
    check_input(_ck(_cfg("step1")), PATH, step2, _spec(step2))  # step1's name and mode: fine
    changed = _cfg("step2", "step.quant.weights=false")
    with pytest.raises(CheckpointError, match=r"^step.quant.weights=False differs from the "
                       r"checkpoint's True .*: it was trained with its chip layers in the other "
                       "mode; use the checkpoint's value"):
        check_resume(_ck(step2), PATH, changed, _spec(changed))


def test_the_class_order_and_the_input_size_are_meaning_the_lr_is_not():
    step1 = _cfg("step1")
    ck = _ck(step1, trainer={"epoch": 0, "iter": 3}, epoch_done=False)
    for extra, key in (("dataset.class_names=[cross,square,triangle,star,circle]",
                        "dataset.class_names"), ("model.image_size=96", "model.image_size")):
        other = _cfg("step1", extra)
        with pytest.raises(CheckpointError, match=rf"^{key}=.* differs from the checkpoint's"):
            check_resume(ck, PATH, other, _spec(other))
    lr = _cfg("step1", "optim.lr=0.5")
    assert check_resume(ck, PATH, lr, _spec(lr)) == [("optim.lr", step1.optim.lr, 0.5)]
    assert check_resume(ck, PATH, step1, _spec(step1)) == []
    assert check_resume({"model": {}}, PATH, lr, _spec(lr)) is None  # an older file: not compared


@pytest.mark.parametrize("saved, epochs, left", [
    ({"epoch": 1, "iter": 12}, 2, False),   # the last epoch saved at its end: done
    ({"epoch": 1, "iter": 12}, 3, True),    # longer now: one more epoch to train
    ({"epoch": 1, "iter": 9}, 2, True),     # saved inside the last epoch: its rest to train
    ({"epoch": 2, "iter": 15}, 2, False),   # shorter now: already past the end
])
def test_when_a_training_stage_has_nothing_left(saved, epochs, left):
    cfg = _cfg("step1", f"trainer.epochs={epochs}")
    ck = {"trainer": saved, "epoch_done": saved["iter"] % 6 == 0}
    assert nothing_left(ck, cfg, _spec(cfg)) is not left


def test_a_done_stage_refuses_a_changed_hyper_parameter_naming_the_others():
    step1 = _cfg("step1")
    done = _ck(step1, trainer={"epoch": 1, "iter": 12}, epoch_done=True)
    other = _cfg("step1", "optim.lr=0.5", "seed=3")
    with pytest.raises(CheckpointError, match=r"^step1 is already done in /ck/stage and this run "
                       r"changes what it was made with: optim.lr=0.5 differs from the "
                       r"checkpoint's 0.002 \(and 1 more: seed\); nothing is left to do"):
        check_resume(done, PATH, other, _spec(other))
    longer = _cfg("step1", "optim.lr=0.5", "trainer.epochs=3")  # more to train: applies
    assert [k for k, _, _ in check_resume(done, PATH, longer, _spec(longer))] == [
        "optim.lr", "scheduler.T_max", "trainer.epochs"]


def test_a_done_one_pass_stage_refuses_changed_parameters_of_its_work():
    cal = _cfg("cal")
    done = {**_ck(cal), "finished": True}
    other = _cfg("cal", "step.calibration.percentile=99.9")
    assert resume_changes(done, other) == [("step.calibration.percentile", 99.0, 99.9)]
    with pytest.raises(CheckpointError, match=r"^cal is already done in /ck/stage .*"
                       r"step.calibration.percentile=99.9 differs from the checkpoint's 99.0"):
        check_resume(done, PATH, other, _spec(other))


def _before_nodes(ck: dict, **old) -> dict:
    """``ck`` as written before calibration methods were nodes: the fixed keys, a method word."""
    hp = {k: v for k, v in ck["hparams"].items() if not k.startswith("step.calibration.")}
    words = {"method": "percentile", "percentile": 99.0, "mse_candidates": 64,
             "max_values": 1048576, **old}
    return {**ck, "hparams": {**hp, **{f"step.calibration.{k}": v for k, v in words.items()}}}


def test_a_checkpoint_from_before_the_method_nodes_reads_as_the_node_of_its_method():
    cal = _cfg("cal")
    assert hparams_of(cal)["step.calibration._target_"] == "mdk.quant.calibrate.PercentileCap"
    old = {**_before_nodes(_ck(cal), method="kl"), "finished": True}
    kl = _cfg("cal", "step/calibration=kl")
    assert resume_changes(old, kl) == []  # its percentile and mse_candidates were never kl's
    check_resume(old, PATH, kl, _spec(kl))  # done, and nothing changed: no refusal
    assert resume_changes(_before_nodes(_ck(cal)), cal) == []
    assert resume_changes(_before_nodes(_ck(cal), method="mse", mse_candidates=32),
                          _cfg("cal", "step/calibration=mse", "step.calibration.mse_candidates=32")
                          ) == []
    # what differs is named in today's keys
    assert resume_changes(old, cal) == [
        ("step.calibration._target_", "mdk.quant.calibrate.KlCap",
         "mdk.quant.calibrate.PercentileCap"), ("step.calibration.percentile", _ABSENT, 99.0)]
    assert resume_changes(_before_nodes(_ck(cal), max_values=None), cal) == [
        ("step.calibration.max_values", None, 1048576)]
    with pytest.raises(CheckpointError, match=r"step.calibration._target_="
                       r"'mdk.quant.calibrate.PercentileCap' differs from the checkpoint's "
                       r"'mdk.quant.calibrate.KlCap' \(and 1 more: step.calibration.percentile\)"):
        check_resume(old, PATH, cal, _spec(cal))


def test_the_old_method_words_still_choose_the_method():
    """``step.calibration.method=kl`` (with Hydra's ``+``: the key is gone from the node), and a
    recipe's ``stages.cal.calibration.method: kl``, read as the method's node."""
    kl = _cfg("cal", "step/calibration=kl").step.calibration
    assert _cfg("cal", "+step.calibration.method=kl").step.calibration == kl
    piped = compose([*TINY, "pipeline=[step1,step2,cal]", "+stages.cal.calibration.method=kl",
                     "+stages.cal.calibration.max_values=null"])
    assert config_for_stage(piped, "cal").step.calibration == {**kl, "max_values": None}


def test_an_optimizer_or_loss_of_another_class_starts_fresh():
    """Their saved state would not load into another class (SGD's momentum into AdamW: a
    KeyError; the YOLO loss's empty state into the GTI loss's running mean)."""
    ck = _ck(_cfg("step1"))  # AdamW, the YOLO loss
    assert unfit_parts(ck, _cfg("step1", "optim.lr=0.5")) == []
    assert unfit_parts(ck, _cfg("step1", "optim=sgd")) == ["optimizer"]
    assert unfit_parts(ck, _cfg("step1", "optim=sgd", "loss=gti")) == ["optimizer", "loss"]
    assert unfit_parts({"model": {}}, _cfg("step1", "optim=sgd")) == []  # an older file: as before
