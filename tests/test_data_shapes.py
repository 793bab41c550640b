"""Built-in shapes dataset: layout, determinism, idempotence, regeneration, safety."""
import json
import os

import pytest

from mdk.data.shapes import SHAPE_CLASSES, ensure_shapes_dataset
from mdk.data.voc import parse_voc_xml, read_split
from mdk.errors import DataError

KW = dict(num_train=6, num_val=3, image_size=64, seed=3)


def test_layout_and_valid_annotations(tmp_path):
    root = ensure_shapes_dataset(tmp_path / "shapes", **KW)
    train, val = read_split(root, "train"), read_split(root, "val")
    assert (len(train), len(val)) == (6, 3) and not set(train) & set(val)
    n_objects = 0
    for image_id in train + val:
        assert (root / "JPEGImages" / f"{image_id}.jpg").is_file()
        rec, clipped, zero_area = parse_voc_xml(root / "Annotations" / f"{image_id}.xml",
                                                SHAPE_CLASSES)
        assert 1 <= len(rec.labels) <= 4
        assert (rec.width, rec.height) == (64, 64)
        assert (clipped, zero_area) == (0, 0)
        assert (rec.boxes[:, 2:] > rec.boxes[:, :2]).all()
        n_objects += len(rec.labels)
    assert n_objects > 9
    # no temp folders left next to the dataset
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shapes"]


def test_same_seed_is_byte_identical_other_seed_differs(tmp_path):
    a = ensure_shapes_dataset(tmp_path / "a", **KW)
    b = ensure_shapes_dataset(tmp_path / "b", **KW)
    c = ensure_shapes_dataset(tmp_path / "c", **{**KW, "seed": 4})
    for sub in ("Annotations", "JPEGImages"):
        names = sorted(p.name for p in (a / sub).iterdir())
        assert names == sorted(p.name for p in (b / sub).iterdir())
        assert all((a / sub / n).read_bytes() == (b / sub / n).read_bytes() for n in names)
    ann = lambda r: [(r / "Annotations" / f"{i:06d}.xml").read_bytes() for i in range(9)]
    assert ann(a) != ann(c)


def test_growing_val_keeps_train_images(tmp_path):
    a = ensure_shapes_dataset(tmp_path / "a", **KW)
    b = ensure_shapes_dataset(tmp_path / "b", **{**KW, "num_val": 5})
    assert (a / "Annotations/000004.xml").read_bytes() == (b / "Annotations/000004.xml").read_bytes()


def test_idempotent_and_regenerates_on_parameter_change(tmp_path):
    root = ensure_shapes_dataset(tmp_path / "s", **KW)
    stamp = (root / "Annotations/000000.xml").stat().st_mtime_ns
    marker = root / "JPEGImages/000000.jpg"
    os.utime(marker, ns=(1, 1))
    ensure_shapes_dataset(tmp_path / "s", **KW)
    assert marker.stat().st_mtime_ns == 1            # untouched: nothing regenerated
    ensure_shapes_dataset(tmp_path / "s", **{**KW, "num_train": 4})
    assert len(read_split(root, "train")) == 4
    assert json.loads((root / "manifest.json").read_text())["num_train"] == 4
    assert marker.stat().st_mtime_ns != 1 and stamp > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_refuses_foreign_folder_and_bad_params(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "precious.txt").write_text("keep me")
    with pytest.raises(DataError, match="not a generated shapes dataset"):
        ensure_shapes_dataset(tmp_path / "mine", **KW)
    assert (tmp_path / "mine" / "precious.txt").read_text() == "keep me"
    with pytest.raises(DataError, match="hexagon"):
        ensure_shapes_dataset(tmp_path / "x", class_names=["circle", "hexagon"], **KW)
    with pytest.raises(DataError, match="num_train=0"):
        ensure_shapes_dataset(tmp_path / "x", **{**KW, "num_train": 0})


def test_class_subset_only_draws_those(tmp_path):
    root = ensure_shapes_dataset(tmp_path / "s", class_names=["star", "cross"], **KW)
    for i in range(9):
        rec, _, _ = parse_voc_xml(root / f"Annotations/{i:06d}.xml", ["star", "cross"])
        assert len(rec.labels) >= 1


def test_val_first_keeps_the_val_images_whatever_the_train_split(tmp_path):
    """``dataset.generate.val_first``: a larger train split adds images without changing val."""
    from mdk.data.shapes import ensure_shapes_dataset

    small = ensure_shapes_dataset(tmp_path / "a", num_train=4, num_val=2, image_size=64, seed=1,
                                  val_first=4)
    big = ensure_shapes_dataset(tmp_path / "b", num_train=7, num_val=2, image_size=64, seed=1,
                                val_first=4)
    plain = ensure_shapes_dataset(tmp_path / "c", num_train=4, num_val=2, image_size=64, seed=1)
    val = lambda root: (root / "ImageSets/Main/val.txt").read_text().split()  # noqa: E731
    jpg = lambda root, i: (root / "JPEGImages" / f"{i}.jpg").read_bytes()  # noqa: E731
    assert [jpg(small, i) for i in val(small)] == [jpg(big, i) for i in val(big)]
    # the train images before val_first are the same; the plain layout is the val_first one
    # when the train split is val_first images long
    assert [jpg(small, f"{i:06d}") for i in range(4)] == [jpg(big, f"{i:06d}") for i in range(4)]
    assert [jpg(small, f"{i:06d}") for i in range(6)] == [jpg(plain, f"{i:06d}") for i in range(6)]
