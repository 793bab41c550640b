"""mdk.tools.evaluate / mdk.tools.demo on a tiny trained chain (step1 -> step4 + export).

The chain is tests/chain_fixture.py's, trained once per suite run: its step1 fits the 48 training
images, so mAP on the train split is non-zero and the exactness checks compare real detections,
not two empty lists.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from chain_fixture import STAGES
from mdk.checkpoint.files import load_checkpoint
from mdk.models.yolo_codec import decode
from mdk.quant.integer_ref import float32_is_exact
from mdk.tools import demo, evaluate

pytestmark = pytest.mark.slow  # the chain takes ~20-30 s on 2 cores, where this module trains it


@pytest.fixture(scope="module")
def chain(fitted_chain):
    return fitted_chain


def _eval(chain, rel: str, **kw):
    return evaluate.evaluate_path(chain["ckpt"] / rel, chain["overrides"], **kw)


def test_checkpoint_eval_reproduces_each_stages_own_numbers(chain):
    # The engine evaluated each stage's best model on val when it saved best.pth; the tool, loading
    # that file on its own (model, mode, caps, fusion), must give the same numbers exactly.
    for s in STAGES:
        ck = load_checkpoint(chain["ckpt"] / s / "best.pth")
        res = _eval(chain, f"{s}/best.pth")
        assert res["images"] == 16 and res["split"] == "val"
        assert (res["map50"], res["loss"]) == (ck["metric"]["map50"], ck["metric"]["loss"]), s
    assert "evaluated as step3" in _eval(chain, "cal/best.pth")["description"]


def test_integer_reference_eval_equals_fake_quant_eval_exactly(chain):
    fq = _eval(chain, "step4/best.pth", split="train")
    ref = _eval(chain, "step4/chip_model", runtime="integer", split="train")
    assert fq["images"] == ref["images"] == 48
    assert (ref["map50"], ref["loss"]) == (fq["map50"], fq["loss"])
    # and the raw network outputs are bit-identical, not merely close
    a = evaluate.load_any(chain["ckpt"] / "step4/best.pth", chain["overrides"])
    b = evaluate.load_any(chain["ckpt"] / "step4/chip_model", chain["overrides"])
    assert float32_is_exact(b.model.cm)
    ds = evaluate.build_split(a.cfg, a.model, "train")
    images = torch.stack([ds.image(i) for i in range(len(ds))])
    with torch.no_grad():
        out = a.model(images)
        assert torch.equal(out, b.model(images))
    # Real detections were compared, not two empty sets. (Not "mAP > 0": how well this tiny
    # quantized chain fits differs between torch versions; on torch 2.11 its step4 mAP was 0.)
    dets = decode(out, float(a.cfg.model.image_size), 0.01, 0.5,
                  boxes_per_cell=int(a.cfg.model.net.boxes_per_cell))
    assert sum(len(d["scores"]) for d in dets) > 0


def test_onnxruntime_eval_matches_to_tolerance(chain):
    ref = _eval(chain, "step4/chip_model", runtime="integer", split="train")
    ort = _eval(chain, "step4/chip_model", runtime="onnx", split="train")
    assert abs(ort["map50"] - ref["map50"]) <= 1e-3 and ort["loss"] == pytest.approx(ref["loss"], rel=1e-4)
    a = evaluate.load_any(chain["ckpt"] / "step4/chip_model", chain["overrides"], "integer")
    b = evaluate.load_any(chain["ckpt"] / "step4/chip_model", chain["overrides"], "onnx")
    ds = evaluate.build_split(a.cfg, a.model, "train")
    images = torch.stack([ds.image(i) for i in range(len(ds))])
    out_a, out_b = a.model(images), b.model(images)
    scale = a.model.cm.out_scale
    # Outputs are 5-bit levels * scale; float rounding may at most flip a rare .5 tie by one level.
    assert torch.allclose(out_a, out_b, atol=scale + 1e-6)
    assert (out_a != out_b).float().mean() < 1e-3


def test_evaluate_cli_prints_map_and_loss(chain, capsys):
    rc = evaluate.main([str(chain["ckpt"] / "step3/best.pth"), *chain["overrides"]])
    out = capsys.readouterr().out
    res = _eval(chain, "step3/best.pth")
    assert rc == 0
    assert f"mAP@0.5 {res['map50']:.4f}  loss {res['loss']:.4f}" in out
    assert "stage step3" in out and "16 images" in out
    rc = evaluate.main([str(chain["ckpt"] / "step4/chip_model"), "--runtime", "onnx",
                        "--split", "train", *chain["overrides"]])
    assert rc == 0 and "onnx runtime" in capsys.readouterr().out


def test_evaluate_reports_on_demand_equal_what_each_stage_drew_at_its_end(chain, tmp_path, capsys):
    # Each stage drew its best evaluation's pictures into the run dir when it ended; the tool,
    # evaluating that best.pth again, draws the same pixels (the evaluation is exact).
    for s in ("step1", "cal", "step3"):
        out = tmp_path / s
        assert evaluate.main([str(chain["ckpt"] / s / "best.pth"), *chain["overrides"],
                              "--reports", str(out)]) == 0
        printed = capsys.readouterr().out
        for name in (f"detections_{s}.png", f"pr_{s}_1.png"):
            assert f"wrote {out / name}" in printed
            assert (out / name).read_bytes() == (chain["run"] / name).read_bytes(), (s, name)


def test_demo_draws_labelled_detections_to_png(chain, tmp_path, shared_data):
    ds_img = sorted(Path(shared_data).rglob("*.jpg"))[0]
    out = tmp_path / "out.png"
    det, _ = demo.run_demo(chain["ckpt"] / "step4/chip_model", ds_img, out, chain["overrides"],
                        score_thresh=0.0)
    assert len(det["boxes"]) > 0
    drawn = np.asarray(Image.open(out))
    src = np.asarray(Image.open(ds_img).convert("RGB"))
    factor = demo.MIN_DRAW_SIZE // src.shape[0]  # 64 px input -> enlarged 6x
    assert drawn.shape == (src.shape[0] * factor, src.shape[1] * factor, 3)
    plain = src.repeat(factor, 0).repeat(factor, 1)
    # pixels changed only by drawing: all inside the (enlarged) detection boxes
    changed = np.argwhere((drawn != plain).any(-1))
    assert len(changed) > 0
    boxes = det["boxes"] * factor
    assert changed[:, 1].min() >= int(boxes[:, 0].min()) - 2
    assert changed[:, 0].max() <= int(boxes[:, 3].max()) + 2
    # the same detections from a checkpoint (fake-quant step4 == chip model)
    det2, _ = demo.run_demo(chain["ckpt"] / "step4/best.pth", ds_img, tmp_path / "b.png",
                            chain["overrides"], score_thresh=0.0)
    assert torch.equal(det["scores"], det2["scores"]) and torch.equal(det["labels"], det2["labels"])


def test_demo_cli_errors_name_the_file(chain, tmp_path, capsys):
    assert demo.main([str(chain["ckpt"] / "step1/best.pth"), "--image", str(tmp_path / "no.jpg"),
                      "--out", str(tmp_path / "o.png"), *chain["overrides"]]) == 1
    assert f"--image {tmp_path / 'no.jpg'} does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image")
    assert demo.main([str(chain["ckpt"] / "step1/best.pth"), "--image", str(bad),
                      "--out", str(tmp_path / "o.png")]) == 1
    assert "cannot be decoded" in capsys.readouterr().err


def test_evaluate_errors_for_missing_corrupt_and_foreign_inputs(chain, tmp_path, capsys):
    missing = tmp_path / "nope.pth"
    assert evaluate.main([str(missing)]) == 1
    assert f"{missing} does not exist" in capsys.readouterr().err
    corrupt = tmp_path / "best.pth"
    corrupt.write_bytes((chain["ckpt"] / "step1/best.pth").read_bytes()[:2000])
    assert evaluate.main([str(corrupt)]) == 1
    err = capsys.readouterr().err
    assert str(corrupt) in err and "truncated or damaged" in err
    empty_dir = tmp_path / "chip"
    empty_dir.mkdir()
    assert evaluate.main([str(empty_dir)]) == 1
    assert "chip_model.json is missing" in capsys.readouterr().err
    assert evaluate.main([str(chain["ckpt"] / "step1/best.pth"), "trainer.nosuchkey=1"]) == 1
    assert "trainer.nosuchkey" in capsys.readouterr().err
    # a checkpoint trained on 5 classes evaluated on a dataset with another class list: with the
    # model from the checkpoint's saved config, and with the model rebuilt from overrides
    ck = chain["ckpt"] / "step1/best.pth"
    other = ["dataset.class_names=[a,b]", "dataset.num_classes=2"]
    assert evaluate.main([str(ck), *other]) == 1
    assert "predicts 5 classes but dataset=shapes has 2" in capsys.readouterr().err
    rebuilt = [*chain["overrides"], "model.image_size=64"]  # a model key: built from overrides
    assert evaluate.main([str(ck), *rebuilt, *other]) == 1
    err = capsys.readouterr().err
    assert str(ck) in err and "does not fit this model" in err and "class count" in err
