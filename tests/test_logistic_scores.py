"""Logistic confidence and class scores (``loss.conf_scores`` / ``loss.class_scores``): binary
cross-entropy on ``gain * (x - 0.5)``, read back as its sigmoid, the output bias at the priors,
the head following the loss; the linear reading (the GTI MDK's) unchanged."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import compose
from mdk.errors import ConfigError
from mdk.models.config import check_loss
from mdk.models.gnetdet import GNetDet
from mdk.models.heads import YoloV1Head
from mdk.models.loss import YoloLoss
from mdk.models.yolo_codec import decode, encode_target, read_scores

S, C, GAIN = 4, 3, 10.0
BOXES = torch.tensor([[10.0, 12.0, 40.0, 50.0], [70.0, 80.0, 120.0, 120.0]])
LABELS = torch.tensor([0, 2])


def _target() -> torch.Tensor:
    return encode_target(BOXES, LABELS, S, 1, C, 128).unsqueeze(0)


def test_the_logistic_reading_spans_the_confident_range_inside_0_1():
    x = torch.tensor([0.0, 0.5, 1.0, -3.0, 4.0])
    got = read_scores(x, "logistic", GAIN)
    assert got[1] == 0.5 and got[0] == pytest.approx(1 / (1 + math.exp(5)))  # 0.0067
    assert got[2] == pytest.approx(1 - got[0]) and ((got >= 0) & (got <= 1)).all()
    assert torch.equal(read_scores(x, "linear", GAIN), x.clamp(0, 1))


def test_class_and_confidence_terms_are_binary_cross_entropy_on_the_scaled_channels():
    torch.manual_seed(0)
    t = _target()
    pred = torch.rand(1, 5 + C, S, S)
    terms = YoloLoss(C, 1, conf_scores="logistic", class_scores="logistic", score_gain=GAIN,
                     lambda_noobj=0.5)(pred, t)
    obj = t[0, ..., 4] > 0
    p = pred[0].permute(1, 2, 0)
    bce = lambda x, y: F.binary_cross_entropy_with_logits(GAIN * (x - 0.5), y, reduction="sum")  # noqa: E731
    assert terms["cls"].item() == pytest.approx(bce(p[obj][:, 5:], t[0][obj][:, 5:]).item(), rel=1e-6)
    assert terms["conf_obj"].item() == pytest.approx(bce(p[obj][:, 4], torch.ones(2)).item(), rel=1e-6)
    assert terms["conf_noobj"].item() == pytest.approx(
        0.5 * bce(p[~obj][:, 4], torch.zeros(int((~obj).sum()))).item(), rel=1e-6)


def test_label_smoothing_moves_the_class_targets_in():
    torch.manual_seed(1)
    t, pred = _target(), torch.rand(1, 5 + C, S, S)
    f = lambda eps: YoloLoss(C, 1, class_scores="logistic", label_smoothing=eps)(pred, t)  # noqa: E731
    obj = t[0, ..., 4] > 0
    p = pred[0].permute(1, 2, 0)[obj][:, 5:]
    want = F.binary_cross_entropy_with_logits(GAIN * (p - 0.5), t[0][obj][:, 5:] * 0.9 + 0.05,
                                              reduction="sum")
    assert f(0.1)["cls"].item() == pytest.approx(want.item(), rel=1e-6)
    assert f(0.1)["coord"].item() == f(0.0)["coord"].item()


def test_a_perfect_logistic_prediction_decodes_to_its_boxes_with_high_scores():
    t = _target()
    logit = t.clone()
    logit[..., 4] = t[..., 4] * 1.0          # confidence channel 1 (p 0.993) or 0 (p 0.007)
    logit[..., 5:] = t[..., 5:] * 1.0
    out = logit.permute(0, 3, 1, 2)
    h = YoloV1Head(C, 1, conf_scores="logistic", class_scores="logistic", score_gain=GAIN)
    det = h.decode(out, 128, conf_thresh=0.5)[0]
    assert sorted(det["labels"].tolist()) == [0, 2]
    assert (det["scores"] > 0.98).all()
    # the same channels read linearly are the same detections at score 1
    lin = decode(out, 128, conf_thresh=0.5, boxes_per_cell=1)[0]
    assert torch.allclose(lin["boxes"].sort(0).values, det["boxes"].sort(0).values)


def test_the_output_bias_starts_at_the_priors_and_linear_heads_keep_zero():
    h = YoloV1Head(5, 1, conf_scores="logistic", class_scores="logistic", score_gain=GAIN)
    torch.manual_seed(0)
    m = GNetDet(5, [8, "M", 8], [3, 3, 8], image_size=64, boxes_per_cell=1, head=h)
    b = m.layers[-1].conv.bias.detach()
    assert b[0] == b[1] == 0.5                                # box centre mid-cell
    assert read_scores(b[4], "logistic", GAIN).item() == pytest.approx(YoloV1Head.CONF_PRIOR)
    assert read_scores(b[5:], "logistic", GAIN) == pytest.approx(torch.full((5,), 0.2))
    torch.manual_seed(0)
    lin = GNetDet(5, [8, "M", 8], [3, 3, 8], image_size=64, boxes_per_cell=1)
    assert torch.equal(lin.layers[-1].conv.bias.detach(), torch.zeros(10))


def test_the_head_follows_the_loss_and_a_mismatch_is_one_line():
    cfg = compose(["debug=tiny", "loss.conf_scores=logistic", "loss.class_scores=logistic"])
    assert cfg.model.net.head.conf_scores == "logistic" and cfg.head.class_scores == "logistic"
    check_loss(cfg)
    gti = compose(["debug=tiny", "loss=gti"])
    assert gti.head.class_scores == "linear"
    bad = compose(["debug=tiny", "loss=gti", "head.class_scores=logistic"])
    with pytest.raises(ConfigError, match=r"head.class_scores='logistic' but the loss trains "
                                          r"'linear' scores; leave head.class_scores at its default"):
        check_loss(bad)
    with pytest.raises(ConfigError, match=r"^loss.class_scores='softmax' must be one of linear, "
                                          "logistic"):
        check_loss(compose(["debug=tiny", "loss.class_scores=softmax"]))


def test_the_head_config_of_a_linear_head_is_as_before():
    assert YoloV1Head(5, 1).config() == {"_target_": "mdk.models.heads.YoloV1Head",
                                         "num_classes": 5, "boxes_per_cell": 1}
    cfg = YoloV1Head(5, 1, class_scores="logistic").config()
    assert cfg["class_scores"] == "logistic" and cfg["conf_scores"] == "linear"
    assert YoloV1Head(**{k: v for k, v in cfg.items() if k != "_target_"}).readings == \
        {"conf_scores": "linear", "class_scores": "logistic", "score_gain": 10.0}


def test_the_anchor_head_reads_and_trains_logistic_scores_too():
    from mdk.models.anchor_loss import AnchorLoss
    from mdk.models.heads import AnchorHead

    h = AnchorHead(C, [[0.2, 0.2]], conf_scores="logistic", class_scores="logistic")
    bias = h.output_bias().view(1, 5 + C)
    assert torch.equal(bias[0, :4], torch.full((4,), 0.5))        # each prior's own box
    assert read_scores(bias[0, 4], "logistic", GAIN).item() == pytest.approx(YoloV1Head.CONF_PRIOR)
    t = h.encode(BOXES, LABELS, S, 128)
    out = t.permute(2, 0, 1)[None].clone()
    det = h.decode(out, 128, conf_thresh=0.5)[0]
    assert sorted(det["labels"].tolist()) == [0, 2] and (det["scores"] > 0.98).all()
    loss = AnchorLoss(h, conf_scores="logistic", class_scores="logistic")
    pos = t.view(S, S, 1, 5 + C)[..., 4] > 0
    terms = loss(out, t[None])
    p = out[0].permute(1, 2, 0).reshape(S, S, 1, 5 + C)
    want = F.binary_cross_entropy_with_logits(GAIN * (p[pos][:, 5:] - 0.5),
                                              t.view(S, S, 1, 5 + C)[pos][:, 5:], reduction="sum")
    assert terms["cls"].item() == pytest.approx(want.item(), rel=1e-6)
    cfg = compose(["debug=tiny", "head=anchors", "loss.class_scores=logistic"])
    assert cfg.head.class_scores == "logistic" and cfg.head.conf_scores == "linear"
    check_loss(cfg)
