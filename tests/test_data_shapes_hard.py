"""The harder built-in dataset (dataset=shapes_hard): determinism, its classes, object sizes and
overlaps, a real step1 on it; and the default shapes data pinned to its bytes."""
import hashlib
import itertools
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from conftest import REPO
from mdk.data import shapes_hard
from mdk.data.shapes import SHAPE_CLASSES, ensure_shapes_dataset, render_image
from mdk.data.shapes_hard import HARD_CLASSES, ensure_shapes_hard_dataset, render_hard_image
from mdk.data.voc import parse_voc_xml, read_split
from mdk.engine.runner import run_stage
from mdk.errors import DataError

KW = dict(num_train=6, num_val=3, image_size=96, seed=3)


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def test_default_shapes_bytes_are_pinned(tmp_path):
    """These digests were computed with the shapes generator as it was before shapes_hard
    existed (its drawing and writing then shared): they pin today's bytes, so a folder users
    generated earlier keeps its manifest and is never regenerated. The pixel digest is free of
    the JPEG encoder; the file digest also pins Pillow's JPEG output (a Pillow upgrade that
    encodes differently changes only that one)."""
    root = ensure_shapes_dataset(tmp_path / "s", num_train=6, num_val=3, image_size=64, seed=3)
    h = hashlib.sha256()
    for i in range(9):
        img, objects = render_image(i, 64, 3, SHAPE_CLASSES)
        h.update(np.asarray(img).tobytes())
        h.update(repr(objects).encode())
    assert h.hexdigest() == "c0103bb27f8a5bc5c8f261d888c86915c182a04108181e8f1de43ed29997e373"
    assert _digest(root) == "d6a730fd0ea03b9e31d5511b7ec8e19e3581d5602c806e9c519a0796464283b1"
    assert (root / "manifest.json").read_text() == (
        '{\n "class_names": [\n  "circle",\n  "square",\n  "triangle",\n  "star",\n  "cross"\n ],'
        '\n "image_size": 64,\n "num_train": 6,\n "num_val": 3,\n "seed": 3,\n "version": 1\n}')


def test_same_parameters_are_byte_identical_other_seed_differs(tmp_path):
    a = ensure_shapes_hard_dataset(tmp_path / "a", **KW)
    b = ensure_shapes_hard_dataset(tmp_path / "b", **KW)
    c = ensure_shapes_hard_dataset(tmp_path / "c", **{**KW, "seed": 4})
    assert _digest(a) == _digest(b) != _digest(c)
    assert (len(read_split(a, "train")), len(read_split(a, "val"))) == (6, 3)
    # a shapes folder is not a shapes_hard one: its manifest differs, so it is regenerated
    ensure_shapes_dataset(tmp_path / "d", num_train=6, num_val=3, image_size=96, seed=3)
    assert _digest(ensure_shapes_hard_dataset(tmp_path / "d", **KW)) == _digest(a)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c", "d"]  # no temp folders


def test_classes_match_the_yaml_and_are_all_drawn():
    yaml = OmegaConf.load(REPO / "conf/dataset/shapes_hard.yaml")
    assert list(yaml.class_names) == list(HARD_CLASSES) and yaml.num_classes == 15
    assert yaml.generate._target_ == "mdk.data.shapes_hard.ensure_shapes_hard_dataset"
    seen = {name for i in range(40) for name, _ in render_hard_image(i, 96, 0, HARD_CLASSES)[1]}
    assert seen == set(HARD_CLASSES)
    subset = ["star_outline", "circle_striped"]
    assert {n for i in range(10) for n, _ in render_hard_image(i, 96, 0, subset)[1]} == set(subset)


def test_objects_span_a_wide_size_range_and_overlap():
    sides, counts, overlapping, pairs = [], [], 0, 0
    for i in range(60):
        img, objects = render_hard_image(i, 224, 0, HARD_CLASSES)
        assert img.size == (224, 224)
        boxes = np.array([box for _, box in objects], float)
        assert ((boxes[:, 2:] > boxes[:, :2]) & (boxes[:, :2] >= 0) & (boxes[:, 2:] <= 224)).all()
        sides += list((boxes[:, 2:] - boxes[:, :2]).max(1) / 224)
        counts.append(len(objects))
        for a, b in itertools.combinations(boxes, 2):   # a was drawn first
            iw = min(a[2], b[2]) - max(a[0], b[0])
            ih = min(a[3], b[3]) - max(a[1], b[1])
            pairs += 1
            if iw > 0 and ih > 0:
                overlapping += 1
                # a later object hides at most a third of an earlier one's box: none vanishes
                assert iw * ih / ((a[2] - a[0]) * (a[3] - a[1])) < shapes_hard.MAX_COVER
    sides = np.array(sides)
    assert sides.min() < 0.075 and sides.max() > 0.35  # small and large objects
    assert (sides < 0.12).mean() > 0.2                # small ones are common, not rare
    assert shapes_hard.MIN_OBJECTS <= min(counts) and max(counts) <= shapes_hard.MAX_OBJECTS
    assert np.mean(counts) > 3
    assert overlapping / pairs > 0.08 and overlapping > 20   # real overlap, not a rare accident


def test_refuses_unknown_classes_and_bad_sizes(tmp_path):
    with pytest.raises(DataError, match="shapes_hard generator draws only"):
        ensure_shapes_hard_dataset(tmp_path / "x", class_names=["circle"], **KW)
    with pytest.raises(DataError, match="image_size=16 >= 32"):
        ensure_shapes_hard_dataset(tmp_path / "x", **{**KW, "image_size": 16})
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(DataError, match="not a generated shapes_hard dataset"):
        ensure_shapes_hard_dataset(tmp_path / "mine", **KW)


def test_step1_trains_on_it_end_to_end(tiny_cfg, tmp_path):
    cfg = tiny_cfg("dataset=shapes_hard")
    result = run_stage(cfg, tmp_path / "run")
    root = Path(cfg.dataset.root)
    assert root.name == "shapes_hard" and (root / "manifest.json").is_file()
    rec, _, _ = parse_voc_xml(root / "Annotations/000000.xml", HARD_CLASSES)
    assert len(rec.labels) >= 2 and (rec.width, rec.height) == (64, 64)
    assert result.iterations == 2 * 48 // 8 and len(result.ap) == 15
    assert (Path(cfg.paths.checkpoints) / "step1" / "best.pth").is_file()
    assert np.isfinite(result.final_loss) and result.final_loss > 0
