"""Point a GTI SDK hand-off at the machine that runs GTI's tools: set its model JSON's ``data file``
to where ``chip.dat`` will be there, and print the CAP value (docs/pipeline.md, "Where
``chip.dat`` will be").

    python -m mdk.tools.gti_handoff outputs/checkpoints/gnetdet_small_shapes/step4 \\
        --dat-path /home/me/gti/chip.dat
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path, PurePosixPath
from typing import Optional, Sequence

from mdk.engine.export_stage import CHIP_MODEL_DIR
from mdk.quant.export import GTI_DIR
from mdk.quant.gti_sdk import CAP_FILE, set_dat_path


def gti_folder(path: Path) -> Path:
    """The hand-off folder at ``path``: the stage folder, its chip model folder, or itself."""
    for d in (path / CHIP_MODEL_DIR / GTI_DIR, path / GTI_DIR, path):
        if d.is_dir() and (d / CAP_FILE).is_file():
            return d
    raise FileNotFoundError(f"{path} holds no GTI SDK hand-off (no {GTI_DIR}/{CAP_FILE} under it or "
                            f"its {CHIP_MODEL_DIR}/): pass the folder of a stage that exported for "
                            "chip 5801, its chip_model/ or its gti/ folder")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mdk.tools.gti_handoff", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", type=Path, help="the exporting stage's folder, its chip_model/ or gti/")
    ap.add_argument("--dat-path", required=True,
                    help="absolute path chip.dat will have on the machine that runs GTI's tools")
    args = ap.parse_args(argv)
    if not PurePosixPath(args.dat_path).is_absolute():
        print(f"error: --dat-path {args.dat_path!r} must be an absolute path (GTI's tools read it "
              "from any working folder)", file=sys.stderr)
        return 1
    try:
        folder = gti_folder(args.path)
        model_json = set_dat_path(folder, args.dat_path)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{model_json}: data file = {args.dat_path}")
    print(f"CAP (the last layer's cap, {folder / CAP_FILE}): {(folder / CAP_FILE).read_text().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
