"""VOC parsing: good XML, each kind of bad XML, split files, roots, missing images."""
from pathlib import Path

import numpy as np
import pytest

from mdk.data.voc import check_root, find_image, parse_voc_xml, read_split
from mdk.errors import DataError

CLASSES = ["cat", "dog"]


def xml(objects: str, size: str = "<size><width>100</width><height>80</height><depth>3</depth></size>") -> str:
    return f"<annotation><filename>a.jpg</filename>{size}{objects}</annotation>"


def obj(name="cat", box=(10, 20, 30, 40), difficult=0) -> str:
    b = "".join(f"<{t}>{v}</{t}>" for t, v in zip(("xmin", "ymin", "xmax", "ymax"), box))
    return f"<object><name>{name}</name><difficult>{difficult}</difficult><bndbox>{b}</bndbox></object>"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "a.xml"
    p.write_text(text)
    return p


def test_good_xml(tmp_path):
    rec, clipped, zero_area = parse_voc_xml(
        write(tmp_path, xml(obj() + obj("dog", (0, 0, 100, 80), 1))), CLASSES, "JPEGImages/a.jpg")
    assert (rec.image, rec.width, rec.height) == ("JPEGImages/a.jpg", 100, 80)
    np.testing.assert_array_equal(rec.boxes, [[10, 20, 30, 40], [0, 0, 100, 80]])
    assert rec.boxes.dtype == np.float32
    assert rec.labels.tolist() == [0, 1]
    assert rec.difficult.tolist() == [False, True]
    assert (clipped, zero_area) == (0, 0)


def test_no_objects_is_fine(tmp_path):
    rec, _, _ = parse_voc_xml(write(tmp_path, xml("")), CLASSES)
    assert rec.boxes.shape == (0, 4) and rec.labels.shape == (0,)


def test_box_outside_is_clipped_and_counted(tmp_path, caplog):
    caplog.set_level("DEBUG", logger="mdk.data.records")  # the bad-box policy logs each
    rec, clipped, zero_area = parse_voc_xml(write(tmp_path, xml(obj(box=(-5, 10, 120, 90)))),
                                            CLASSES)
    np.testing.assert_array_equal(rec.boxes, [[0, 10, 100, 80]])
    assert (clipped, zero_area) == (1, 0)
    assert "clipped" in caplog.records[0].getMessage()


@pytest.mark.parametrize("box", [(10, 10, 10, 30), (30, 10, 20, 40), (150, 10, 200, 40)])
def test_zero_area_box_is_kept_for_evaluation_and_counted(tmp_path, box):
    """The VOC devkit counts a zero-area object (no detection can match it); training leaves it
    out (test_data_dataset.py); clipped to the image like any box."""
    rec, clipped, zero_area = parse_voc_xml(write(tmp_path, xml(obj(box=box) + obj("dog"))),
                                            CLASSES)
    assert rec.labels.tolist() == [0, 1]
    assert rec.boxes[0].tolist() == [min(v, lim) for v, lim in zip(box, (100, 80, 100, 80))]
    assert (clipped, zero_area) == (0, 1)


@pytest.mark.parametrize("text, problem", [
    ("<annotation><size>", "malformed XML"),
    ("<foo></foo>", "expected <annotation>"),
    (xml(obj(), size=""), "missing <size>"),
    (xml(obj(), size="<size><width>100</width></size>"), "missing <height>"),
    (xml(obj(), size="<size><width>0</width><height>5</height></size>"), "not positive"),
    (xml(obj("horse")), "class 'horse', not in dataset.class_names"),
    (xml("<object><name>cat</name></object>"), "has no <bndbox>"),
    (xml(obj(box=(1, 2, "x", 4))), "is 'x', not a number"),
    (xml(obj().replace("<xmax>30</xmax>", "")), "missing <xmax>"),
    (xml("<object><bndbox/></object>"), "missing <name>"),
])
def test_bad_xml_names_file_and_problem(tmp_path, text, problem):
    p = write(tmp_path, text)
    with pytest.raises(DataError) as err:
        parse_voc_xml(p, CLASSES)
    assert str(p) in str(err.value) and problem in str(err.value)


def test_missing_annotation_file(tmp_path):
    with pytest.raises(DataError, match="annotation file not found"):
        parse_voc_xml(tmp_path / "nope.xml", CLASSES)


def make_root(tmp_path: Path) -> Path:
    root = tmp_path / "VOC"
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (root / sub).mkdir(parents=True)
    return root


def test_missing_root_and_wrong_layout(tmp_path):
    with pytest.raises(DataError, match="does not exist") as err:
        check_root(tmp_path / "nowhere")
    assert "nowhere" in str(err.value)
    (tmp_path / "VOCdevkit").mkdir()
    with pytest.raises(DataError, match="no JPEGImages/"):
        check_root(tmp_path / "VOCdevkit")


def test_read_split(tmp_path):
    root = make_root(tmp_path)
    (root / "ImageSets/Main/train.txt").write_text("000001\n\n000002  1\n")
    assert read_split(root, "train") == ["000001", "000002"]


def test_empty_split_and_missing_split(tmp_path):
    root = make_root(tmp_path)
    (root / "ImageSets/Main/train.txt").write_text("\n  \n")
    with pytest.raises(DataError, match="is empty") as err:
        read_split(root, "train")
    assert "train.txt" in str(err.value)
    with pytest.raises(DataError, match=r"split file not found.*\['train'\]"):
        read_split(root, "val")


def test_missing_image(tmp_path):
    root = make_root(tmp_path)
    (root / "JPEGImages/a.png").write_bytes(b"x")
    assert find_image(root, "a") == root / "JPEGImages/a.png"
    with pytest.raises(DataError, match="image 'b' listed in .*train.txt is missing") as err:
        find_image(root, "b", root / "ImageSets/Main/train.txt")
    assert str(root / "JPEGImages" / "b") in str(err.value)
