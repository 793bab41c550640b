"""The dataset report (mdk.data.report, ``python -m mdk.tools.dataset_report``) on a case counted
by hand: three 64-px train images (one without objects, one difficult object), a model of 32-px
cells (a 2x2 grid at 64 px, 7x7 at 224)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from mdk.data.records import make_record
from mdk.data.report import cell_capacity, grid_loss, input_sizes, short_report, summarize
from mdk.models.heads import AnchorHead, YoloV1Head
from mdk.tools.dataset_report import main as dataset_report

# image -> [(class, [x1, y1, x2, y2], difficult)]
IMAGES = {
    "000000": [("a", [0, 0, 10, 10], 0),      # cell (0, 0), area 100
               ("b", [2, 2, 22, 22], 0),      # cell (0, 0), area 400: the one a cell keeps
               ("a", [20, 20, 25, 25], 0),    # cell (0, 0), area 25, 5 px: small
               ("b", [40, 40, 60, 60], 0)],   # cell (1, 1)
    "000001": [("c", [0, 40, 30, 64], 0),     # cell (1, 0)
               ("c", [0, 0, 4, 3], 0),        # cell (0, 0), 4x3 px: small (sizes: sqrt(30 x 24), sqrt(12))
               ("c", [30, 0, 34, 4], 1)],     # difficult: not a training target
    "000002": [],                             # no objects
}
LABEL = {"a": 0, "b": 1, "c": 2}


def records():
    return [make_record(f"{k}.jpg", 64, 64, [b for _, b, _ in objs], [LABEL[c] for c, _, _ in objs],
                        [bool(d) for _, _, d in objs]) for k, objs in IMAGES.items()]


def test_counts_by_hand():
    recs = records()
    s = summarize(recs, 3)
    assert (s.images, s.empty, s.objects.tolist()) == (3, 1, [2, 2, 3])
    g = grid_loss(recs, 3, 64, 32, capacity=1)
    assert g.grid == 2 and g.total.tolist() == [2, 2, 2]
    assert g.share.tolist() == [2, 1, 0] and g.lost.tolist() == [2, 0, 0]
    assert grid_loss(recs, 3, 64, 32, capacity=2).lost.tolist() == [1, 0, 0]   # the 5-px one
    g = grid_loss(recs, 3, 224, 32, capacity=1)     # 3.5x: every centre in a cell of its own
    assert g.grid == 7 and g.share.tolist() == g.lost.tolist() == [0, 0, 0]
    w, h, lab = input_sizes(recs, 128)              # twice the pixels; the difficult one left out
    assert lab.tolist() == [0, 1, 0, 1, 2, 2]
    assert w.tolist() == [20, 40, 10, 40, 60, 8] and h.tolist() == [20, 40, 10, 40, 48, 6]


def write_voc(root: Path) -> None:
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (root / sub).mkdir(parents=True)
    for image_id, objs in {**IMAGES, "000003": IMAGES["000000"]}.items():
        Image.new("RGB", (64, 64)).save(root / "JPEGImages" / f"{image_id}.jpg")
        xml = "".join(f"<object><name>{c}</name><difficult>{d}</difficult><bndbox><xmin>{b[0]}"
                      f"</xmin><ymin>{b[1]}</ymin><xmax>{b[2]}</xmax><ymax>{b[3]}</ymax></bndbox>"
                      "</object>" for c, b, d in objs)
        (root / "Annotations" / f"{image_id}.xml").write_text(
            f"<annotation><size><width>64</width><height>64</height></size>{xml}</annotation>")
    (root / "ImageSets/Main/train.txt").write_text("000000\n000001\n000002\n")
    (root / "ImageSets/Main/val.txt").write_text("000003\n")


def test_the_command_prints_the_counts_and_writes_the_histogram(tmp_path, capsys):
    write_voc(tmp_path / "voc")
    status = dataset_report(["debug=tiny_model", "dataset=voc", f"dataset.root={tmp_path / 'voc'}",
                             "dataset.train_split=train", "dataset.val_split=val",
                             f"paths.data={tmp_path / 'data'}", "--out", str(tmp_path / "rep")])
    out = capsys.readouterr().out
    assert status == 0, out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert ("dataset voc (" + str(tmp_path / "voc") + "): 3 classes; model gnetdet_small at 64 px "
            "(a 2x2 grid of 32-px cells), one object per cell (the larger box is kept)") in lines
    assert "train 3 1 2 2 3 7" in lines and "val 1 0 2 2 0 4" in lines
    assert "a 2 7.5 5.0 1 (50.0 %)" in lines and "c 2 15.1 3.5 1 (50.0 %)" in lines
    assert "64* 2x2 a 2 2 (100.0 %) 2 (100.0 %)" in lines
    assert "b 2 1 (50.0 %) 0 (0.0 %)" in lines
    assert "224 7x7 a 2 0 (0.0 %) 0 (0.0 %)" in lines
    png = tmp_path / "rep" / "dataset_report_voc_64.png"
    assert f"wrote {png}" in lines and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_bad_dataset_is_one_error_line(tmp_path, capsys):
    status = dataset_report(["dataset=voc", f"dataset.root={tmp_path / 'nope'}"])
    err = capsys.readouterr().err
    assert status == 1 and err.startswith(f"error: dataset.root='{tmp_path / 'nope'}' does not "
                                          "exist") and len(err.strip().splitlines()) == 1


def test_the_short_form_for_the_log():
    assert short_report(records(), ["a", "b", "c"], 64, 32, 1) == (
        "train split at 64 px (2x2 grid): 2 of 6 objects (33.3 %) share a cell beyond its 1 and "
        "are lost from the targets (a 2); 2 boxes under 8 px at the input (python -m "
        "mdk.tools.dataset_report with this run's overrides says more)")
    assert cell_capacity(YoloV1Head(3, 2)) == 1 and cell_capacity(AnchorHead(3, [[.2, .2]] * 2)) == 2
