"""Catalogue, data entries (issue 2's list): what `python run.py` says for each bad dataset input.

Each test breaks a private copy of a tiny VOC folder, runs the command (in-process, see
test_catalogue_cli.py), and asserts the one stderr line, exit status 1, and that no file of the
dataset or the checkpoint folder was changed.
"""
from __future__ import annotations

from pathlib import Path

from test_catalogue_cli import assert_intact, cli, one_error_line, snapshot, voc, voc_args  # noqa: F401
from test_catalogue_cli import voc_master  # noqa: F401  (fixture)


def _first_id(root: Path, split: str = "train") -> str:
    return (root / "ImageSets" / "Main" / f"{split}.txt").read_text().split()[0]


def test_malformed_xml(voc, tmp_path, capsys):
    xml = voc / "Annotations" / f"{_first_id(voc)}.xml"
    xml.write_text("<annotation><size><width>64</width>")  # cut off
    before = snapshot(voc)
    status, _, err = cli(tmp_path, *voc_args(voc), capsys=capsys)
    one_error_line(status, err, "data error: ", str(xml), "malformed XML", "fix or regenerate")
    assert_intact(before)


def test_listed_image_missing(voc, tmp_path, capsys):
    image_id = _first_id(voc)
    (voc / "JPEGImages" / f"{image_id}.jpg").unlink()
    before = snapshot(voc)
    status, _, err = cli(tmp_path, *voc_args(voc), capsys=capsys)
    one_error_line(status, err, "data error: ", f"{image_id}", "is missing",
                   "remove the id from the split")
    assert_intact(before)


def test_class_not_in_list(voc, tmp_path, capsys):
    xml = voc / "Annotations" / f"{_first_id(voc)}.xml"
    text = xml.read_text()
    name = text.split("<name>")[1].split("</name>")[0]
    xml.write_text(text.replace(f"<name>{name}</name>", "<name>hexagon</name>", 1))
    before = snapshot(voc)
    status, _, err = cli(tmp_path, *voc_args(voc), capsys=capsys)
    one_error_line(status, err, "data error: ", str(xml), "class 'hexagon', not in "
                   "dataset.class_names", "add it to the class list or fix the annotation")
    assert_intact(before)


def test_empty_split(voc, tmp_path, capsys):
    (voc / "ImageSets" / "Main" / "train.txt").write_text("\n")
    before = snapshot(voc)
    status, _, err = cli(tmp_path, *voc_args(voc), capsys=capsys)
    one_error_line(status, err, "data error: ", "train.txt", "split 'train' is empty",
                   "one image id per line")
    assert_intact(before)
    assert not (tmp_path / "ck").exists()  # caught before any training


def test_missing_split_file(voc, tmp_path, capsys):
    status, _, err = cli(tmp_path, *voc_args(voc), "dataset.train_split=trainval", capsys=capsys)
    one_error_line(status, err, "data error: ", "trainval.txt: split file not found",
                   "found: ['train', 'val']")


def test_dataset_root_does_not_exist(tmp_path, capsys):
    missing = tmp_path / "no" / "VOC2007"
    status, _, err = cli(tmp_path, *voc_args(missing), capsys=capsys)
    one_error_line(status, err, f"data error: dataset.root='{missing}' does not exist",
                   "JPEGImages/, Annotations/ and ImageSets/Main/")
    assert not missing.exists()


def test_dataset_root_is_the_parent_folder(voc, tmp_path, capsys):
    status, _, err = cli(tmp_path, *voc_args(voc.parent), capsys=capsys)
    one_error_line(status, err, "data error: ", "has no JPEGImages/ folder", "not its parent")


def test_voc_without_root(tmp_path, capsys):
    status, _, err = cli(tmp_path, "dataset=voc", capsys=capsys)
    one_error_line(status, err, "dataset.root")


def test_box_outside_or_zero_area_is_a_counted_warning(voc, tmp_path, capsys):
    """Sane data loss, not an error: clipped / dropped with a count, and the run finishes."""
    xml = voc / "Annotations" / f"{_first_id(voc)}.xml"
    text = xml.read_text()
    outside = "<xmin>50</xmin><ymin>50</ymin><xmax>90</xmax><ymax>70</ymax>"   # past the 64px edge
    zero = "<xmin>10</xmin><ymin>10</ymin><xmax>10</xmax><ymax>30</ymax>"      # zero width
    obj = "<object><name>circle</name><difficult>0</difficult><bndbox>{}</bndbox></object>"
    text = text.replace("</annotation>", obj.format(outside) + obj.format(zero) + "</annotation>")
    xml.write_text(text)
    before = snapshot(voc)
    status, out, err = cli(tmp_path, *voc_args(voc), capsys=capsys)
    assert status == 0, err[-2000:]
    assert "split 'train': 1 boxes were clipped to the image and 1 zero-area boxes dropped" in out
    assert_intact(before)
    assert (tmp_path / "ck" / "step1" / "last.pth").is_file()
