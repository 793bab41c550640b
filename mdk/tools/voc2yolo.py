"""A VOC-layout dataset -> the ultralytics/YOLO layout (what ``dataset=yolo`` reads).

    python -m mdk.tools.voc2yolo <voc_root> <out_root> [--splits train val] [--classes a,b] [--copy]

Writes ``<out_root>/data.yaml``, ``images/<key>/`` (symlinks to the VOC images, or copies with
``--copy``) and ``labels/<key>/<stem>.txt``. A split given as ``trainval:train`` is the VOC split
``trainval`` written under the yaml key ``train`` (the keys ultralytics reads: train, val, test).
The records are mdk's own reading of the VOC folder (:mod:`mdk.data.yolo_export`), so
``dataset=yolo dataset.root=<out_root>`` trains on the same boxes.
"""
from __future__ import annotations

import argparse
import logging
from typing import Sequence

from mdk.data.yolo_export import export_voc_to_yolo
from mdk.errors import DataError


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mdk.tools.voc2yolo", description=__doc__.split("\n")[0])
    ap.add_argument("voc_root", help="VOC year folder (JPEGImages/, Annotations/, ImageSets/Main/)")
    ap.add_argument("out_root", help="folder to write the YOLO layout into")
    ap.add_argument("--splits", nargs="+", default=["train", "val"],
                    help="ImageSets/Main/<split>.txt names to export, each as split or "
                    "split:key (default: train val)")
    ap.add_argument("--classes", default=None,
                    help="comma-separated class names, the label ids' order (default: the names "
                    "the annotations use, sorted)")
    ap.add_argument("--copy", action="store_true", help="copy the images instead of symlinking")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    classes = [c.strip() for c in args.classes.split(",") if c.strip()] if args.classes else None
    splits = [(s.partition(":")[0], s.partition(":")[2] or s.partition(":")[0]) for s in args.splits]
    try:
        written = export_voc_to_yolo(args.voc_root, args.out_root, splits, classes, args.copy)
    except DataError as exc:
        print(f"error: {exc}")
        return 2
    print(written)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
