"""GTI MDK checkpoints in and out (docs/gti-compat.md, "Checkpoints"): files made from its key names
(tests/helpers/gti_layout.py) in both of its structures, with BN and without, saved from DDP, with
``best_loss``; the same image gives the same grid and the same boxes; ``relu_cap.txt``; gain-fused
files; ``python -m mdk.tools.to_gti`` and the round trips. At 64 px: the structures are the GTI
MDK's, the input small (the convs do not care)."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from conftest import compose
from helpers.gti_layout import GTI_224, GTI_448, gti_features, gti_forward, save_gti, write_caps
from mdk.checkpoint import gti_mdk
from mdk.checkpoint.files import atomic_save
from mdk.checkpoint.layout import StageCheckpointer
from mdk.checkpoint.sources import Want
from mdk.checkpoint.transfer import load_all
from mdk.checkpoint.weights_file import load_start, read_weights
from mdk.errors import CheckpointError
from mdk.models.build import build_model
from mdk.models.heads import YoloV1Head
from mdk.quant.activation import quantize_input
from mdk.quant.modes import apply_mode
from mdk.stage import apply_stage, config_for_stage
from mdk.stage_config import StageConf
from mdk.tools import to_gti

C = 3
SIZE = 64


def _cfg(preset: str, bn: bool = False, size: int = SIZE):
    return compose([f"model={preset}", f"model.image_size={size}",
                    f"model.net.batch_norm={str(bn).lower()}", "dataset.class_names=[a,b,c]",
                    f"dataset.num_classes={C}", "trainer.device=cpu"])


def _start(cfg, stage: str, path, **init):
    """``stage``'s model with ``path`` loaded the way the stage loads its starting file."""
    st = config_for_stage(cfg, stage)
    spec = StageConf.from_node(st.step)
    spec = dataclasses.replace(spec, **init)
    model = build_model(cfg)
    said = load_start(model, read_weights(path, "advice"), cfg, spec)
    return model, spec, said


def _u8(n: int = 2, size: int = SIZE, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed))


def _grids64(model: torch.nn.Module, feats: torch.nn.Sequential, u8: torch.Tensor):
    """The mdk model's grid after the output ReLU (``[B, S, S, D]``) and the GTI model's, both in
    float64: a BN folded into its conv and one applied after it then differ only by the float32
    rounding of the folded weights (up to 3e-5 here), not also by this CPU's float32 kernels (in
    float32 an AMD AVX2 machine's reached 3.5e-4 where an Intel one's stayed under 1e-4)."""
    mine = copy.deepcopy(model).double().eval()
    with torch.no_grad():
        x = quantize_input(u8).double()  # the model's own input rounding, as its forward does
        for layer in mine.layers:
            x = layer(x)
        x = torch.relu(x * mine.out_scale).permute(0, 2, 3, 1)
        # and that pass is the model's forward (in float32, to its rounding)
        torch.testing.assert_close(torch.relu(model.eval()(u8)).permute(0, 2, 3, 1), x.float(),
                                   rtol=1e-3, atol=1e-3)
    return x, gti_forward(copy.deepcopy(feats).double().eval(), u8)


@pytest.mark.parametrize("structure, preset, bn, ddp", [
    (GTI_448, "gnetdet", False, False), (GTI_448, "gnetdet", True, True),
    (GTI_224, "gnetdet_224", False, True), (GTI_224, "gnetdet_224", True, False)],
    ids=["448", "448-bn-ddp", "224-ddp", "224-bn"])
def test_a_gti_float_file_gives_the_gti_grid_and_boxes(tmp_path, structure, preset, bn, ddp):
    """A GTI step-1 file as step1's starting point (step0/): every tensor comes over (the output
    BN folded), and the same RGB image gives the GTI MDK's grid after its output ReLU, to float
    rounding, and the same boxes under the GTI layout (2 boxes per cell, then the classes)."""
    feats = gti_features(structure, 10 + C, bn, seed=1)
    path = save_gti(feats, tmp_path / "gti", 1, ddp=ddp, best_loss=0.75)
    model, _, said = _start(_cfg(preset), "step1", path)
    assert said.startswith("32 of 32 tensors copied")  # a preset without BN: the file's folded
    assert "GTI step 1, float (its folder step1/)" in said
    size = 448 if preset == "gnetdet" else 224
    assert f"read as the GTI MDK's {size} structure (model={preset})" in said
    assert "swapped from BGR" in said and ("saved from DDP" in said) == ddp
    if bn:
        assert "BatchNorm layers folded into their convs" in said
    mine, theirs = _grids64(model, feats, _u8())
    grid = SIZE // (32 if preset == "gnetdet" else 16)  # five pools, or the 224 structure's four
    assert mine.shape == theirs.shape == (2, grid, grid, 10 + C)
    torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    head = YoloV1Head(C, 2)
    a = head.decode(mine.permute(0, 3, 1, 2), SIZE, 0.05, 0.5)
    b = head.decode(theirs.permute(0, 3, 1, 2), SIZE, 0.05, 0.5)
    for x, y in zip(a, b):
        torch.testing.assert_close(x["boxes"], y["boxes"], atol=1e-2, rtol=1e-3)  # pixels
        assert torch.equal(x["labels"], y["labels"])


def test_bn_model_keeps_the_gti_bn_and_folds_only_the_output_bn(tmp_path):
    feats = gti_features(GTI_448, 10 + C, True, seed=2)
    path = save_gti(feats, tmp_path / "gti", 1)
    model, _, said = _start(_cfg("gnetdet", bn=True), "step1", path)
    assert said.startswith("92 of 92 tensors copied")
    assert "its output conv's BatchNorm folded into that conv" in said
    sd = model.state_dict()
    assert torch.equal(sd["layers.3.bn.running_var"], feats.BatchNorm3.running_var)
    assert torch.equal(sd["layers.5.conv.weight"], feats.conv5.weight)
    assert torch.equal(sd["layers.0.conv.weight"], feats.conv0.weight.flip(1))  # BGR -> RGB
    torch.testing.assert_close(*_grids64(model, feats, _u8()), rtol=1e-4, atol=1e-4)


def test_rgb_trained_gti_files_keep_their_channels(tmp_path):
    feats = gti_features(GTI_224, 10 + C, False, seed=3)
    path = save_gti(feats, tmp_path / "gti", 1)
    model, _, said = _start(_cfg("gnetdet_224"), "step1", path, init_channels="RGB")
    assert "swapped" not in said
    assert torch.equal(model.state_dict()["layers.0.conv.weight"], feats.conv0.weight)


def _calibrated(tmp_path, seed: int = 4):
    """A GTI step-2 file (no BN) and a relu_cap.txt of 16 caps in the GTI MDK's layout."""
    feats = gti_features(GTI_448, 10 + C, False, seed=seed)
    root = tmp_path / "gti"
    p2 = save_gti(feats, root, 2)
    caps = [1.5 + 0.37 * i + 1e-9 * (i % 3) for i in range(16)]  # float64 values, as GTI's
    write_caps(root / "model" / "relu_cap.txt", caps)
    return feats, root, p2, caps


def test_step3_takes_a_gti_step2_file_with_its_caps(tmp_path):
    """The input of step3 (cal's result in mdk) from the GTI MDK: its step-2 weights and the caps
    of its relu_cap.txt, found under its root (model/relu_cap.txt); the 5-bit forward runs."""
    feats, root, p2, caps = _calibrated(tmp_path)
    model, spec, said = _start(_cfg("gnetdet"), "step3", p2)
    assert f"caps from {root / 'model' / 'relu_cap.txt'}" in said
    assert "GTI step 2, quantized weights (its folder step2/)" in said
    got = [float(l.cap) for l in model.layers]
    assert got == [float(torch.tensor(c)) for c in caps]  # float32 of each line
    apply_stage(model, spec, "5801")
    with torch.no_grad():
        out = model.eval()(_u8())
    levels = out / (got[-1] / 31)
    assert torch.equal(levels.clamp(min=0), levels) and (levels - levels.round()).abs().max() < 1e-3


def test_step4_from_a_gti_step3_file_equals_the_gti_step4_file_and_fusing_in_mdk(tmp_path):
    """GTI step 3 + caps as the input of step4 (mdk fuses the gains), and a GTI step-4 file
    (fused as the GTI MDK's checkpointer fuses: W *= c_prev / c, b *= 31 / c) read as gain-fused:
    the same integer forward, bit for bit."""
    feats, root, p2, caps = _calibrated(tmp_path, seed=5)
    p3 = save_gti(feats, root, 3)
    cfg = _cfg("gnetdet")
    a, spec4, said = _start(cfg, "step4", p3)
    assert "GTI step 3" in said
    apply_stage(a, spec4, "5801")
    fused = gti_features(GTI_448, 10 + C, False, seed=5)
    with torch.no_grad():
        prev = 31.0
        for i, c in enumerate(caps):
            conv = getattr(fused, f"conv{i}")
            conv.weight.mul_(prev / c)
            conv.bias.mul_(31.0 / c)
            prev = c
    p4 = save_gti(fused, root, 4)
    b = build_model(cfg)
    src = read_weights(p4, "advice").source(b, Want(as_written=True, preset="gnetdet"))
    assert "GTI step 4, gain-fused (its folder step4/)" in src.notes[0]
    load_all(b, src, "gnetdet")
    apply_mode(b, gti_mdk.STEPS[4], "5801")
    assert all(bool(l.fused) and float(l.cap) == 31 for l in b.layers)
    assert float(b.out_scale) == float(torch.tensor(caps[-1] / 31))
    with torch.no_grad():
        ya, yb = a.eval()(_u8()), b.eval()(_u8())
    assert torch.equal(ya, yb)


@pytest.mark.parametrize("bn", [False, True])
def test_to_gti_round_trips(tmp_path, bn, capsys):
    """mdk -> GTI -> mdk: the same tensors (float with BN: the identity output BN folds back to
    the same values; step4: fused weights, the output scale through relu_cap.txt's last line);
    GTI -> mdk -> GTI: the same grid (a folded output BN stays folded)."""
    cfg = _cfg("gnetdet_224", bn=bn, size=224)
    feats = gti_features(GTI_224, 10 + C, bn, seed=6)
    p1 = save_gti(feats, tmp_path / "gti", 1)
    model, spec, _ = _start(cfg, "step1", p1)
    sc = config_for_stage(cfg, "step1")
    ck = StageCheckpointer(sc, StageConf.from_node(sc.step)).contents(model)
    mine = tmp_path / "mdk" / "step1" / "best.pth"
    atomic_save(ck, mine)
    assert to_gti.main([str(mine), str(tmp_path / "back")]) == 0
    out = capsys.readouterr().out
    assert f"batch_norm = {bn}" in out and "image_size = 224" in out and "GTI step 1" in out
    back = tmp_path / "back" / "checkpoint" / "step1" / "best.pth"
    again, _, _ = _start(cfg, "step1", back)
    for k, v in model.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k
    # GTI -> mdk -> GTI: the GTI model of the written file gives the first one's grid
    feats2 = gti_features(GTI_224, 10 + C, bn, seed=99)
    feats2.load_state_dict({k[len("features."):]: v for k, v in torch.load(back).items()})
    u8 = _u8(1, 224)
    torch.testing.assert_close(gti_forward(feats2.eval(), u8), gti_forward(feats, u8),
                               rtol=1e-4, atol=1e-4)


def test_to_gti_writes_the_caps_and_the_fused_output_scale(tmp_path):
    """A gain-fused mdk model: every cap but the last 31, the last 31 x out_scale (exact), read
    back as the same fused model."""
    cfg = _cfg("gnetdet_224", size=224)
    _, root, _, _ = _calibrated(tmp_path)  # the caps (16: the 224 structure has 16 convs too)
    feats = gti_features(GTI_224, 10 + C, False, seed=7)
    model, spec4, _ = _start(cfg, "step4", save_gti(feats, root, 3))
    apply_stage(model, spec4, "5801")  # fuses
    sc = config_for_stage(cfg, "step4")
    mine = tmp_path / "mdk" / "step4" / "best.pth"
    atomic_save(StageCheckpointer(sc, StageConf.from_node(sc.step)).contents(model), mine)
    files, settings, _ = to_gti.to_gti(mine, tmp_path / "out")
    assert [f.relative_to(tmp_path / "out").as_posix() for f in files] == [
        "checkpoint/step4/best.pth", "model/relu_cap.txt"]
    lines = files[1].read_text().split()
    assert lines[:-1] == ["31.0"] * 15 and float(lines[-1]) == float(model.out_scale) * 31
    again = build_model(cfg)
    load_all(again, read_weights(files[0]).source(again, Want(as_written=True)), "x")
    for k, v in model.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k


def test_to_gti_refuses_what_the_gti_mdk_cannot_build(tmp_path, capsys):
    cfg = _cfg("gnetdet_small")
    model = build_model(cfg)
    sc = config_for_stage(cfg, "step1")
    mine = tmp_path / "step1" / "best.pth"
    atomic_save(StageCheckpointer(sc, StageConf.from_node(sc.step)).contents(model), mine)
    assert to_gti.main([str(mine), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot be written for the GTI MDK: its layer list [16, 'M'" in err[0]
    assert not (tmp_path / "out").exists()
    cfg = compose(["model=gnetdet_224", "model.net.boxes_per_cell=1"])  # one box per cell
    sc = config_for_stage(cfg, "step1")
    atomic_save(StageCheckpointer(sc, StageConf.from_node(sc.step)).contents(build_model(cfg)),
                mine)
    assert to_gti.main([str(mine), str(tmp_path / "out")]) == 1
    assert "YOLOv1 grid with 2 boxes per cell" in capsys.readouterr().err


def test_relu_cap_txt_defects_are_one_line(tmp_path):
    _, root, p2, caps = _calibrated(tmp_path)
    cap_file = root / "model" / "relu_cap.txt"
    cfg = _cfg("gnetdet")
    cap_file.write_text("".join(f"{c}\n" for c in caps[:12]))
    with pytest.raises(CheckpointError, match=r"relu_cap.txt holds 12 caps, this model has 16 conv"):
        _start(cfg, "step3", p2)
    cap_file.write_text("1.5\n2.5\nabc\n" + "3.0\n" * 13)
    with pytest.raises(CheckpointError, match=r"relu_cap.txt line 3: 'abc' is not a number"):
        _start(cfg, "step3", p2)
    cap_file.unlink()
    with pytest.raises(CheckpointError, match=r"needs its activation caps, and there is no "
                       r"relu_cap.txt beside it .* step.init_caps=PATH"):
        _start(cfg, "step3", p2)
    named = write_caps(tmp_path / "elsewhere" / "caps.txt", caps)
    model, _, said = _start(cfg, "step3", p2, init_caps=str(named))
    assert f"caps from {named}" in said


def test_a_gti_file_of_another_structure_is_refused(tmp_path):
    feats = gti_features(GTI_448, 10 + C, False, seed=8)
    path = save_gti(feats, tmp_path / "gti", 1)
    with pytest.raises(CheckpointError) as e:  # GNetDet-448 into the small preset
        _start(_cfg("gnetdet_small"), "step1", path)
    assert "does not fit model=gnetdet_small: layers.0.conv.weight is (64, 3, 3, 3) in the " \
           "file and (16, 3, 3, 3) in the model (another channel list)" in str(e.value)
    assert "model=gnetdet_224 its 224" in str(e.value)
    with pytest.raises(CheckpointError, match=r"has 16 conv layers, this model 7: another depth"):
        _start(compose(["debug=tiny", "dataset.class_names=[a,b,c]", "dataset.num_classes=3"]),
               "step1", path)
