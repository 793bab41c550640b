"""torchvision's VGG-16 weight file as step1's starting point (docs/pipeline.md, "Start from
weights"): the leading convs that fit, in order, the ImageNet normalisation folded into the first.
``torchvision.models.vgg16()`` with random weights stands in for the ImageNet file (nothing is
downloaded; the mapping does not depend on the values)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchvision

from conftest import compose
from mdk.checkpoint.weights_file import load_start, read_weights
from mdk.checkpoint.vgg import MEAN, STD
from mdk.errors import CheckpointError
from mdk.models.build import build_model
from mdk.quant.activation import quantize_input
from mdk.stage import config_for_stage
from mdk.stage_config import StageConf


def _vgg_file(tmp_path, bn: bool = False):
    torch.manual_seed(0)
    net = (torchvision.models.vgg16_bn if bn else torchvision.models.vgg16)()
    path = tmp_path / ("vgg16_bn-6c64b313.pth" if bn else "vgg16-397923af.pth")
    torch.save(net.state_dict(), path)
    return net, path


def _start(cfg, path):
    spec = StageConf.from_node(config_for_stage(cfg, "step1").step)
    model = build_model(cfg)
    said = load_start(model, read_weights(path, "advice"), cfg, spec)
    return model, said


@pytest.mark.parametrize("preset", ["gnetdet", "gnetdet_224"])
def test_vgg16s_first_seven_convs_start_gnetdet(tmp_path, preset):
    vgg, path = _vgg_file(tmp_path)
    cfg = compose([f"model={preset}", "model.image_size=64", "trainer.device=cpu"])
    model, said = _start(cfg, path)
    assert said.startswith("14 of 32 tensors copied")
    assert "layers 7-15 keep their initialisation" in said
    assert "torchvision VGG: its first 7 of 13 convs" in said
    convs = [m for m in vgg.features if isinstance(m, torch.nn.Conv2d)]
    sd = model.state_dict()
    for i in range(1, 7):
        assert torch.equal(sd[f"layers.{i}.conv.weight"], convs[i].weight)
        assert torch.equal(sd[f"layers.{i}.conv.bias"], convs[i].bias)
    # the first conv answers mdk's 5-bit input as VGG's answered its normalised image (inside
    # the border, where VGG padded with the mean colour and mdk pads with 0)
    u8 = torch.randint(0, 32, (1, 3, 24, 24), dtype=torch.uint8) * 8  # exactly 8 x the 5-bit level
    normalised = (u8.float() / 255 - torch.tensor(MEAN).view(1, 3, 1, 1)) / \
        torch.tensor(STD).view(1, 3, 1, 1)
    theirs = convs[0](normalised)
    mine = F.conv2d(quantize_input(u8), sd["layers.0.conv.weight"], sd["layers.0.conv.bias"],
                    padding=1)
    torch.testing.assert_close(mine[..., 1:-1, 1:-1], theirs[..., 1:-1, 1:-1], rtol=1e-4,
                               atol=1e-4)


def test_vgg16_bn_brings_its_batchnorm_into_a_bn_model(tmp_path):
    vgg, path = _vgg_file(tmp_path, bn=True)
    cfg = compose(["model=gnetdet", "model.image_size=64", "model.net.batch_norm=true"])
    model, said = _start(cfg, path)
    assert said.startswith("42 of 92 tensors copied")  # 7 x (conv 2 + BN 4)
    bns = [m for m in vgg.features if isinstance(m, torch.nn.BatchNorm2d)]
    assert torch.equal(model.state_dict()["layers.6.bn.running_var"], bns[6].running_var)


def test_a_vgg_file_no_layer_of_which_fits_is_refused(tmp_path):
    _, path = _vgg_file(tmp_path)
    with pytest.raises(CheckpointError) as e:
        _start(compose(["model=gnetdet_small"]), path)
    assert f"{path} is a torchvision VGG (13 convs) and none of its layers fits " \
           "model=gnetdet_small: its first conv is (64, 3, 3, 3), the model's layer 0 " \
           "(16, 3, 3, 3); start from it with model=gnetdet (GNetDet-448)" in str(e.value)


def test_a_vgg_file_is_no_input_of_a_quantized_stage(tmp_path):
    _, path = _vgg_file(tmp_path)
    cfg = compose(["model=gnetdet", "model.image_size=64"])
    spec = StageConf.from_node(config_for_stage(cfg, "step2").step)
    model = build_model(cfg)
    with pytest.raises(CheckpointError, match="a starting point for a float stage"):
        load_start(model, read_weights(path, "advice"), cfg, spec)
