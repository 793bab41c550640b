"""The dataset index (mdk.data.index), a cache of any reader's records, and its xml2txt CLI:
meta file content, staleness rules."""
import errno
import os
import shutil

import numpy as np
import pytest

from mdk import atomic_file
from mdk.data.index import (build_meta, cached_records, content_key, ensure_meta, is_stale,
                            read_header, read_meta)
from mdk.data.records import SplitRecords, make_record
from mdk.data.shapes import SHAPE_CLASSES, ensure_shapes_dataset
from mdk.data.voc import VOCReader, parse_voc_xml, read_split
from mdk.errors import DataError
from mdk.tools.xml2txt import main

CLASSES = list(SHAPE_CLASSES)


@pytest.fixture()
def root(tmp_path):
    return ensure_shapes_dataset(tmp_path / "shapes", num_train=5, num_val=2, image_size=64, seed=1)


def voc(root, classes=CLASSES):
    return VOCReader(root, classes)


def test_meta_matches_annotations(root, tmp_path):
    out = build_meta(voc(root), "train", tmp_path / "meta" / "train.txt")
    lines = out.read_text().splitlines()
    assert lines[0].startswith("# mdk-meta ") and len(lines) == 1 + 5
    header, entries = read_meta(out)
    assert header["classes"] == CLASSES and header["split"] == "train"
    assert (header["clipped"], header["zero_area"]) == (0, 0)
    for image_id, line, e in zip(read_split(root, "train"), lines[1:], entries):
        rec, _, _ = parse_voc_xml(root / "Annotations" / f"{image_id}.xml", CLASSES)
        fields = line.split()
        assert fields[:3] == [f"JPEGImages/{image_id}.jpg", "64", "64"]
        assert len(fields) == 3 + 6 * len(rec.labels)
        np.testing.assert_array_equal(e.boxes, rec.boxes)
        np.testing.assert_array_equal(e.labels, rec.labels)
        assert not e.difficult.any()


def test_counts_clipped_and_zero_area(root, tmp_path, caplog):
    xml = root / "Annotations" / "000000.xml"
    text = xml.read_text()
    first = text.index("<xmin>")
    text = text[:first] + "<xmin>-7</xmin>" + text[text.index("</xmin>", first) + 7:]
    xml.write_text(text.replace("</annotation>", "<object><name>star</name><bndbox><xmin>5</xmin>"
                                "<ymin>5</ymin><xmax>5</xmax><ymax>9</ymax></bndbox></object></annotation>"))
    out = build_meta(voc(root), "train", tmp_path / "m.txt")
    assert (read_header(out)["clipped"], read_header(out)["zero_area"]) == (1, 1)
    assert "1 boxes clipped" in caplog.text and "1 zero-area boxes kept for evaluation only" \
        in caplog.text


def test_staleness(root, tmp_path):
    out = tmp_path / "meta" / "train.txt"
    assert is_stale(voc(root), "train", out)                       # missing
    ensure_meta(voc(root), "train", out)
    assert not is_stale(voc(root), "train", out)
    assert is_stale(voc(root, CLASSES[::-1]), "train", out)                 # class order matters
    assert is_stale(voc(root), "val", out)                         # other split
    xml = root / "Annotations" / "000002.xml"
    xml.write_text(xml.read_text())                    # rewritten as it was: new time, same bytes
    assert not is_stale(voc(root), "train", out)
    split = root / "ImageSets/Main/train.txt"
    split.write_text("000000\n000001\n")                               # split edited
    _, entries = read_meta(ensure_meta(voc(root), "train", out))
    assert [e.image for e in entries] == ["JPEGImages/000000.jpg", "JPEGImages/000001.jpg"]
    out.write_text("JPEGImages/000000.jpg 64 64\n")                    # seed-style, no header
    assert is_stale(voc(root), "train", out)
    with pytest.raises(DataError, match="not an mdk meta file"):
        read_meta(out)


def _edit_keeping_the_time(path, old, new):
    """Change ``path``'s bytes and put its old modification time back (a restore, ``cp -p``)."""
    st = path.stat()
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_an_edit_with_an_old_time_stamp_is_seen(root, tmp_path):
    """The cache is keyed by the sources' bytes, not their times: an annotation edited and a split
    list restored from a backup, both older than the cache, rebuild it."""
    out = tmp_path / "meta" / "train.txt"
    xml = root / "Annotations" / "000002.xml"
    first_xmin = xml.read_text().split("<xmin>")[1].split("<")[0]
    _, before = read_meta(ensure_meta(voc(root), "train", out))
    os.utime(out, (4e9, 4e9))  # the cache far newer than any source
    _edit_keeping_the_time(xml, f"<xmin>{first_xmin}<", f"<xmin>{int(first_xmin) + 1}<")
    assert is_stale(voc(root), "train", out)
    _, after = read_meta(ensure_meta(voc(root), "train", out))
    assert after[2].boxes[0, 0] == before[2].boxes[0, 0] + 1           # the edit is served
    assert not is_stale(voc(root), "train", out)

    split = root / "ImageSets/Main/train.txt"
    backup = tmp_path / "train.txt.bak"
    shutil.copy2(split, backup)                                        # keeps the time stamp
    split.write_text("000000\n")
    assert [e.image for e in read_meta(ensure_meta(voc(root), "train", out))[1]] == \
        ["JPEGImages/000000.jpg"]
    os.utime(out, (4e9, 4e9))
    shutil.copy2(backup, split)                                        # restored, old time
    assert is_stale(voc(root), "train", out)
    assert len(read_meta(ensure_meta(voc(root), "train", out))[1]) == 5
    header = read_header(out)
    assert header["content"] == content_key(root, voc(root).sources("train"))
    assert header["content"].startswith("sha1:")


def test_an_unwritable_cache_costs_a_warning_not_the_run(root, tmp_path, caplog, monkeypatch):
    """A full or read-only meta folder: the records are served all the same (as the cache would
    have served them: parsed from the text that was to be written) and the log says why."""
    cached = cached_records(voc(root), "train", tmp_path / "ok")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic_file, "open", full, raising=False)  # the temporary file
    got = cached_records(voc(root), "train", tmp_path / "full")
    served = [(r.image, r.boxes.tolist()) for r in got]
    assert served == [(r.image, r.boxes.tolist()) for r in cached]
    assert "could not write the dataset index" in caplog.text and "No space left" in caplog.text
    assert not (tmp_path / "full" / "train.txt").exists()


def test_missing_image_is_an_error(root, tmp_path):
    (root / "JPEGImages" / "000001.jpg").unlink()
    with pytest.raises(DataError, match="image '000001' listed in .*train.txt is missing"):
        build_meta(voc(root), "train", tmp_path / "m.txt")
    assert not (tmp_path / "m.txt").exists()


def test_cli(root, tmp_path, capsys):
    out = tmp_path / "meta" / "val.txt"
    args = ["--root", str(root), "--split", "val", "--classes", ",".join(CLASSES), "--out", str(out)]
    assert main(args) == 0
    assert len(read_meta(out)[1]) == 2
    assert main(["--root", str(tmp_path / "nope"), "--classes", "a", "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().out


class ListReader:
    """A reader of records held in memory: the cache must not care which format they came from."""

    def __init__(self, root, class_names, recs, source):
        self.root, self.class_names, self.recs, self.source = root, class_names, recs, source

    def check(self, splits):
        pass

    def count(self, split):
        return len(self.recs)

    def records(self, split):
        return SplitRecords(self.recs, clipped=1, dropped=2)

    def sources(self, split):
        return [self.source]


class OtherListReader(ListReader):
    pass


def test_the_cache_holds_any_readers_records_and_keys_on_reader_and_sources(tmp_path, caplog):
    recs = [make_record("a/x.png", 30, 20, [[1.5, 2, 10.25, 19], [0, 0, 4, 4]], [1, 0],
                        [True, False]),
            make_record("b.jpg", 8, 8, [], [], [])]
    src = tmp_path / "ann.csv"
    src.write_text("x")
    reader = ListReader(tmp_path, ["p", "q"], recs, src)
    got = cached_records(reader, "train", tmp_path / "meta")
    assert [r.image for r in got] == ["a/x.png", "b.jpg"]
    for a, b in zip(got, recs):
        assert (a.width, a.height) == (b.width, b.height)
        for field in ("boxes", "labels", "difficult"):
            assert getattr(a, field).dtype == getattr(b, field).dtype
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert got[1].boxes.shape == (0, 4)
    meta = tmp_path / "meta" / "train.txt"
    assert read_header(meta)["reader"] == "test_data_meta.ListReader"
    assert "split 'train', reading the annotations: 1 boxes clipped to the image, 2 boxes dropped " \
        "by the reader" in caplog.text
    assert not is_stale(reader, "train", meta)
    # A reader key naming another annotation file, older than the cache, still rebuilds it.
    old = tmp_path / "old.csv"
    old.write_text("y")
    os.utime(old, (1, 1))
    assert is_stale(ListReader(tmp_path, ["p", "q"], recs, old), "train", meta)
    assert is_stale(OtherListReader(tmp_path, ["p", "q"], recs, src), "train", meta)  # other format
    src.write_text("z")                                                # its source edited
    assert is_stale(reader, "train", meta)
    src.unlink()                                                       # or gone
    assert is_stale(reader, "train", meta)
