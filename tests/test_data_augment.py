"""Augmentation on the training device (dataset.augment_on=device): the same parameters as the
loader path, images equal to rounding, batches independent of their composition, runs
deterministic."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mdk.data.augment import AugParams, augment_batch, augment_image, draw


def _images(n: int, size: int = 48, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 256, (n, 3, size // 4, size // 4), dtype=torch.uint8, generator=g)
    # smooth-ish content (upsampled blocks) plus noise, like photos: interpolation matters
    img = torch.nn.functional.interpolate(base.float(), size=(size, size), mode="bilinear")
    img = img + torch.randint(-20, 21, img.shape, generator=g).float()
    return img.clamp(0, 255).to(torch.uint8)


def _params(n: int, size: int, seed: int = 1) -> list[AugParams]:
    return [draw(np.random.default_rng([seed, 0, i]), size) for i in range(n)]


def test_batch_equals_per_sample_torchvision_to_rounding():
    size = 48
    images, params = _images(32, size), _params(32, size)
    got = augment_batch(images, params)
    want = torch.stack([augment_image(img, p) for img, p in zip(images, params)])
    diff = (got.int() - want.int()).abs()
    assert diff.max() <= 2, diff.max()
    assert (diff == 0).float().mean() >= 0.98  # off-by-one only where rounding disagrees
    assert any(p.flip for p in params) and any(p.affine for p in params)


def test_identity_parameters_keep_the_image_exactly():
    images = _images(4)
    same = AugParams(False, False, 1.0, (0.0, 0.0), 1.0, 1.0, 1.0)
    assert torch.equal(augment_batch(images, [same] * 4), images)
    flipped = AugParams(True, False, 1.0, (0.0, 0.0), 1.0, 1.0, 1.0)
    assert torch.equal(augment_batch(images, [flipped] * 4), images.flip(-1))


def test_a_sample_does_not_depend_on_the_rest_of_its_batch():
    images, params = _images(8), _params(8, 48)
    whole = augment_batch(images, params)
    for lo in (0, 3, 6):  # any split of the batch, as across world sizes and chunks
        part = augment_batch(images[lo:lo + 2], params[lo:lo + 2])
        assert torch.equal(part, whole[lo:lo + 2])


@pytest.mark.slow
def test_device_augmentation_run_is_deterministic_and_resumes_bit_identically(tiny_cfg, tmp_path):
    from mdk.checkpoint.files import load_checkpoint
    from mdk.engine.runner import run_stage

    dev = ("dataset.augment_on=device", "trainer.epochs=2")

    def weights(name: str, *extra: str) -> dict:
        run_stage(tiny_cfg(*dev, f"paths.checkpoints={tmp_path}/{name}", *extra), tmp_path / name)
        return load_checkpoint(tmp_path / name / "step1" / "last.pth")["model"]

    a, b = weights("a"), weights("b")
    assert all(torch.equal(a[k], b[k]) for k in a)
    loader = weights("loader", "dataset.augment_on=loader")
    assert any(not torch.equal(a[k], loader[k]) for k in a)  # it did augment differently
    # stop after epoch 1 (a 1-epoch run leaves its last.pth), then resume to 2 epochs
    run_stage(tiny_cfg(*dev, "trainer.epochs=1", f"paths.checkpoints={tmp_path}/r"), tmp_path / "r")
    c = weights("r")
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_strengths_shape_the_draws_and_the_default_stream_is_unchanged():
    """dataset.augmentation: the default strengths draw the same numbers as before the knobs
    existed (four uniforms after the two coin flips, no vertical flip drawn); stronger ones
    widen the zoom and add vertical flips, on the loader and the device paths alike."""
    from mdk.data.config import AugmentConf

    rng = np.random.default_rng([3, 0, 5])
    raw = rng.random(2), rng.uniform(0.8, 1.2), rng.uniform(-0.1, 0.1, 2), rng.uniform(0.8, 1.2, 3)
    p = draw(np.random.default_rng([3, 0, 5]), 48)
    assert (p.flip, p.affine, p.scale) == (raw[0][0] < 0.5, raw[0][1] < 0.5, raw[1]) and not p.vflip
    assert p.shift == tuple((raw[2] * 48).tolist()) and p.sat == raw[3][2]
    strong = AugmentConf(vflip=0.5, affine=1.0, scale=[0.5, 1.5], shift=0.2)
    ps = [draw(np.random.default_rng([1, 0, i]), 48, strong) for i in range(64)]
    assert all(q.affine for q in ps) and 10 < sum(q.vflip for q in ps) < 54
    assert min(q.scale for q in ps) < 0.7 and max(q.scale for q in ps) > 1.3
    images = _images(len(ps))
    got = augment_batch(images, ps)
    want = torch.stack([augment_image(img, q) for img, q in zip(images, ps)])
    diff = (got.int() - want.int()).abs()
    assert diff.max() <= 2 and (diff == 0).float().mean() >= 0.98
    vflipped = AugParams(False, False, 1.0, (0.0, 0.0), 1.0, 1.0, 1.0, vflip=True)
    assert torch.equal(augment_batch(images[:4], [vflipped] * 4), images[:4].flip(-2))


def test_vertical_flip_moves_the_boxes_with_the_image():
    from mdk.data.augment import augment_boxes

    boxes = torch.tensor([[4.0, 6.0, 20.0, 30.0]])
    p = AugParams(False, False, 1.0, (0.0, 0.0), 1.0, 1.0, 1.0, vflip=True)
    out, labels = augment_boxes(boxes, torch.tensor([2]), p, 48)
    assert out.tolist() == [[4.0, 18.0, 20.0, 42.0]] and labels.tolist() == [2]


@pytest.mark.parametrize("key, value, match", [
    ("vflip", 1.5, r"dataset.augmentation.vflip=1.5 must be a number in \[0, 1\]"),
    ("scale", [1.2, 0.8], r"dataset.augmentation.scale=\[1.2, 0.8\] must be \[low, high\]"),
    ("jitter", 1.0, r"dataset.augmentation.jitter=1.0 must be a number in \[0, 1\)"),
])
def test_bad_strength_is_one_config_line(key, value, match):
    from mdk.data.config import check_augmentation
    from mdk.errors import ConfigError

    with pytest.raises(ConfigError, match="^" + match):
        check_augmentation({key: value})
