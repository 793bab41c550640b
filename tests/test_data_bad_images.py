"""Bad images (mdk.data.image_check): what catches a corrupt file, the cached check, and
dataset.on_bad_image=error|skip on a small hand-made VOC tree."""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
from PIL import Image

from mdk.data import image_check
from mdk.data.build import build_datasets
from mdk.data.dataset import DetectionDataset
from mdk.models.heads import YoloV1Head
from mdk.data.image_check import check_images, decode_error
from mdk.data.index import cached_records
from mdk.data.voc import VOCReader
from mdk.errors import DataError
from helpers.voc_tree import CLASSES, jpeg_bytes, make_voc, truncate

HEAD = YoloV1Head(len(CLASSES), 2)


# ---- what catches a bad file ---------------------------------------------------------------------

GOOD = jpeg_bytes(448, 0)
BROKEN = {
    "truncated to 50%": GOOD[: len(GOOD) // 2],
    "truncated to 90%": GOOD[: int(len(GOOD) * 0.9)],
    "last 2 bytes (EOI) missing": GOOD[:-2],
    "4 KB of garbage in the middle": GOOD[: len(GOOD) // 2] + bytes(range(256)) * 16
    + GOOD[len(GOOD) // 2 + 4096:],
    "not an image": b"this is not a jpeg" * 40,
    "empty file": b"",
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_decoding_catches_what_verify_misses(tmp_path, case):
    path = tmp_path / "x.jpg"
    path.write_bytes(BROKEN[case])
    reason = decode_error(path)
    assert reason is not None, case
    if case.startswith(("truncated", "last")):
        assert "truncated" in reason
        with Image.open(path) as im:
            im.verify()  # PIL's verify() passes these: it is not a check for JPEG data
    (tmp_path / "ok.jpg").write_bytes(GOOD)
    assert decode_error(tmp_path / "ok.jpg") is None
    assert decode_error(tmp_path / "missing.jpg") == "the file is missing"


# ---- the cached check ----------------------------------------------------------------------------

def test_check_is_cached_and_redone_only_for_changed_files(tmp_path, monkeypatch):
    root = make_voc(tmp_path / "VOC")
    images = [f"JPEGImages/{i:06d}.jpg" for i in range(12)]
    cache = tmp_path / "meta" / "train.images.json"
    decoded: list[str] = []
    real = image_check.decode_error
    monkeypatch.setattr(image_check, "decode_error", lambda p: decoded.append(Path(p).name) or real(p))

    assert check_images(root, images, cache) == {}
    assert len(decoded) == 12 and json.loads(cache.read_text())["version"] == 2
    decoded.clear()
    assert check_images(root, images, cache) == {} and decoded == []   # all from the cache

    truncate(root / images[3])                                          # size and mtime change
    bad = check_images(root, images, cache)
    assert decoded == ["000003.jpg"] and list(bad) == [images[3]] and "truncated" in bad[images[3]]
    decoded.clear()
    assert check_images(root, images, cache) == bad and decoded == []   # a bad verdict is cached too

    (root / images[3]).write_bytes(jpeg_bytes(64, 3))                   # repaired
    os.utime(root / images[3], ns=(1, 1))  # an old mtime still differs from the cached one
    assert check_images(root, images, cache) == {} and decoded == ["000003.jpg"]
    decoded.clear()
    extra = images + ["JPEGImages/000012.jpg"]                           # the index grew
    assert check_images(root, extra, cache) == {} and decoded == ["000012.jpg"]
    decoded.clear()

    # Replaced in place by a broken file of the same size, its old mtime put back (a restore
    # from a backup): the ctime, which nobody can set, still tells.
    path = root / images[5]
    before = path.stat()
    time.sleep(0.05)  # file times are coarse (a kernel tick): let the ctime move on
    path.write_bytes(b"x" * before.st_size)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert list(check_images(root, extra, cache)) == [images[5]] and decoded == ["000005.jpg"]


def test_unwritable_cache_only_costs_a_recheck(tmp_path, caplog):
    root = make_voc(tmp_path / "VOC", n_train=2, n_val=1)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with caplog.at_level(logging.WARNING):
        assert check_images(root, ["JPEGImages/000000.jpg"], blocker / "c.json") == {}
    assert "could not write the image check cache" in caplog.text


# ---- dataset.on_bad_image ------------------------------------------------------------------------

def dataset(root: Path, tmp_path: Path, split: str = "train", **kw) -> DetectionDataset:
    records = cached_records(VOCReader(root, CLASSES), split, tmp_path / "meta")
    args = dict(root=root, split=split, records=records, class_names=CLASSES, image_size=64,
                grid=4, head=HEAD, augment=False, meta_dir=tmp_path / "meta")
    return DetectionDataset(**{**args, **kw})


def test_error_names_the_file_and_what_to_do(tmp_path):
    root = make_voc(tmp_path / "VOC")
    truncate(root / "JPEGImages" / "000003.jpg")
    with pytest.raises(DataError) as err:
        dataset(root, tmp_path)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"{root.resolve()}/JPEGImages/000003.jpg: cannot decode image (image "
                          "file is truncated")
    assert msg.endswith("; replace the file or set dataset.on_bad_image=skip")


def test_error_with_several_bad_files_counts_the_others(tmp_path):
    root = make_voc(tmp_path / "VOC")
    for i in (2, 5, 7):
        (root / "JPEGImages" / f"00000{i}.jpg").write_bytes(b"garbage")
    with pytest.raises(DataError, match=r"000002\.jpg: cannot decode image \(not an image format "
                       r"PIL can read\) \(and 2 more bad image\(s\) in split 'train': "
                       r"JPEGImages/000005\.jpg, JPEGImages/000007\.jpg\); replace the file"):
        dataset(root, tmp_path)


def test_image_deleted_after_the_index_was_built(tmp_path):
    root = make_voc(tmp_path / "VOC")
    dataset(root, tmp_path)                             # index and check cache are built
    (root / "JPEGImages" / "000004.jpg").unlink()      # the meta file does not go stale for it
    with pytest.raises(DataError, match=r"000004\.jpg: image listed in split 'train' is missing; "
                                        r"restore it, remove its id from the split, or set "
                                        r"dataset\.on_bad_image=skip$"):
        dataset(root, tmp_path)
    assert len(dataset(root, tmp_path, on_bad_image="skip")) == 11


def test_skip_leaves_bad_images_out_before_sampling_and_lists_them_once(tmp_path, caplog):
    root = make_voc(tmp_path / "VOC")
    truncate(root / "JPEGImages" / "000003.jpg")
    (root / "JPEGImages" / "000008.jpg").write_bytes(b"")
    with caplog.at_level(logging.INFO):
        ds = dataset(root, tmp_path, on_bad_image="skip")
    assert len(ds) == 10
    kept = [e.image for e in ds.records]
    assert kept == [f"JPEGImages/{i:06d}.jpg" for i in range(12) if i not in (3, 8)]  # split order
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "split 'train': skipping 2 bad image(s) of 12 (dataset.on_bad_image=skip): " \
           "JPEGImages/000003.jpg (image file is truncated" in warnings[0]
    assert "JPEGImages/000008.jpg (not an image format PIL can read)" in warnings[0]
    # Every item loads, and the boxes follow their own image (not shifted by the removal).
    for i in range(len(ds)):
        img, _, index = ds[i]
        assert img.shape == (3, 64, 64) and index == i
    # The same index on a second construction, from the cache (deterministic epochs).
    assert [e.image for e in dataset(root, tmp_path, on_bad_image="skip").records] == kept


def test_skip_with_cached_images_and_every_image_bad(tmp_path):
    root = make_voc(tmp_path / "VOC", n_train=3, n_val=1)
    truncate(root / "JPEGImages" / "000001.jpg")
    ds = dataset(root, tmp_path, on_bad_image="skip", cache_images=True)
    assert ds.images is not None and ds.images.shape[0] == len(ds) == 2
    for i in (0, 2):
        truncate(root / "JPEGImages" / f"{i:06d}.jpg")
    with pytest.raises(DataError, match="none of the 3 images of split 'train' can be decoded"):
        dataset(root, tmp_path, on_bad_image="skip")


def test_build_datasets_passes_the_policy_and_rejects_a_bad_value(tmp_path):
    root = make_voc(tmp_path / "VOC")
    truncate(root / "JPEGImages" / "000013.jpg")  # a val image
    cfg = {"name": "voc", "root": str(root), "class_names": CLASSES, "num_classes": 2,
           "train_split": "train", "val_split": "val", "on_bad_image": "skip"}
    train, val = build_datasets(cfg, 64, 4, HEAD, 0, tmp_path / "cache")
    assert (len(train), len(val)) == (12, 3)
    with pytest.raises(DataError, match=r"dataset.on_bad_image='ignore' must be one of "
                                        r"\['error', 'skip'\]"):
        build_datasets({**cfg, "on_bad_image": "ignore"}, 64, 4, HEAD, 0, tmp_path / "cache")
    with pytest.raises(DataError, match="000013.jpg: cannot decode image"):
        build_datasets({**cfg, "on_bad_image": "error"}, 64, 4, HEAD, 0, tmp_path / "cache")
