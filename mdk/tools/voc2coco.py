"""A VOC-layout dataset -> COCO instances JSON + image folders (what ``dataset=coco`` reads).

    python -m mdk.tools.voc2coco <voc_root> <out_root> [--splits train val] [--classes a,b] [--copy]

Writes ``<out_root>/annotations/instances_<split>.json`` and ``<out_root>/<split>/`` (symlinks to
the VOC images, or copies with ``--copy``). The records are mdk's own reading of the VOC folder
(:mod:`mdk.data.coco_export`), so ``dataset=coco dataset.root=<out_root>`` trains on the same data.
"""
from __future__ import annotations

import argparse
import logging
from typing import Sequence

from mdk.data.coco_export import export_voc_to_coco
from mdk.errors import DataError


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mdk.tools.voc2coco", description=__doc__.split("\n")[0])
    ap.add_argument("voc_root", help="VOC year folder (JPEGImages/, Annotations/, ImageSets/Main/)")
    ap.add_argument("out_root", help="folder to write the COCO layout into")
    ap.add_argument("--splits", nargs="+", default=["train", "val"],
                    help="ImageSets/Main/<split>.txt names to export (default: train val)")
    ap.add_argument("--classes", default=None,
                    help="comma-separated class names, the categories' order (default: the "
                    "names the annotations use, sorted)")
    ap.add_argument("--copy", action="store_true", help="copy the images instead of symlinking")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    classes = [c.strip() for c in args.classes.split(",") if c.strip()] if args.classes else None
    try:
        written = export_voc_to_coco(args.voc_root, args.out_root, args.splits, classes, args.copy)
    except DataError as exc:
        print(f"error: {exc}")
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
