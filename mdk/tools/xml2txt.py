"""VOC annotations -> one meta txt per split (the seed MDK's ``tools/xml_2_txt.py`` step).

    python -m mdk.tools.xml2txt --root R --split train --classes a,b,c --out meta/train.txt

The format and the staleness rule live with the data layer (:mod:`mdk.data.index`); the loader
builds the file itself on first use, so this tool is for inspecting or pre-building it.
"""
from __future__ import annotations

import argparse
import logging
from typing import Sequence

from mdk.data.index import build_meta, ensure_meta
from mdk.data.voc import VOCReader
from mdk.errors import DataError


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mdk.tools.xml2txt", description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True, help="VOC year folder (JPEGImages/, Annotations/, ImageSets/Main/)")
    ap.add_argument("--split", default="train", help="ImageSets/Main/<split>.txt (default: train)")
    ap.add_argument("--classes", required=True, help="comma-separated class names, in label order")
    ap.add_argument("--out", required=True, help="meta txt file to write")
    ap.add_argument("--force", action="store_true", help="rebuild even if the file is up to date")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    classes = [c.strip() for c in args.classes.split(",") if c.strip()]
    try:
        reader = VOCReader(args.root, classes)
        reader.check([args.split])
        out = (build_meta if args.force else ensure_meta)(reader, args.split, args.out)
    except DataError as exc:
        print(f"error: {exc}")
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
