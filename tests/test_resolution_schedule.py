"""``trainer.image_sizes``: a float stage trains its first epochs on fewer pixels and ends at the
model's size; the targets follow each epoch's grid, the loader and the device path give the same
images, the augmentation can scale with the size, and bad schedules are one line."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from conftest import compose
from mdk.data.augment import BatchAugment, resize_image
from mdk.data.config import AugmentConf, check_dataset
from mdk.data.dataset import DetectionDataset
from mdk.data.index import cached_records
from mdk.data.shapes import SHAPE_CLASSES, ensure_shapes_dataset
from mdk.data.voc import VOCReader
from mdk.errors import ConfigError
from mdk.models.heads import YoloV1Head
from mdk.models.yolo_codec import decode
from mdk.trainer_config import epoch_sizes, image_sizes

CLASSES = list(SHAPE_CLASSES)
SIZE, STRIDE = 64, 16


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return ensure_shapes_dataset(tmp_path_factory.mktemp("d") / "shapes", num_train=8, num_val=2,
                                 image_size=SIZE, seed=3)


def make(root, tmp_path, **kw) -> DetectionDataset:
    args = dict(root=root, split="train", class_names=CLASSES, image_size=SIZE,
                grid=SIZE // STRIDE, head=YoloV1Head(len(CLASSES), 1), augment=True,
                meta_dir=tmp_path / "meta", seed=5)
    args.update(kw)
    records = cached_records(VOCReader(root, CLASSES), "train", args["meta_dir"])
    return DetectionDataset(records=records, **args)


def test_the_phases_cover_the_epochs_in_order_and_end_at_the_last_size():
    assert epoch_sizes([(160, 0.75), (224, 0.25)], 20) == [160] * 15 + [224] * 5
    assert epoch_sizes([(128, 0.5), (160, 0.3), (224, 0.2)], 7) == [128] * 4 + [160] * 2 + [224]
    assert epoch_sizes([(160, 0.99), (224, 0.01)], 3) == [160, 160, 224]  # the end is the chip's
    assert epoch_sizes([(224, 1.0)], 1) == [224]


def test_an_epoch_at_a_smaller_size_has_its_grid_and_the_same_objects(root, tmp_path):
    ds = make(root, tmp_path)
    ds.epoch_sizes = [32, 64]
    for i in range(len(ds)):
        small, t_small, _ = ds[(0, i)]
        full, t_full, _ = ds[(1, i)]
        assert small.shape == (3, 32, 32) and full.shape == (3, SIZE, SIZE)
        assert t_small.shape[:2] == (2, 2) and t_full.shape[:2] == (4, 4)
    # the same augmentation at both sizes: the small epoch's boxes are the full ones / 2 (where
    # the coarser grid still holds every object: one per cell)
    checked = 0
    for i in range(len(ds)):
        ds.epoch_sizes = [32]
        a_img, a_t, _ = ds[(0, i)]
        ds.epoch_sizes = [64]
        b_img, b_t, _ = ds[(0, i)]
        assert torch.equal(a_img, resize_image(b_img, 32))
        det_a = decode(a_t.permute(2, 0, 1)[None], 32, boxes_per_cell=1)[0]["boxes"]
        det_b = decode(b_t.permute(2, 0, 1)[None], 64, boxes_per_cell=1)[0]["boxes"]
        if len(det_a) == len(det_b) > 0:
            torch.testing.assert_close(det_a.sort(0).values * 2, det_b.sort(0).values,
                                       atol=1e-4, rtol=0)
            checked += 1
    assert checked >= 3


def test_the_device_path_resizes_after_augmenting_as_the_loader_does(root, tmp_path):
    loader_side = make(root, tmp_path)
    device_side = make(root, tmp_path)
    aug = BatchAugment(device_side)
    for ds in (loader_side, device_side):
        ds.epoch_sizes = [32]
    items = [device_side[(0, i)] for i in range(4)]
    batch = [torch.stack([it[k] for it in items]) for k in range(2)] + [None,
                                                                       torch.stack([it[3] for it in items])]
    got = aug(batch[0], batch)
    want = torch.stack([loader_side[(0, i)][0] for i in range(4)])
    assert got.shape == want.shape == (4, 3, 32, 32)
    assert (got.int() - want.int()).abs().max() <= 2   # the two augmentations agree to rounding
    assert torch.equal(batch[1], torch.stack([loader_side[(0, i)][1] for i in range(4)]))


def test_augmentation_strengths_scale_with_the_size_by_size_power():
    a = AugmentConf(scale=[0.8, 1.2], shift=0.1, jitter=0.2, size_power=1.0)
    half = a.at_size(112, 224)
    assert half.scale == pytest.approx([0.9, 1.1]) and half.shift == pytest.approx(0.05)
    assert half.jitter == pytest.approx(0.1) and half.flip == a.flip
    assert a.at_size(224, 224) is a and AugmentConf().at_size(112, 224) == AugmentConf()


@pytest.mark.parametrize("value, match", [
    ("[[48,0.5],[64,0.5]]", r"trainer.image_sizes\[0\]=\[48, 0.5\] must be \[size, share\]: a "
                            r"size the model's 5 pools divide \(a multiple of 32\)"),
    ("[[32,0.5],[64,0.4]]", r"must have shares that sum to 1"),
    ("[[64,0.5],[32,0.5]]", r"must end at model.image_size=64"),
    ("[[32,0],[64,1]]", r"trainer.image_sizes\[0\]=\[32, 0\] must be \[size, share\]"),
    ("[160]", r"trainer.image_sizes\[0\]=160 must be \[size, share\]"),
])
def test_a_bad_schedule_is_one_line_naming_the_key(value, match):
    cfg = compose(["debug=tiny", f"trainer.image_sizes={value}"])
    with pytest.raises(ConfigError, match=match):
        image_sizes(cfg)


def test_a_good_schedule_reads_back_and_none_means_none():
    cfg = compose(["debug=tiny", "trainer.image_sizes=[[32,0.5],[64,0.5]]"])
    assert image_sizes(cfg) == [(32, 0.5), (64, 0.5)]
    assert image_sizes(compose(["debug=tiny"])) is None
    assert OmegaConf.select(cfg, "model.image_size") == 64


@pytest.mark.parametrize("value", ["-1", "5"])
def test_a_bad_size_power_is_one_line(value):
    cfg = compose(["debug=tiny", f"dataset.augmentation.size_power={value}"])
    with pytest.raises(ConfigError, match=r"^dataset.augmentation.size_power=.* must be a number "
                                          r"in \[0, 4\] \(0: the same strengths at every size"):
        check_dataset(cfg)
