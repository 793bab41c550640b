"""Catalogue, YOLO entries (docs/errors.md): what `python run.py dataset=yolo` says for each bad
input. Each test breaks a private copy of a tiny YOLO folder (the built-in data exported with
voc2yolo, images copied), runs the command in-process (tests/helpers/catalogue.py), and asserts
the one stderr line naming the file (and line) and what to do, exit status 1, no file changed."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers.catalogue import CLASSES, assert_intact, cli, one_error_line, snapshot
from helpers.catalogue import voc_master  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def yolo_master(voc_master, tmp_path_factory) -> Path:  # noqa: F811
    from mdk.data.yolo_export import export_voc_to_yolo

    root = tmp_path_factory.mktemp("yolo") / "YOLO"
    export_voc_to_yolo(voc_master, root, class_names=["circle", "square", "triangle", "star",
                                                      "cross"], copy=True)
    return root


@pytest.fixture
def yolo(yolo_master, tmp_path) -> Path:
    root = tmp_path / "YOLO"
    shutil.copytree(yolo_master, root)
    return root


def yolo_args(root: Path) -> list[str]:
    return ["dataset=yolo", f"dataset.root={root}", CLASSES, "dataset.num_classes=5",
            "dataset.num_workers=0"]


def add_line(line: str):
    def change(root: Path) -> tuple[Path, int]:
        path = root / "labels" / "train" / "000005.txt"
        path.write_text(path.read_text() + line + "\n")
        return path, len(path.read_text().splitlines())
    return change


def yaml_text(text: str, line: int = 0):
    def change(root: Path) -> tuple[Path, int]:
        (root / "data.yaml").write_text(text)
        return root / "data.yaml", line
    return change


NAMES = "names: [circle, square, triangle, star, cross]\n"
# (case, how to break it, the line after "data error: <file>[:line]: "; before any training?)
CASES = [
    ("coordinate_outside", add_line("1 0.5 1.5 0.2 0.2"),
     "coordinate 1.5 is outside 0-1; YOLO labels are fractions of the image size (x / width); "
     "fix the line or export the labels normalised", False),
    ("unknown_class_id", add_line("9 0.5 0.5 0.2 0.2"),
     "class id '9' is not one of data.yaml's ids 0..4", False),
    ("malformed_line", add_line("1 0.5 0.5 0.2"),
     "4 fields; a label line is 'class cx cy w h' (5 numbers, normalised to 0-1) or 'class x1 y1 "
     "x2 y2 x3 y3 ...' (a polygon of 3 or more points)", False),
    ("not_a_number", add_line("1 0.5 0.5 0.2 x"), "'x' is not a number; a label line is", False),
    ("unsafe_tag", yaml_text("train: images/train\nval: !!python/object/apply:os.getcwd []\n"
                             + NAMES, line=2),
     "tag !!python/object/apply:os.getcwd is not allowed: mdk reads data.yaml with a safe loader "
     "and runs nothing from it; remove the tag (plain values only)", True),
    ("names_ids_with_a_gap", yaml_text("train: images/train\nval: images/val\nnames: {0: circle, "
                                       "1: square, 3: star}\n"),
     "names has the ids [0, 1, 3], not 0..2; number the classes from 0 without gaps (and their "
     "labels with them)", True),
    ("missing_split_folder", yaml_text("train: images/train\nval: ../valid/images\n" + NAMES),
     "val: '../valid/images' is", True),
]


@pytest.mark.parametrize("name, change, needle, early", CASES, ids=[c[0] for c in CASES])
def test_bad_yolo_input_is_one_line(yolo, tmp_path, capsys, name, change, needle, early):
    path, line = change(yolo)
    before = snapshot(yolo)
    status, out, err = cli(tmp_path, *yolo_args(yolo), capsys=capsys)
    where = f"{path}:{line}" if line else str(path)
    one_error_line(status, err, f"data error: {where}: {needle}")
    assert_intact(before)
    assert ("=== step1 ===" in out) is not early


def test_no_data_yaml_or_no_root_is_one_line(yolo, tmp_path, capsys):
    (yolo / "data.yaml").unlink()
    status, _, err = cli(tmp_path, *yolo_args(yolo), capsys=capsys)
    one_error_line(status, err, f"data error: {yolo}: no data.yaml (found none); write one with "
                   "train: and val: (image folders or .txt lists) and names: [...]")
    status, _, err = cli(tmp_path, "dataset=yolo", capsys=capsys)
    one_error_line(status, err, "data error: dataset.root is not set; pass dataset.root=/path/to/"
                   "the/data (the folder conf/dataset/yolo.yaml describes)")


def test_background_images_and_polygons_train(yolo, tmp_path, capsys):
    """Not errors: an image without a label file trains as background, a polygon as its box
    (said once); the run finishes."""
    (yolo / "labels/train/000002.txt").unlink()
    (yolo / "labels/train/000003.txt").write_text("2 0.1 0.1 0.6 0.1 0.4 0.7\n")
    status, out, err = cli(tmp_path, *yolo_args(yolo), capsys=capsys)
    assert status == 0, err[-2000:]
    assert out.count("1 label lines are segmentation polygons; each is read as its bounding "
                     "box") == 1
    assert f"{yolo} split 'train': 16 images" in out
    assert (tmp_path / "ck" / "step1" / "last.pth").is_file()
