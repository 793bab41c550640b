"""A new dataset format is one YAML + one reader class, with no change to mdk: a CSV format read
by ``extra_dataset.CSVReader`` (a module outside mdk) and a ``dataset/csvshapes.yaml`` in a config
folder of the test's own, added with ``hydra.searchpath``, train a tiny stage (debug=tiny_model) through run.py."""
from __future__ import annotations

import json
import subprocess
import sys

import torch

from conftest import REPO, run_cmd_env
from extra_dataset import write_csv_dataset
from mdk.data.shapes import SHAPE_CLASSES, ensure_shapes_dataset
from mdk.data.voc import VOCReader

CLASSES = list(SHAPE_CLASSES)
YAML = """# A dataset format mdk does not know: this file and its reader class are all it takes.
name: csvshapes
root: {root}
class_names: [{classes}]
num_classes: 5
train_split: train
val_split: val
reader:
  _target_: extra_dataset.CSVReader
  table: "{{split}}.csv"
num_workers: 0
"""


def test_a_format_outside_mdk_trains_through_the_cli(tmp_path):
    shapes = ensure_shapes_dataset(tmp_path / "shapes", num_train=48, num_val=16, image_size=64,
                                   seed=0)
    voc = VOCReader(shapes, CLASSES)
    # Another selection and order than the VOC split lists: every third train image, last first.
    train = voc.records("train").records[::3][::-1]
    val = voc.records("val").records[1::2]
    data = tmp_path / "csv"
    want = {"train": write_csv_dataset(train, shapes, data, "train", CLASSES),
            "val": write_csv_dataset(val, shapes, data, "val", CLASSES)}
    assert (len(want["train"]), len(want["val"])) == (16, 8)
    extra = tmp_path / "extra"
    (extra / "dataset").mkdir(parents=True)
    (extra / "dataset" / "csvshapes.yaml").write_text(YAML.format(root=data,
                                                                  classes=",".join(CLASSES)))
    run, ck, cache = tmp_path / "run", tmp_path / "ck", tmp_path / "cache"
    argv = [sys.executable, str(REPO / "run.py"), "debug=tiny_model", "dataset=csvshapes",
            f"hydra.searchpath=[file://{extra}]", f"paths.data={cache}",
            f"paths.checkpoints={ck}", f"hydra.run.dir={run}"]
    env = dict(run_cmd_env(), OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}:{REPO / 'tests'}")
    p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    objects = {"train": sum(len(r.labels) for r in train), "val": sum(len(r.labels) for r in val)}
    for split, images in want.items():
        assert f"{data} split '{split}': {len(images)} images, {objects[split]} objects" in p.stdout
        # the records the run read (its index cache) and checked: exactly the CSV's, in its order
        meta, = (cache / "meta").glob(f"csvshapes-*/{split}.txt")
        assert [line.split()[0] for line in meta.read_text().splitlines()[1:]] == images
        assert json.loads(meta.read_text().splitlines()[0][len("# mdk-meta "):])["reader"] == \
            "extra_dataset.CSVReader"
        checked = json.loads(meta.with_name(f"{split}.images.json").read_text())["files"]
        assert sorted(checked) == sorted(images)
    last = torch.load(ck / "step1" / "last.pth", weights_only=False)
    assert last["trainer"]["iter"] == 2 * 16 // 8         # 2 epochs of the 16 CSV images, batch 8
    assert last["metric"]["images"] == 8        # evaluated on the 8 CSV val images
